"""``/mutate`` served inside the HTTP protocol: one :class:`MutateExchange` per request, answered
in the parser's own callback when nothing has to wait.

Why not an ASGI app behind uvicorn's request cycle, which it was: a review is on the path of every
Pod create in the cluster, and uvicorn's machinery per request (a scope dict, an ``asyncio.Event``,
a task, the receive and send messages, a timeout context, the head and the body as two TLS records)
cost more CPU than parsing and mutating a 2 KB review. Here a small review whose namespace and
claims are in memory is parsed, mutated and answered in ``on_message_complete``, in one write.
What has to wait (a namespace lookup, a claim's watch event, a large review's forked child) runs
as a task, as before. The rest of the port (``/healthz``, ``/readyz``, ``/metrics``, every 404)
is still uvicorn's and FastAPI's (:mod:`.app`), and the connection's limits are the protocol's
(:mod:`.http_protocol`).

What a client gets, in this order:

- a method other than POST: ``405`` with ``Allow: POST``; a content type other than
  ``application/json``: ``415``; both keep the connection, and the body is discarded unread;
- a Content-Length that is not a number: ``400``; over ``max_body_bytes`` (3 MiB): ``413`` before
  any of the body is read; a streamed body cut off at that size: ``413``;
- a body that would take the bytes held across all connections past their cap: ``503`` with
  ``Retry-After``, before it is read (:class:`.limits.ByteBudget`);
- a body not complete ``request_timeout`` seconds after its head: ``408``;
- every refusal has a one-line JSON body, and those that leave part of a body unread close the
  connection instead of reading it; while the replica drains (:mod:`.draining`), every answer
  closes its connection.
"""

from __future__ import annotations

import asyncio
import http
import logging
import time
import urllib.parse
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import httptools

from ix_gpu.webhook.service.admission_handler import AdmissionHandler
from ix_gpu.webhook.service.admission_review import error_body
from ix_gpu.webhook.service.limits import ByteBudget

log = logging.getLogger("ix_gpu.webhook")

MUTATE_PATH = b"/mutate"
JSON = b"application/json"
_BUSY = "too many request bytes in flight; retry shortly"
_RETRY_AFTER = (b"retry-after", b"1")
_ALLOW_POST = (b"allow", b"POST")
_STATUS_LINES = {
    status.value: f"HTTP/1.1 {status.value} {status.phrase}\r\n".encode("latin-1")
    for status in http.HTTPStatus
}

Header = tuple[bytes, bytes]


class Owner(Protocol):
    """What an exchange needs of its connection (the protocol of :mod:`.http_protocol`)."""

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop

    @property
    def default_headers(self) -> list[Header]: ...

    def on_response_complete(self) -> None: ...

    def track(self, task: asyncio.Task[None]) -> None: ...


class MutateLane:
    """What every exchange on the port shares: the handler, the body limits, the drain flag."""

    def __init__(
        self,
        handler: AdmissionHandler,
        *,
        request_timeout: float,
        max_body_bytes: int,
        inflight: ByteBudget,
        closing: Callable[[], bool],
    ) -> None:
        self.handler = handler
        self.timeout = request_timeout
        self.limit = max_body_bytes
        self.inflight = inflight
        self.closing = closing
        """True while the replica drains: every answer then closes its connection."""

    @staticmethod
    def serves(url: bytes) -> bool:
        """Whether a request target is ``/mutate`` (with any query: the apiserver adds
        ``?timeout=10s``). Percent-encoded and absolute forms are decoded as uvicorn would."""
        path = url.partition(b"?")[0]
        if path == MUTATE_PATH:
            return True
        if b"%" not in path and b"://" not in path:
            return False
        try:
            path = httptools.parse_url(url).path or b""
        except httptools.HttpParserInvalidURLError:
            return False
        return urllib.parse.unquote_to_bytes(path) == MUTATE_PATH


