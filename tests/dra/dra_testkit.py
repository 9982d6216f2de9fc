"""Run the DRA plugin in-process and talk to it as the kubelet does: grpcio over its unix sockets."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from ix_gpu.dra.api import dra_v1_pb2 as dra
from ix_gpu.dra.api import dra_v1_pb2_grpc as dra_grpc
from ix_gpu.dra.app import DraApp, DraSettings
from ix_gpu.dra.devices import UnhealthyMode
from ix_gpu.kube.apiserver import ApiServer
from ix_gpu.node.fake_devices_file import fake_backend
from ix_gpu.node.gpu_reset import SerializedBackend
from tests.support.waiting import wait_until_async

DRIVER = "gpu.iluvatar.com"
NODE = "node1"


def settings(
    root: Path,
    *,
    splitboard: bool = True,
    unhealthy: UnhealthyMode = "taint",
    partitionable: bool = False,
    replicas: int = 1,
    partitionable_shares: bool = False,
) -> DraSettings:
    """The plain layout unless ``partitionable`` (tests/dra/test_dra_partitionable.py has that)."""
    return DraSettings(
        driver=DRIVER,
        node=NODE,
        plugins_dir=root / "plugins",
        registry_dir=root / "registry",
        cdi_dir=root / "cdi",
        checkpoint=root / "plugins" / DRIVER / "checkpoint.json",
        splitboard=splitboard,
        unhealthy=unhealthy,
        partitionable=partitionable,
        partitionable_shares=partitionable_shares,
        replicas=replicas,
        health_interval=0.2,
        unregister_grace=0.0,  # tests/dra/test_dra_rolling.py has the stop's grace
    )


@contextlib.asynccontextmanager
async def running(config: DraSettings, devices_file: Path, api: ApiServer) -> AsyncIterator[DraApp]:
    app = DraApp(config, SerializedBackend(fake_backend(devices_file)), api)  # as start_node wraps it
    task = asyncio.create_task(app.run())
    try:
        await wait_until_async(
            lambda: config.registration_socket.exists() or task.done(), "registration socket"
        )
        if task.done():
            task.result()
        yield app
    finally:
        app.stop.set()
        await asyncio.wait_for(task, 5)


@contextlib.asynccontextmanager
async def dra_client(config: DraSettings) -> AsyncIterator[Any]:
    channel = grpc.aio.insecure_channel(f"unix://{config.dra_socket}")
    try:
        yield dra_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
    finally:
        await channel.close()


def claim(uid: str, name: str = "claim", namespace: str = "default") -> dra.Claim:
    return dra.Claim(namespace=namespace, name=name, uid=uid)


def result(device: str, request: str = "gpu", pool: str = NODE, driver: str = DRIVER) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device}
