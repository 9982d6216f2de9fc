"""Bounds on what clients can make the webhook hold: connections, header bytes and time, body bytes
in flight, and CPU time on the event loop.

The webhook serves every Pod create of the cluster with ``failurePolicy: Fail`` and one event loop,
so one careless or hostile client must not be able to stall or bloat it:

- **Connections** past ``max_connections`` are closed as soon as they are made (after the TLS
  handshake, which asyncio bounds at 60 s). Idle keep-alive connections are closed by uvicorn after
  its keep-alive timeout.
- **Headers** must be complete within ``header_timeout`` seconds of the connection (or of the
  request's first byte) and within ``max_header_bytes``: uvicorn bounds neither, so a client
  sending one header byte a second, or 128 MiB of headers, held a connection and its memory.
- **Body bytes in flight** across all connections are capped by :class:`ByteBudget`; a request
  that would go past it is answered 503 with ``Retry-After`` before its body is read.
- **CPU on the loop**: a review larger than ``offload_bytes`` is parsed and mutated in a worker
  thread, one at a time, within ``request_budget`` seconds (:class:`HeavyLane`), so the loop keeps
  answering ``/healthz`` and small reviews meanwhile. The work per byte is bounded by the core's
  caps; the budget bounds the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger("ix_gpu.webhook")

T = TypeVar("T")


@dataclass(frozen=True)
class Limits:
    max_connections: int = 256
    header_timeout: float = 10.0
    max_header_bytes: int = 64 << 10
    max_inflight_body_bytes: int = 16 << 20
    offload_bytes: int = 64 << 10
    request_budget: float = 0.75


class ByteBudget:
    """Bytes of request bodies held at once, across connections; reservations never block."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0

    def try_reserve(self, size: int) -> bool:
        if self.used + size > self.capacity:
            return False
        self.used += size
        return True

    def release(self, size: int) -> None:
        self.used -= size


class OverBudget(Exception):
    """The request could not be served within its budget (queue wait plus work)."""


class HeavyLane:
    """Runs large reviews' CPU work in a worker thread, one review at a time, within a deadline.

    One review at a time (its parse, decisions and answer, not just one step) because the GIL gives
    threads no parallel speed-up and a parsed review holds five to ten times its JSON in memory. A
    thread past its deadline cannot be stopped; it finishes its bounded work while the slot stays
    taken, and later large reviews wait and, past their own budget, are refused. Small reviews
    never enter this lane.
    """

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self._slot = asyncio.Semaphore(1)
        self._running: asyncio.Future[Any] | None = None

    @contextlib.asynccontextmanager
    async def hold(self, deadline: float) -> AsyncIterator[HeavyLane]:
        """The lane, for one review; raises :class:`OverBudget` when it is not free in time."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise OverBudget()
        try:
            async with asyncio.timeout(remaining):
                await self._slot.acquire()
        except TimeoutError:
            raise OverBudget() from None
        self._running = None
        try:
            yield self
        finally:
            running, self._running = self._running, None
            if running is not None and not running.done():
                running.add_done_callback(lambda _: self._release())  # when the thread ends
            else:
                self._release()

    def _release(self) -> None:
        self._slot.release()
        if not self._slot.locked():
            _return_freed_memory()

    async def run(self, deadline: float, work: Callable[[], T]) -> T:
        """``work`` in the worker thread; call inside :meth:`hold`."""
        task = asyncio.ensure_future(asyncio.to_thread(_without_gc, work))
        self._running = task
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
                return await asyncio.shield(task)
        except TimeoutError:
            raise OverBudget() from None


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL("libc.so.6").malloc_trim
        return trim
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _load_malloc_trim()


def _return_freed_memory() -> None:
    """Give the heap a large review freed back to the OS. A parsed 3 MiB review is ~30 MB of small
    objects; after it is freed, glibc keeps the pages, so RSS stays at the high-water mark of the
    largest burst (measured: 183 MiB after a burst, against 66 MiB before). Trimming costs about
    a millisecond and runs only when the heavy lane goes idle."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _without_gc(work: Callable[[], T]) -> T:
    """Parsing a megabyte review allocates a hundred thousand containers; with the cyclic
    collector on, collections triggered mid-parse walk them again and again (measured: 50 ms of
    orjson.loads became 110-160 ms), all while holding the GIL the event loop needs. Nothing these
    steps allocate forms cycles, so the collector waits until they are done."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return work()
    finally:
        if enabled:
            gc.enable()


def guarded_protocol(limits: Limits, on_refused: Callable[[str], None]) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with a connection cap and header size and time limits.

    (uvicorn is imported here, not at the top: the CLI reads :class:`Limits` for ``--help``.)
    """
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _header_bytes = 0
        _in_headers = True
        _over = False
        """This request's headers went past the limit: stop keeping them, answer 431."""

        def connection_made(self, transport: Any) -> None:
            if len(self.connections) >= limits.max_connections:
                on_refused("connections")
                transport.abort()
                return
            super().connection_made(transport)
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            if self.transport is None:  # refused in connection_made: nothing of uvicorn's to undo
                return
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            # Headers still incomplete after this read but already over the limit: no need to wait
            # for the rest (the parser callbacks below stopped keeping them).
            if self._over and self._in_headers and not self.transport.is_closing():
                self._refuse_headers()

        # Header bytes are counted in the parser's callbacks, whatever the reads look like: one
        # read may hold a whole request (or several), and a request may start mid-read.
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_headers, self._header_bytes, self._over = True, 0, False
            if self._header_timer is None:
                self._arm_header_timer()

        def on_url(self, url: bytes) -> None:
            if not self._count(len(url)):
                super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            if not self._count(len(name) + len(value) + 4):
                super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_headers = False
            self._disarm_header_timer()
            if self._over:
                self._refuse_headers()
                return
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._over:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if not self._over:
                super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # The next request's headers count from their first byte; until then uvicorn's
            # keep-alive timeout governs the idle connection.
            self._in_headers = True
            self._header_bytes = 0

        def _count(self, size: int) -> bool:
            """Add header bytes; True when over the limit (the bytes are then not kept)."""
            self._header_bytes += size
            if self._header_bytes > limits.max_header_bytes:
                self._over = True
            return self._over

        def _refuse_headers(self) -> None:
            if not self.transport.is_closing():
                on_refused("header_size")
                self._refuse(b"431 Request Header Fields Too Large")

        def _arm_header_timer(self) -> None:
            self._header_timer = self.loop.call_later(limits.header_timeout, self._header_too_slow)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_too_slow(self) -> None:
            self._header_timer = None
            if self._in_headers and not self.transport.is_closing():
                on_refused("header_timeout")
                self._refuse(b"408 Request Timeout")

        def _refuse(self, status: bytes) -> None:
            self._disarm_header_timer()
            body = b'{"error":"' + status.split(b" ", 1)[1] + b'"}'
            self.transport.write(
                b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            self.transport.close()

    return GuardedHttpToolsProtocol