class _Refusal:
    __slots__ = ("close", "counted", "extra", "message", "status")

    def __init__(
        self, status: int, message: str, *, close: bool, counted: bool = True, extra: tuple[Header, ...] = ()
    ) -> None:
        self.status = status
        self.message = message
        self.close = close
        """Part of the body is left unread: close rather than read it."""
        self.counted = counted
        """Counted and logged as a rejected request (all but 405, which is not an admission)."""
        self.extra = extra


def _header(headers: list[Header], name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


class MutateExchange:
    """One ``/mutate`` request on a connection, from its complete head to its answer.

    It stands where uvicorn's protocol keeps a request cycle (``protocol.cycle`` and its
    ``pipeline``), so pipelined requests are answered in order whatever serves them; the protocol
    reads ``response_complete``, ``keep_alive`` and ``disconnected`` of it, as of a cycle.
    """

    __slots__ = (
        "_chunks",
        "_complete",
        "_expect_continue",
        "_held",
        "_lane",
        "_owner",
        "_refusal",
        "_size",
        "_started",
        "_task",
        "_timer",
        "disconnected",
        "keep_alive",
        "response_complete",
    )

    def __init__(
        self,
        lane: MutateLane,
        owner: Owner,
        method: bytes,
        headers: list[Header],
        *,
        keep_alive: bool,
        expect_continue: bool,
    ) -> None:
        self.keep_alive = keep_alive
        """False for HTTP/1.0 or ``Connection: close``, and once the server shuts down."""
        self.response_complete = False
        self.disconnected = False
        self._lane = lane
        self._owner = owner
        self._expect_continue = expect_continue
        self._chunks: list[bytes] = []
        self._size = 0
        self._held = 0
        """Bytes reserved from the lane's :class:`ByteBudget`, released once answered."""
        self._complete = False
        self._started: float | None = None
        """``perf_counter()`` when this request became the connection's current one."""
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._refusal = self._check_head(method, headers)

    def _check_head(self, method: bytes, headers: list[Header]) -> _Refusal | None:
        if method != b"POST":
            return _Refusal(405, "Method Not Allowed", close=False, counted=False, extra=(_ALLOW_POST,))
        media_type = (_header(headers, b"content-type") or b"").partition(b";")[0].strip().lower()
        if media_type != JSON:
            return _Refusal(415, "Content-Type must be application/json", close=False)
        length = _header(headers, b"content-length")
        if length is None:  # chunked: reserved as it comes
            return None
        if not length.isdigit():
            return _Refusal(400, "Content-Length is not a number", close=True)
        limit = self._lane.limit
        if int(length) > limit:
            message = f"body of {length.decode()} bytes is over the {limit}-byte limit"
            return _Refusal(413, message, close=True)
        if not self._lane.inflight.try_reserve(int(length)):
            return _Refusal(503, _BUSY, close=True, extra=(_RETRY_AFTER,))
        self._held = int(length)
        return None

    # --- the parser's events, in the protocol's callbacks -------------------------------------

    def start(self, in_read: bool) -> None:
        """This request is now the connection's current one: at its head, in the read that
        brought it (``in_read``: the body's timer waits for the end of that read, see
        :meth:`waiting`), or after the pipelined requests before it were answered."""
        if self._owner.transport.is_closing():  # gone (or refused) while it was queued
            self.lost()
            return
        self._started = time.perf_counter()
        if self._refusal is not None:
            self._refuse()
        elif self._complete:
            self._answer()
        else:
            if self._expect_continue:
                self._owner.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            if not in_read:
                self.waiting()

    def body(self, chunk: bytes) -> None:
        if self._refusal is not None or self.response_complete:
            return  # refused: the rest is discarded (or the connection is closing)
        lane = self._lane
        self._size += len(chunk)
        if self._size > lane.limit:
            self._refused(_Refusal(413, f"body is over the {lane.limit}-byte limit", close=True))
            return
        if self._size > self._held:  # no (or a lying) Content-Length: reserve as it comes
            if not lane.inflight.try_reserve(self._size - self._held):
                self._refused(_Refusal(503, _BUSY, close=True, extra=(_RETRY_AFTER,)))
                return
            self._held = self._size
        self._chunks.append(chunk)

    def complete(self) -> None:
        if self._refusal is not None or self.response_complete:
            return
        self._complete = True
        if self._started is not None:
            self._answer()

    def waiting(self) -> None:
        """The connection's read is done and this request's body is still incomplete: from now
        on the body has ``request_timeout`` seconds. (Armed here rather than at the head, so the
        usual request, whose body comes in the same read, never sets a timer.)"""
        idle = self._timer is None and self._refusal is None and not self.response_complete
        if idle and self._started is not None and not self._complete:
            self._timer = self._owner.loop.call_later(self._lane.timeout, self._too_slow)

    def lost(self) -> None:
        """The connection is gone: nobody will read an answer."""
        if self.response_complete:
            return
        self.disconnected = True
        self._cancel_timer()
        if self._started is not None and not self._complete and self._refusal is None:
            self._lane.handler.reject(400, "client disconnected before the body was complete", self._started)
        if self._task is None:  # else the task releases when its work ends
            self._release()
        self._chunks = []

    # --- answering ----------------------------------------------------------------------------

    def _too_slow(self) -> None:
        self._timer = None
        if not self._complete and not self.response_complete:
            self._refused(_Refusal(408, f"body not received within {self._lane.timeout:g} s", close=True))

    def _refused(self, refusal: _Refusal) -> None:
        self._refusal = refusal
        self._chunks = []
        self._release()
        if self._started is not None:
            self._refuse()

    def _refuse(self) -> None:
        refusal = self._refusal
        assert refusal is not None and self._started is not None
        if refusal.counted:
            status, body = self._lane.handler.reject(refusal.status, refusal.message, self._started)
        else:
            status, body = refusal.status, error_body(refusal.message)
        self._send(status, body, refusal.extra, close=refusal.close)

    def _answer(self) -> None:
        self._cancel_timer()
        assert self._started is not None
        body = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks = []
        try:
            answer = self._lane.handler.answer(body, self._started)
        except Exception:  # a bug outside the core (which denies its own): say so, serve on
            log.exception("answering a review failed")
            answer = (500, error_body("internal error in the ix-gpu webhook"))
        if isinstance(answer, tuple):
            self._send(*answer, (_RETRY_AFTER,) if answer[0] == 503 else ())
            return
        self._task = self._owner.loop.create_task(self._answer_later(answer))
        self._owner.track(self._task)

    async def _answer_later(self, work: Coroutine[Any, Any, tuple[int, bytes]]) -> None:
        try:
            try:
                status, body = await work
            except Exception:
                log.exception("answering a review failed")
                status, body = 500, error_body("internal error in the ix-gpu webhook")
            if not self.disconnected:
                self._send(status, body, (_RETRY_AFTER,) if status == 503 else ())
        finally:
            self._release()

    def _send(self, status: int, body: bytes, extra: tuple[Header, ...], *, close: bool = False) -> None:
        """The whole answer as one write (one TLS record), then the connection's next request."""
        owner = self._owner
        close = close or not self.keep_alive or self._lane.closing()
        parts = [_STATUS_LINES[status]]
        for name, value in (*owner.default_headers, (b"content-type", JSON), *extra):
            parts += (name, b": ", value, b"\r\n")
        parts += (b"content-length: ", str(len(body)).encode(), b"\r\n")
        if close:
            parts.append(b"connection: close\r\n")
        parts += (b"\r\n", body)
        transport = owner.transport
        if not transport.is_closing():
            transport.write(b"".join(parts))
        self.response_complete = True
        self._release()
        if close:
            transport.close()
        owner.on_response_complete()

    def _release(self) -> None:
        if self._held:
            self._lane.inflight.release(self._held)
            self._held = 0

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
