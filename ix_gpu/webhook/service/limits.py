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
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger("ix_gpu.webhook")

T = TypeVar("T")


@dataclass(frozen=True)
class Limits:
    max_connections: int = 1000
    header_timeout: float = 10.0
    max_header_bytes: int = 64 << 10
    max_inflight_body_bytes: int = 24 << 20
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
    """Runs large reviews' CPU work in a worker thread, one at a time, each within a deadline.

    One at a time because the GIL gives threads no parallel speed-up, and each large review holds
    its parsed object in memory (about ten times its JSON). A thread past its deadline cannot be
    stopped; it finishes its bounded work while later large reviews wait and, past their own
    budget, are refused. Small reviews never enter this lane.
    """

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self._slot = asyncio.Semaphore(1)

    async def run(self, deadline: float, work: Callable[[], T]) -> T:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise OverBudget()
        try:
            async with asyncio.timeout(remaining):
                await self._slot.acquire()
        except TimeoutError:
            raise OverBudget() from None
        task = asyncio.ensure_future(asyncio.to_thread(work))
        task.add_done_callback(lambda _: self._slot.release())  # released when the thread ends
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
                return await asyncio.shield(task)
        except TimeoutError:
            raise OverBudget() from None


def guarded_protocol(limits: Limits, on_refused: Callable[[str], None]) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with a connection cap and header size and time limits.

    (uvicorn is imported here, not at the top: the CLI reads :class:`Limits` for ``--help``.)
    """
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _header_bytes = 0
        _in_headers = True

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
            counting = self._in_headers
            if counting:
                self._header_bytes += len(data)
            super().data_received(data)
            # Checked after parsing: one read can hold the headers' end and the body's start, and
            # only a request whose headers are still incomplete is over the limit. (A read adds at
            # most asyncio's read size, 256 KiB, before the check.)
            over = counting and self._in_headers and self._header_bytes > limits.max_header_bytes
            if over and not self.transport.is_closing():
                on_refused("header_size")
                self._refuse(b"431 Request Header Fields Too Large")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_headers = True
            self._header_bytes = 0
            if self._header_timer is None:
                self._arm_header_timer()

        def on_headers_complete(self) -> None:
            self._in_headers = False
            self._disarm_header_timer()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # The next request's headers count from their first byte; until then uvicorn's
            # keep-alive timeout governs the idle connection.
            self._in_headers = True
            self._header_bytes = 0

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
