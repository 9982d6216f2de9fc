"""The server floor: uvloop, TLS and httptools answering every review with an answer computed in
advance. What a request costs before any of ix-gpu's own work (parse, mutation, response, log,
metrics, limits), and so the most a Python server on this stack could reach.

At start it computes ix-gpu's answer (the pure mutation of the built-in config) for each body in
``--bodies``; a request whose body is one of those gets that answer, anything else ``{}``.

    python bench/webhook_load/floor_app.py --cert-dir certs --port 9443 --bodies DIR
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys
from pathlib import Path

import httptools
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ix_gpu.config.webhook_config import default_config
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import NamespaceFacts
from ix_gpu.webhook.core.mutation import mutate
from ix_gpu.webhook.service.admission_review import parse_review, review_response


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


class Floor(asyncio.Protocol):
    def __init__(self, known: dict[bytes, bytes]) -> None:
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
        self.transport.write(self.known.get(b"".join(self.chunks), _EMPTY))


_EMPTY = _answer(b"{}")


async def serve(args: argparse.Namespace) -> None:
    known = answers(Path(args.bodies))
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
    uvloop.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
