"""``/healthz`` and ``/metrics`` on the metrics port: a few lines of asyncio, no web framework.

``/healthz`` replaces the vendor chart's ``ls <socket>`` liveness probe, which stays green while the
library is broken or the plugin has silently lost its kubelet registration. It answers 503 with
the reasons, one per line, so ``kubectl describe pod`` shows why the probe failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from ix_gpu.plugin.server.metrics import CONTENT_TYPE, PluginMetrics

log = logging.getLogger(__name__)


class HealthSource(Protocol):
    metrics: PluginMetrics

    def problems(self) -> list[str]: ...


def _response(status: str, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


def respond(app: HealthSource, method: str, path: str) -> bytes:
    path = path.split("?", 1)[0]
    if method not in ("GET", "HEAD"):
        return _response("405 Method Not Allowed", "text/plain", b"GET only\n")
    if path == "/healthz":
        problems = app.problems()
        if problems:
            return _response("503 Service Unavailable", "text/plain", ("\n".join(problems) + "\n").encode())
        return _response("200 OK", "text/plain", b"ok\n")
    if path == "/metrics":
        return _response("200 OK", CONTENT_TYPE, app.metrics.render())
    return _response("404 Not Found", "text/plain", b"not found: try /healthz or /metrics\n")


async def start_http_server(app: HealthSource, host: str, port: int) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), timeout=5)
            parts = line.decode("latin-1").split()
            # Drain the headers; the probe sends a handful and no body.
            while (header := await asyncio.wait_for(reader.readline(), timeout=5)) not in (
                b"\r\n",
                b"\n",
                b"",
            ):
                del header
            if len(parts) >= 2:
                writer.write(respond(app, parts[0], parts[1]))
                await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, host, port)
    log.info("serving /healthz and /metrics on %s:%d", host, port)
    return server
