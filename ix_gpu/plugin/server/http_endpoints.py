"""``/healthz`` and ``/metrics`` on the metrics port, served by :mod:`ix_gpu.runtime.guarded_http`.

``/healthz`` replaces the vendor chart's ``ls <socket>`` liveness probe, which stays green while the
library is broken or the plugin has silently lost its kubelet registration. It answers 503 with
the reasons, one per line, so ``kubectl describe pod`` shows why the probe failed. A 200 says
``ok``, then what is degraded but no reason to restart (API server reads that fail now), one per
line.

The port listens on every GPU node, so it has the webhook's limits (request line and head size,
one deadline for the head, a connection cap that evicts the oldest connection rather than
refusing the newest); the server is the standard library's asyncio, not uvicorn, because the
plugin's memory is the budget.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Protocol

from ix_gpu.plugin.server.metrics import CONTENT_TYPE, PluginMetrics
from ix_gpu.runtime.guarded_http import Answer, HttpLimits, Route, start_guarded_http

log = logging.getLogger(__name__)

_TEXT = "text/plain; charset=utf-8"


class HealthSource(Protocol):
    metrics: PluginMetrics

    def problems(self) -> list[str]: ...

    def notes(self) -> list[str]: ...

    def telemetry_lines(self) -> Iterable[str]: ...


def routes(app: HealthSource) -> dict[str, Route]:
    def healthz() -> Answer:
        problems = app.problems()
        if problems:
            return 503, _TEXT, ("\n".join(problems) + "\n").encode()
        return 200, _TEXT, "".join(f"{line}\n" for line in ["ok", *app.notes()]).encode()

    def metrics() -> Answer:
        return 200, CONTENT_TYPE, app.metrics.render(app.telemetry_lines())

    return {"/healthz": healthz, "/metrics": metrics}


async def start_http_server(
    app: HealthSource, host: str, port: int, limits: HttpLimits | None = None
) -> asyncio.Server:
    server = await start_guarded_http(routes(app), (host, port), limits=limits)
    log.info("serving /healthz and /metrics on %s:%d", host, port)
    return server
