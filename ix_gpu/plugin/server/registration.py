"""Serve the DevicePlugin service on our socket, then Register with the kubelet — and again
whenever the kubelet restarts.

Order matters: during ``Register`` the kubelet dials our socket and calls GetDevicePluginOptions,
so the server must be serving before the call (registering first is a classic race that works on a
fast laptop and fails on a loaded node).

One loop owns the whole cycle (serve → wait for kubelet.sock → register → watch), so restart
handling lives in one place and can be reasoned about; it re-checks the real state on every wake-up
rather than trusting individual events.

Both ends speak grpclib (pure asyncio over h2): the server on our socket and the one-shot client
that calls Register. On the other end is the kubelet's grpc-go; ``tests/k8s`` runs the kubelet's own
device manager and a real kubelet against this pairing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import h2.connection
from grpclib.client import Channel
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from grpclib.server import Server

from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2 as pb
from ix_gpu.plugin.api.deviceplugin_v1beta1_grpc import RegistrationStub
from ix_gpu.plugin.server.metrics import PluginMetrics
from ix_gpu.plugin.server.plugin_sockets import remove_stale, sibling_serving, socket_name_for
from ix_gpu.plugin.server.servicer import OPTIONS, DevicePluginServicer
from ix_gpu.plugin.server.socket_watch import SocketWatch
from ix_gpu.process.outcomes import ERROR, SUCCESS

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the terminating NUL

ORPHAN_GRACE_S = 1.0
"""How long registered without a ListAndWatch stream before registering again (the kubelet opens
one at once after a registration, and a stream it ends may be the old instance's going)."""
CLOSED_STREAMS_KEPT = 1024
"""How many finished streams each HTTP/2 connection remembers (h2's ``MAX_CLOSED_STREAMS``).

h2 keeps, per connection, how each closed stream ended, so that a frame still in flight for it
(a late WINDOW_UPDATE or RST_STREAM) is handled as the spec says. Its default is 65,536 entries,
about 150 bytes each: the kubelet makes every Allocate on one long-lived connection, so the plugin
grew by 10 MiB over its first 65,536 Allocates (measured by bench/plugin_bench.py). Late frames
only ever concern the last few streams; a forgotten one is still treated as closed, which at worst
answers a stray frame with RST_STREAM instead of ignoring it."""


class RegisterFailed(Exception):
    """One Register attempt failed; the message is a gRPC status name and the reason."""


@dataclass(eq=False)
class Registrar:
    """Serves the plugin's socket and registers it with the kubelet, again whenever the kubelet's
    socket comes back (a kubelet restart) or the resource name changes."""

    directory: Path
    servicer: DevicePluginServicer
    metrics: PluginMetrics
    resource_name: Callable[[], str]
    reconcile_interval: float = field(default=0.5, kw_only=True)
    register_timeout: float = field(default=5.0, kw_only=True)
    socket_id: str | None = field(default=None, kw_only=True)
    """Makes the socket this instance's own (:mod:`.plugin_sockets`); None: the vendor's name."""
    registered: bool = field(default=False, init=False)
    registered_resource: str | None = field(default=None, init=False)
    not_registered_since: float = field(default_factory=time.monotonic, init=False)
    _server: Server | None = field(default=None, init=False)
    _socket: Path | None = field(default=None, init=False)
    _registered_generation: int = field(default=-1, init=False)
    _force: bool = field(default=False, init=False)
    _orphaned_since: float | None = field(default=None, init=False)
    on_registered: Callable[[], None] | None = field(default=None, init=False)
    """Called after each successful registration: a kubelet that restarted may have registered
    its Node anew (deleted meanwhile), without what the plugin had written on the old one."""

    def __post_init__(self) -> None:
        self.watch = SocketWatch(self.directory, KUBELET_SOCKET)

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
            or self._orphaned()
            or self._server is None
            or self._socket is None
            or not self._socket.exists()
            or self._registered_generation != self.watch.kubelet_generation
            or self.registered_resource != self.resource_name()
        )

    def _mark_unregistered(self) -> None:
        if self.registered:
            self.registered = False
            self.metrics.registered.set(0)
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
            except RegisterFailed as exc:
                self.metrics.registrations.labels(result=ERROR).inc()
                message = str(exc)
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
            self._orphaned_since = None
            self.metrics.registered.set(1)
            if self.on_registered is not None:
                self.on_registered()
            log.info(
                "registered %s with the kubelet at %s (endpoint %s)",
                resource,
                self.kubelet_socket,
                self._socket,
            )
            return

    def socket_path(self, resource: str) -> Path:
        return self.directory / socket_name_for(resource, self.socket_id)

    def sibling_serving(self) -> Path | None:
        """Another instance of this plugin serving in the directory now (blocking, briefly)."""
        return sibling_serving(self.directory, self.resource_name(), self._socket)

    def kubelet_left(self) -> None:
        """The kubelet ended a ListAndWatch stream while we serve. A kubelet before 1.37 does it to
        the newest instance when an older one of the same resource goes (it disconnects whichever
        endpoint is current), and then counts none of the resource's devices until a plugin
        registers again. So once no stream is open for :data:`ORPHAN_GRACE_S` and no other
        instance serves (the kubelet holds that one's), register again. (A restarted kubelet is
        noticed by its socket; the old instance of a rolling update sees the new one serving.)"""
        if self.registered and self._orphaned_since is None:
            self._orphaned_since = time.monotonic()
            self.watch.changed.set()

    def _orphaned(self) -> bool:
        since = self._orphaned_since
        if since is None or self.servicer.state.active_streams:
            self._orphaned_since = None
            return False
        if time.monotonic() - since < ORPHAN_GRACE_S:
            return False
        if (other := self.sibling_serving()) is not None:
            self._orphaned_since = time.monotonic()  # look again later: the other may be going
            log.debug("no ListAndWatch stream, but %s serves: not registering again", other)
            return False
        log.info("the kubelet has kept no ListAndWatch stream open to us; registering again")
        return True

    async def _serve(self, resource: str) -> None:
        await self._stop_server(grace=0)
        path = self.socket_path(resource)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a stale socket from a previous run would make bind fail
        await asyncio.to_thread(remove_stale, self.directory, resource, path)
        # h2 reads the limit when grpclib creates each connection; the plugin process serves
        # nothing else over h2, so setting it on the class is setting it for our connections.
        h2.connection.H2Connection.MAX_CLOSED_STREAMS = CLOSED_STREAMS_KEPT
        server = Server([self.servicer])
        await server.start(path=str(path))
        self._server, self._socket = server, path
        log.info("serving %s on %s", resource, path)

    async def _register(self, resource: str) -> None:
        """One Register call on a fresh connection; :class:`RegisterFailed` says why it failed."""
        assert self._socket is not None
        request = pb.RegisterRequest(
            version=API_VERSION, endpoint=self._socket.name, resource_name=resource, options=OPTIONS
        )
        channel = Channel(path=str(self.kubelet_socket))
        try:
            # The deadline also bounds connecting: a kubelet that accepts and never answers.
            await asyncio.wait_for(
                RegistrationStub(channel).Register(request, timeout=self.register_timeout),
                self.register_timeout + 1,
            )
        except GRPCError as exc:  # the kubelet answered with an error status
            raise RegisterFailed(f"{exc.status.name}: {exc.message}") from None
        except TimeoutError:
            raise RegisterFailed(f"DEADLINE_EXCEEDED: no answer in {self.register_timeout:g}s") from None
        except (OSError, StreamTerminatedError, ProtocolError) as exc:  # refused, reset, not HTTP/2
            raise RegisterFailed(f"UNAVAILABLE: {str(exc) or type(exc).__name__}") from None
        finally:
            channel.close()

    async def _stop_server(self, grace: float) -> None:
        """Stop listening, cancel running calls and remove the socket. grpclib's ``wait_closed``
        waits for the cancelled handlers (and from Python 3.12 on for client connections too, which
        the kubelet may hold open), so it is bounded: stopping must never hang."""
        server, path = self._server, self._socket
        self._server = self._socket = None
        if server is not None:
            server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), timeout=max(grace, 0.05))
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    async def shutdown(self, grace: float = 1.0) -> None:
        """Stop serving and remove our socket; bounded by ``grace`` so stop can never hang."""
        self._mark_unregistered()
        await self._stop_server(grace)
