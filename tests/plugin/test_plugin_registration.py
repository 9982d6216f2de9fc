"""One Register call from the plugin's grpclib client, and how each way it fails is named.

The registrar logs these lines and retries; the status name leads, as gRPC tools print it. The
kubelets here are deliberately broken: a stale socket file nobody listens on, a listener that never
answers, and a grpcio Registration server that refuses (a second gRPC implementation)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import grpc
import pytest

from ix_gpu.config.plugin_config import PluginConfig
from ix_gpu.devicemodel.vendors import ILUVATAR
from ix_gpu.node.devices.device_list import build_device_list
from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2 as pb
from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from ix_gpu.plugin.offer.device_state import DeviceState, Snapshot
from ix_gpu.plugin.server.metrics import PluginMetrics
from ix_gpu.plugin.server.registration import KUBELET_SOCKET, RegisterFailed, Registrar
from ix_gpu.plugin.server.servicer import DevicePluginServicer

pytestmark = pytest.mark.timeout(30)


def registrar(directory: Path) -> Registrar:
    devices = build_device_list([], splitboard=False, replicas=1)
    snapshot = Snapshot(devices, {}, PluginConfig().runtime(), ILUVATAR)
    servicer = DevicePluginServicer(DeviceState(snapshot), PluginMetrics())
    return Registrar(directory, servicer, PluginMetrics(), lambda: "iluvatar.com/gpu", register_timeout=0.3)


async def register_failure(directory: Path) -> str:
    reg = registrar(directory)
    await reg._serve("iluvatar.com/gpu")
    try:
        with pytest.raises(RegisterFailed) as info:
            await reg._register("iluvatar.com/gpu")
    finally:
        await reg.shutdown(grace=0.1)
    return str(info.value)


def test_stale_kubelet_socket_is_unavailable(short_tmp: Path) -> None:
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(short_tmp / KUBELET_SOCKET))
    stale.close()  # the file stays, nobody listens: what a dead kubelet leaves behind
    message = asyncio.run(register_failure(short_tmp))
    assert message.startswith("UNAVAILABLE: "), message
    assert "refused" in message.lower(), message


def test_kubelet_that_never_answers_is_a_deadline(short_tmp: Path) -> None:
    async def scenario() -> str:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()  # accepts, reads, never speaks HTTP/2 back

        server = await asyncio.start_unix_server(silent, path=str(short_tmp / KUBELET_SOCKET))
        try:
            return await asyncio.wait_for(register_failure(short_tmp), 10)
        finally:
            server.close()

    assert asyncio.run(scenario()) == "DEADLINE_EXCEEDED: no answer in 0.3s"


class Refusing(pb_grpc.RegistrationServicer):
    async def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"no thanks, {request.resource_name}")
        raise AssertionError("abort raises")


def test_kubelet_refusal_keeps_its_status_and_message(short_tmp: Path) -> None:
    async def scenario() -> str:
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(Refusing(), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{short_tmp / KUBELET_SOCKET}")
        await server.start()
        try:
            return await register_failure(short_tmp)
        finally:
            await server.stop(0)

    assert asyncio.run(scenario()) == "INVALID_ARGUMENT: no thanks, iluvatar.com/gpu"
