"""The FastAPI app: HTTP in and out, nothing else.

``/mutate`` reads the body itself instead of declaring a pydantic body parameter: the limits have
to apply *before* the body is in memory (Content-Length over 3 MiB is refused unread, a streamed
body is cut off at 3 MiB, a slow or stalled body is answered 408), and the review is parsed once
with orjson by the handler. Every refusal is a 4xx with a one-line JSON body; nothing a client
sends leads to a 5xx.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from webhook.admission_handler import AdmissionHandler
from webhook.admission_review import MAX_BODY_BYTES, error_body
from webhook.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from webhook.metrics import ServiceMetrics

JSON = "application/json"
_CLOSE = {"connection": "close"}

Readiness = Callable[[], tuple[bool, dict[str, Any]]]


class _BodyRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _ClientGone(Exception):
    """The client disconnected before sending the whole body: there is no one to answer."""


async def _read_body(request: Request, limit: int, timeout: float) -> bytes:
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise _BodyRefused(400, "Content-Length is not a number")
        if int(length) > limit:
            raise _BodyRefused(413, f"body of {length} bytes is over the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    receive = request.receive
    try:
        async with asyncio.timeout(timeout):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _ClientGone()
                chunk = message.get("body", b"")
                if chunk:
                    size += len(chunk)
                    if size > limit:
                        raise _BodyRefused(413, f"body is over the {limit}-byte limit")
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    break
    except TimeoutError:
        raise _BodyRefused(408, f"body not received within {timeout:g} s") from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _json_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(error_body(message), status_code=status, media_type=JSON, headers=headers)


def create_app(
    handler: AdmissionHandler,
    metrics: ServiceMetrics,
    readiness: Readiness,
    *,
    request_timeout: float = 10.0,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> FastAPI:
    app = FastAPI(title="ix-gpu webhook", docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/mutate")
    async def mutate_endpoint(request: Request) -> Response:
        started = time.perf_counter()
        media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media_type != JSON:
            status, body = handler.reject(415, f"Content-Type must be {JSON}", started)
            return Response(body, status_code=status, media_type=JSON)
        try:
            raw = await _read_body(request, max_body_bytes, request_timeout)
        except _BodyRefused as exc:
            status, body = handler.reject(exc.status, str(exc), started)
            # The rest of the body is not worth reading: close instead of draining it.
            return Response(body, status_code=status, media_type=JSON, headers=_CLOSE)
        except _ClientGone:
            handler.reject(400, "client disconnected before the body was complete", started)
            return Response(b"", status_code=400, headers=_CLOSE)
        status, body = await handler.handle(raw, started)
        return Response(body, status_code=status, media_type=JSON)

    @app.get("/healthz")
    async def healthz() -> Response:
        """Alive: the event loop answers. Nothing else is checked, so a liveness probe never
        restarts a pod that is merely waiting for the API server."""
        return Response(b'{"status":"ok"}', media_type=JSON)

    @app.get("/readyz")
    async def readyz() -> Response:
        ready, details = readiness()
        return Response(
            orjson.dumps({"ready": ready, **details}), status_code=200 if ready else 503, media_type=JSON
        )

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return _json_error(exc.status_code, str(exc.detail), dict(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return _json_error(400, "invalid request")

    return app
