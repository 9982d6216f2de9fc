"""``/healthz`` and ``/metrics`` of a node agent (the device plugin's and the DRA plugin's metrics
port), served by :mod:`ix_gpu.serving.guarded_http`.

``/healthz`` replaces the vendor chart's ``ls <socket>`` liveness probe, which stays green while the
library is broken or the plugin has silently lost its kubelet registration. It answers 503 with
the reasons, one per line, so ``kubectl describe pod`` shows why the probe failed. A 200 says
``ok``, then what is degraded but no reason to restart (API server reads that fail now), one per
line.

The port listens on every GPU node, so it has the webhook's limits (request line and head size,
one deadline for the head, a connection cap that evicts the oldest connection rather than
refusing the newest); the server is the standard library's asyncio, not uvicorn, because the
agents' memory is the budget.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from ix_gpu.serving.guarded_http import Answer, HttpLimits, Route, start_guarded_http
from ix_gpu.serving.guarded_http import address_text as address_text  # the agents' error messages
from ix_gpu.serving.text_metrics import CONTENT_TYPE

log = logging.getLogger(__name__)

_TEXT = "text/plain; charset=utf-8"


class HealthSource(Protocol):
    def problems(self) -> list[str]:
        """Why /healthz fails (a restart would help); empty when healthy."""

    def not_ready(self) -> list[str]:
        """Why /readyz fails (the agent runs, but should not take over from another yet)."""
        ...

    def notes(self) -> list[str]:
        """What is degraded but no reason to restart."""

    def metrics_text(self) -> bytes:
        """The /metrics body, text exposition format 0.0.4."""


def routes(agent: HealthSource) -> dict[str, Route]:
    def healthz() -> Answer:
        problems = agent.problems()
        if problems:
            return 503, _TEXT, ("\n".join(problems) + "\n").encode()
        return 200, _TEXT, "".join(f"{line}\n" for line in ["ok", *agent.notes()]).encode()

    def readyz() -> Answer:
        waiting = agent.not_ready() or agent.problems()
        if waiting:
            return 503, _TEXT, ("\n".join(waiting) + "\n").encode()
        return 200, _TEXT, b"ok\n"

    def metrics() -> Answer:
        return 200, CONTENT_TYPE, agent.metrics_text()

    return {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics}


async def start_http_server(
    agent: HealthSource, host: str, port: int, limits: HttpLimits | None = None
) -> asyncio.Server:
    """Serve ``agent`` on ``host`` (``::``: both IP families, see
    :func:`~ix_gpu.serving.guarded_http.listen_socket`); :class:`OSError` when it cannot listen."""
    server = await start_guarded_http(routes(agent), (host, port), limits=limits)
    bound = server.sockets[0].getsockname()  # the family and port it got, not the ones asked for
    log.info("serving /healthz and /metrics on %s", address_text(bound[0], bound[1]))
    return server
