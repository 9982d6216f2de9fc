"""The HTTP layer's ASGI side: a small FastAPI app for ``/healthz``, ``/readyz``, ``/metrics`` and
every 404.

``/mutate`` is not here: it is on the path of every Pod create in the cluster, and it is answered
by the connection's protocol itself (:mod:`.mutate_exchange`), without FastAPI's routing and
uvicorn's request cycle. Every refusal on this port has a one-line JSON body, as ``/mutate``'s do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ix_gpu.webhook.service.admission_review import error_body
from ix_gpu.webhook.service.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ix_gpu.webhook.service.metrics import ServiceMetrics

JSON = "application/json"

Readiness = Callable[[], tuple[bool, dict[str, Any]]]


HEALTHZ_BODY = b'{"status":"ok"}'
"""Alive: the event loop answers. Nothing else is checked, so a liveness probe never restarts a pod
that is merely waiting for the API server. (Also served on the probe port, :mod:`.server`.)"""


def readyz_answer(readiness: Readiness) -> tuple[int, bytes]:
    """``/readyz``'s status and JSON body, on the HTTPS port and on the probe port alike."""
    ready, details = readiness()
    return (200 if ready else 503), orjson.dumps({"ready": ready, **details})


def create_app(metrics: ServiceMetrics, readiness: Readiness) -> FastAPI:
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

    return app
