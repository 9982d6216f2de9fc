"""A fake kubelet speaking the real protocol over real unix sockets.

It does what the kubelet's device manager does at the protocol level: serves Registration on
``kubelet.sock``; on Register it dials the plugin's endpoint *during the call* and reads its options
(so a plugin that registers before serving fails here as it would in a cluster), then opens
ListAndWatch and records every message.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2 as pb
from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from tests.support.waiting import wait_until_async


@dataclass
class Update:
    at: float
    devices: list[tuple[str, str, int | None]]
    generation: int

    @property
    def health(self) -> dict[str, str]:
        return {d[0]: d[1] for d in self.devices}


@dataclass
class Registration:
    request: pb.RegisterRequest
    options: pb.DevicePluginOptions
    at: float


@dataclass
class FakeKubelet:
    directory: Path
    registrations: list[Registration] = field(default_factory=list)
    updates: list[Update] = field(default_factory=list)
    stream_ends: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    generation: int = 0
    _server: Any = None
    _channel: Any = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def socket(self) -> Path:
        return self.directory / "kubelet.sock"

    async def start(self) -> None:
        self.generation += 1
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        if self._server is not None:
            await self._server.stop(0)
            self._server = None

    async def restart(self, pause: float = 0.05) -> None:
        """Like a kubelet restart: stop, delete every socket in the directory, serve again."""
        await self.stop()
        for path in self.directory.iterdir():
            if path.is_socket():
                path.unlink()
        await asyncio.sleep(pause)
        await self.start()

    async def disconnect(self) -> None:
        """Close the connection to the registered plugin and its ListAndWatch, and stay up: what a
        kubelet before 1.37 does to the newest plugin of a resource when an older one's stream ends."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def on_register(self, request: pb.RegisterRequest) -> None:
        endpoint = self.directory / request.endpoint
        if self._channel is not None:
            await self._channel.close()
        self._channel = grpc.aio.insecure_channel(f"unix://{endpoint}")
        stub = pb_grpc.DevicePluginStub(self._channel)
        options = await stub.GetDevicePluginOptions(pb.Empty(), timeout=2)
        self.registrations.append(Registration(request, options, time.monotonic()))
        self._tasks.append(asyncio.create_task(self._list_and_watch(stub, self.generation)))
        self._changed.set()

    async def _list_and_watch(self, stub: Any, generation: int) -> None:
        try:
            async for response in stub.ListAndWatch(pb.Empty()):
                devices = [
                    (d.ID, d.health, d.topology.nodes[0].ID if d.topology.nodes else None)
                    for d in response.devices
                ]
                self.updates.append(Update(time.monotonic(), devices, generation))
                self._changed.set()
        except grpc.aio.AioRpcError as exc:
            self.errors.append(f"{exc.code().name}: {exc.details()}")
        self.stream_ends.append(time.monotonic())
        self._changed.set()

    @property
    def plugin(self) -> Any:
        """A DevicePlugin stub on the channel the kubelet opened for the last registration."""
        assert self._channel is not None, "no plugin registered yet"
        return pb_grpc.DevicePluginStub(self._channel)

    async def wait_for(self, predicate: Any, timeout: float = 5.0, what: str = "condition") -> None:
        """Until ``predicate()`` holds; re-checked whenever the kubelet sees a change (else every 0.1 s)."""
        await wait_until_async(
            predicate,
            what,
            timeout,
            wake=self._changed,
            details=lambda: (
                f"registrations={len(self.registrations)} "
                f"updates={[u.health for u in self.updates[-2:]]} errors={self.errors}"
            ),
        )

    def last_update(self) -> Update:
        assert self.updates, "no ListAndWatch update yet"
        return self.updates[-1]


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}")
        try:
            await self.kubelet.on_register(request)
        except grpc.aio.AioRpcError as exc:
            self.kubelet.errors.append(f"dial-back failed: {exc.code().name}")
            await context.abort(grpc.StatusCode.UNKNOWN, "cannot dial the plugin endpoint")
        return pb.Empty()
