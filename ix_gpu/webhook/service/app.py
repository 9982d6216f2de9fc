"""The HTTP layer: a thin ASGI lane for ``/mutate`` in front of a FastAPI app for the rest.

``/mutate`` is on the path of every Pod create in the cluster, so it does not go through
FastAPI's routing, dependency solving and middleware stack: measured on the 2-core benchmark
machine, that machinery alone costs about 110 µs per request against about 1 µs for a plain ASGI
callable — more than the mutation of a 14 KB pod. The lane does the few things HTTP needs itself
(method, content type, body limits, status and headers); ``/healthz``, ``/readyz``, ``/metrics``
and every 404 stay ordinary FastAPI routes.

The body is read by hand because the limits must apply before it is in memory: a Content-Length
over 3 MiB is refused unread, a streamed body is cut off at 3 MiB, and a stalled body is answered
408 after ``request_timeout``, and a body that would take the bytes held across all connections
past their cap is refused 503 with ``Retry-After`` before it is read (:mod:`.limits`). Every
refusal has a one-line JSON body; the only 5xx is that 503, which says "busy", never "broken".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ix_gpu.webhook.service.admission_handler import AdmissionHandler
from ix_gpu.webhook.service.admission_review import MAX_BODY_BYTES, error_body
from ix_gpu.webhook.service.limits import ByteBudget, Limits
from ix_gpu.webhook.service.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ix_gpu.webhook.service.metrics import ServiceMetrics

JSON = "application/json"
MUTATE_PATH = "/mutate"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Readiness = Callable[[], tuple[bool, dict[str, Any]]]

_JSON_HEADER = (b"content-type", JSON.encode())
_CLOSE_HEADER = (b"connection", b"close")
_RETRY_AFTER = (b"retry-after", b"1")


class _BodyRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _ClientGone(Exception):
    """The client disconnected before sending the whole body: there is no one to answer."""


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


_BUSY = "too many request bytes in flight; retry shortly"


async def _read_body(
    scope: Scope, receive: Receive, limit: int, timeout: float, budget: ByteBudget, held: list[int]
) -> bytes:
    """The whole body, within ``limit`` bytes and ``timeout`` seconds. Bytes are reserved from
    ``budget`` before they are buffered (all at once when Content-Length says how many); what was
    reserved is added to ``held`` for the caller to release."""
    length = _header(scope, b"content-length")
    if length is not None:
        if not length.isdigit():
            raise _BodyRefused(400, "Content-Length is not a number")
        if int(length) > limit:
            raise _BodyRefused(413, f"body of {length.decode()} bytes is over the {limit}-byte limit")
        if not budget.try_reserve(int(length)):
            raise _BodyRefused(503, _BUSY)
        held.append(int(length))
    # The app is called when the headers are complete; the body may still be on its way (or
    # never come), so even the first receive() is bounded.
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout):
            message = await receive()
            while True:
                if message["type"] == "http.disconnect":
                    raise _ClientGone()
                chunk = message.get("body", b"")
                if chunk:
                    size += len(chunk)
                    if size > limit:
                        raise _BodyRefused(413, f"body is over the {limit}-byte limit")
                    if size > sum(held):  # no (or a lying) Content-Length: reserve as it comes
                        extra = size - sum(held)
                        if not budget.try_reserve(extra):
                            raise _BodyRefused(503, _BUSY)
                        held.append(extra)
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    break
                message = await receive()
    except TimeoutError:
        raise _BodyRefused(408, f"body not received within {timeout:g} s") from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _respond(send: Send, status: int, body: bytes, *extra: tuple[bytes, bytes]) -> None:
    headers = [_JSON_HEADER, (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class AdmissionLane:
    """ASGI app: ``/mutate`` here, everything else to the FastAPI app."""

    def __init__(
        self,
        handler: AdmissionHandler,
        app: FastAPI,
        *,
        request_timeout: float,
        max_body_bytes: int,
        inflight: ByteBudget,
        closing: Callable[[], bool],
    ) -> None:
        self._handler = handler
        self._app = app
        self._timeout = request_timeout
        self._limit = max_body_bytes
        self._inflight = inflight
        self._closing = closing

    async def _respond(self, send: Send, status: int, body: bytes, *extra: tuple[bytes, bytes]) -> None:
        """While the replica drains (:mod:`.draining`), every answer closes its connection, so the
        client's next review opens one to a replica that stays."""
        if self._closing() and _CLOSE_HEADER not in extra:
            extra = (*extra, _CLOSE_HEADER)
        await _respond(send, status, body, *extra)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != MUTATE_PATH:
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        if scope["method"] != "POST":
            await self._respond(send, 405, error_body("Method Not Allowed"), (b"allow", b"POST"))
            return
        media_type = (_header(scope, b"content-type") or b"").partition(b";")[0].strip().lower()
        if media_type != b"application/json":
            status, body = self._handler.reject(415, f"Content-Type must be {JSON}", started)
            await self._respond(send, status, body)
            return
        held: list[int] = []
        try:
            try:
                raw = await _read_body(scope, receive, self._limit, self._timeout, self._inflight, held)
            except _BodyRefused as exc:
                status, body = self._handler.reject(exc.status, str(exc), started)
                # The rest of the body is not worth reading: close instead of draining it.
                extra = [_CLOSE_HEADER, *([_RETRY_AFTER] if exc.status == 503 else [])]
                await self._respond(send, status, body, *extra)
                return
            except _ClientGone:
                status, body = self._handler.reject(
                    400, "client disconnected before the body was complete", started
                )
                # Dropped by the server: nobody listens.
                await self._respond(send, status, body, _CLOSE_HEADER)
                return
            status, body = await self._handler.handle(raw, started)
            del raw
            await self._respond(send, status, body, *([_RETRY_AFTER] if status == 503 else []))
        finally:
            self._inflight.release(sum(held))


HEALTHZ_BODY = b'{"status":"ok"}'
"""Alive: the event loop answers. Nothing else is checked, so a liveness probe never restarts a pod
that is merely waiting for the API server. (Also served on the probe port, :mod:`.server`.)"""


def readyz_answer(readiness: Readiness) -> tuple[int, bytes]:
    """``/readyz``'s status and JSON body, on the HTTPS port and on the probe port alike."""
    ready, details = readiness()
    return (200 if ready else 503), orjson.dumps({"ready": ready, **details})


def create_app(
    handler: AdmissionHandler,
    metrics: ServiceMetrics,
    readiness: Readiness,
    *,
    request_timeout: float = 10.0,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_inflight_body_bytes: int = Limits.max_inflight_body_bytes,
    closing: Callable[[], bool] = lambda: False,
) -> AdmissionLane:
    app = FastAPI(title="ix-gpu webhook", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(HEALTHZ_BODY, media_type=JSON)

    @app.get("/readyz")
    async def readyz() -> Response:
        status, body = readyz_answer(readiness)
        return Response(body, status_code=status, media_type=JSON)

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return Response(
            error_body(str(exc.detail)), status_code=exc.status_code, media_type=JSON, headers=exc.headers
        )

    return AdmissionLane(
        handler,
        app,
        request_timeout=request_timeout,
        max_body_bytes=max_body_bytes,
        inflight=ByteBudget(max_inflight_body_bytes),
        closing=closing,
    )
