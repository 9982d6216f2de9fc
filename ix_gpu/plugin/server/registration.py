"""Serve the DevicePlugin service on our socket, then Register with the kubelet — and again
whenever the kubelet restarts.

Order matters: during ``Register`` the kubelet dials our socket and calls GetDevicePluginOptions,
so the server must be serving before the call (registering first is a classic race that works on a
fast laptop and fails on a loaded node).

One loop owns the whole cycle (serve → wait for kubelet.sock → register → watch), so restart
handling lives in one place and can be reasoned about; it re-checks the real state on every wake-up
rather than trusting individual events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2 as pb
from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from ix_gpu.plugin.server.metrics import PluginMetrics
from ix_gpu.plugin.server.servicer import DevicePluginServicer, add_to_server
from ix_gpu.plugin.server.socket_watch import SocketWatch
from ix_gpu.runtime.outcomes import ERROR, SUCCESS

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the terminating NUL


def socket_name_for(resource_name: str) -> str:
    """``iluvatar.com/gpu`` → ``iluvatar-gpu.sock``: the name the vendor plugin's liveness probe
    looked for, so existing tooling that lists the directory keeps working."""
    domain, _, name = resource_name.partition("/")
    return f"{domain.split('.')[0]}-{name}.sock".replace("/", "-")


class Registrar:
    def __init__(
        self,
        directory: Path,
        servicer: DevicePluginServicer,
        metrics: PluginMetrics,
        resource_name: Callable[[], str],
        *,
        reconcile_interval: float = 0.5,
        register_timeout: float = 5.0,
    ) -> None:
        self.directory = directory
        self.servicer = servicer
        self.metrics = metrics
        self.resource_name = resource_name
        self.reconcile_interval = reconcile_interval
        self.register_timeout = register_timeout
        self.watch = SocketWatch(directory, KUBELET_SOCKET)
        self.registered = False
        self.registered_resource: str | None = None
        self.not_registered_since = time.monotonic()
        self._server: Any = None
        self._socket: Path | None = None
        self._registered_generation = -1
        self._force = False

    @property
    def kubelet_socket(self) -> Path:
        return self.directory / KUBELET_SOCKET

    def request_reregister(self) -> None:
        """Serve and register again (the resource name changed)."""
        self._force = True
        self.watch.changed.set()

    def _needs_cycle(self) -> bool:
        return (
            self._force
            or self._server is None
            or self._socket is None
            or not self._socket.exists()
            or self._registered_generation != self.watch.kubelet_generation
            or self.registered_resource != self.resource_name()
        )

    def _mark_unregistered(self) -> None:
        if self.registered:
            self.registered = False
            self.not_registered_since = time.monotonic()

    async def run(self, stop: asyncio.Event) -> None:
        self.watch.start()
        try:
            while not stop.is_set():
                if self._needs_cycle():
                    self._force = False
                    await self._cycle(stop)
                    continue
                await self._wait(stop, self.reconcile_interval)
        finally:
            self.watch.close()

    async def _wait(self, stop: asyncio.Event, timeout: float) -> None:
        """Sleep until a directory event, ``stop`` or ``timeout``; then refresh polled state."""
        changed = asyncio.ensure_future(self.watch.changed.wait())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({changed, stopped}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            stopped.cancel()
        self.watch.changed.clear()
        self.watch.poll()

    async def _cycle(self, stop: asyncio.Event) -> None:
        self._mark_unregistered()
        resource = self.resource_name()
        await self._serve(resource)
        delay = 0.05
        last_error = ""
        while not stop.is_set():
            if self._socket is None or not self._socket.exists():
                log.info("our socket disappeared before registration completed; serving again")
                await self._serve(resource)
            if not self.kubelet_socket.exists():
                await self._wait(stop, self.reconcile_interval)
                continue
            generation = self.watch.kubelet_generation
            try:
                await self._register(resource)
            except grpc.aio.AioRpcError as exc:
                self.metrics.registrations.labels(result=ERROR).inc()
                message = f"{exc.code().name}: {exc.details()}"
                if message != last_error:  # one line per distinct failure, not one per retry
                    log.warning("Register with the kubelet failed (will retry): %s", message)
                    last_error = message
                await self._wait(stop, delay)
                delay = min(delay * 2, 2.0)
                continue
            self.metrics.registrations.labels(result=SUCCESS).inc()
            self._registered_generation = generation
            self.registered_resource = resource
            self.registered = True
            log.info(
                "registered %s with the kubelet at %s (endpoint %s)",
                resource,
                self.kubelet_socket,
                self._socket,
            )
            return

    async def _serve(self, resource: str) -> None:
        await self._stop_server(grace=0)
        path = self.directory / socket_name_for(resource)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a stale socket from a previous run would make bind fail
        server = grpc.aio.server()
        add_to_server(self.servicer, server)
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        self._server, self._socket = server, path
        log.info("serving %s on %s", resource, path)

    async def _register(self, resource: str) -> None:
        assert self._socket is not None
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self._socket.name,
            resource_name=resource,
            options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
        )
        async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            await stub.Register(request, timeout=self.register_timeout)

    async def _stop_server(self, grace: float | None) -> None:
        server, path = self._server, self._socket
        self._server = self._socket = None
        if server is not None:
            await server.stop(grace)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    async def shutdown(self, grace: float = 1.0) -> None:
        """Stop serving and remove our socket; bounded by ``grace`` so stop can never hang."""
        self._mark_unregistered()
        await self._stop_server(grace)
