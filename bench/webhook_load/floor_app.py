"""The server floor: uvloop, TLS and httptools answering every review with an answer computed in
advance. What a request costs before any of ix-gpu's own work (parse, mutation, response, log,
metrics, limits), and so the most a Python server on this stack could reach.

At start it computes ix-gpu's answer (the pure mutation of the built-in config) for each body in
``--bodies``; a request whose body is one of those gets that answer, anything else ``{}``.

With ``--handler`` each body is answered by ix-gpu's own handler instead (parse, mutation, answer,
metrics and the admission log line, as ``ix-gpu webhook`` does them), still in this minimal
protocol: what ix-gpu's work costs without its HTTP layer (uvicorn's protocol, the limits).

    python bench/webhook_load/floor_app.py --cert-dir certs --port 9443 --bodies DIR [--handler]
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httptools
import uvloop

sys.path.append(str(Path(__file__).resolve().parents[2]))  # PYTHONPATH (a compiled tree) first

from ix_gpu.config.webhook_config import default_config
from ix_gpu.process.json_logging import configure as configure_logging
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import NamespaceFacts
from ix_gpu.webhook.core.mutation import mutate
from ix_gpu.webhook.service.admission_handler import AdmissionHandler
from ix_gpu.webhook.service.admission_review import parse_review, review_response
from ix_gpu.webhook.service.hot_reload import LiveConfig
from ix_gpu.webhook.service.metrics import ServiceMetrics
from ix_gpu.webhook.service.namespace_cache import UnknownNamespaces


def _answer(body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    return head + body


def answers(bodies: Path) -> dict[bytes, bytes]:
    config = CompiledConfig(default_config())
    known: dict[bytes, bytes] = {}
    for path in sorted(bodies.glob("*.json")):
        body = path.read_bytes()
        review = parse_review(body)
        result = mutate(review.obj, review.operation, NamespaceFacts.unknown(review.namespace), config)
        known[body] = _answer(review_response(review.uid, result))
    return known


def handler_answers() -> Callable[[bytes], bytes]:
    """Each body answered by ix-gpu's handler: built-in config, namespaces known, metrics and the
    JSON admission log line on stderr."""
    configure_logging("info")
    live = LiveConfig(CompiledConfig(default_config()), None)
    handler = AdmissionHandler(live, _KnownNamespaces(), ServiceMetrics())

    def answer(body: bytes) -> bytes:
        reply = handler.answer(body, time.perf_counter())
        assert isinstance(reply, tuple), "a review that has to wait"
        return _answer(reply[1])

    return answer


class _KnownNamespaces(UnknownNamespaces):
    """Every namespace's facts in memory, as the namespace cache has them once synced."""

    def cached_facts(self, namespace: str) -> NamespaceFacts:
        return NamespaceFacts(namespace)


class Floor(asyncio.Protocol):
    def __init__(self, known: Callable[[bytes], bytes]) -> None:
        self.known = known
        self.parser = httptools.HttpRequestParser(self)
        self.chunks: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.chunks = []

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        self.transport.write(self.known(b"".join(self.chunks)))


_EMPTY = _answer(b"{}")


async def serve(args: argparse.Namespace) -> None:
    if args.handler:
        known = handler_answers()
    else:
        table = answers(Path(args.bodies))
        known = lambda body: table.get(body, _EMPTY)  # noqa: E731
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(Path(args.cert_dir) / "tls.crt", Path(args.cert_dir) / "tls.key")
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Floor(known), args.host, args.port, ssl=context, backlog=2048)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cert-dir", default="certs")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9443)
    parser.add_argument("--bodies", required=True, help="the directory of the benchmark's bodies")
    parser.add_argument("--handler", action="store_true", help="answer with ix-gpu's handler")
    uvloop.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
