"""The plugin's /healthz and /metrics port against the bad requests the webhook's port is tested with.

The port listens on every GPU node. Each test opens raw sockets to :func:`start_http_server` (the
function the plugin process calls) running on its own event loop in a thread, with small limits so
the tests are quick: ``HEAD`` answered without a body; a 70 KB request line answered 414 with
nothing logged; a head over the cap answered 431; a client sending one header line at a time
closed at the head deadline counted from the connection, not per line; and at the connection cap
(total and per client address) the oldest idle connection closed so the newcomer is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvloop

from ix_gpu.plugin.server.metrics import PluginMetrics
from ix_gpu.serving.agent_http import start_http_server
from ix_gpu.serving.guarded_http import HttpLimits
from ix_gpu.serving.text_metrics import CONTENT_TYPE
from tests.support.https_client import Answer, closed_by_peer, read_response

LIMITS = HttpLimits(max_connections=4, max_per_address=3, header_timeout=1.0, linger=0.5)
SLACK = 1.0


class FakePlugin:
    def __init__(self) -> None:
        self.metrics = PluginMetrics()
        self.reasons: list[str] = []
        self.degraded: list[str] = []
        self.waiting: list[str] = []

    def not_ready(self) -> list[str]:
        return list(self.waiting)

    def problems(self) -> list[str]:
        return list(self.reasons)

    def notes(self) -> list[str]:
        return list(self.degraded)

    def metrics_text(self) -> bytes:
        extra = ["# TYPE ix_gpu_chip_telemetry_stale gauge", 'ix_gpu_chip_telemetry_stale{uuid="GPU-0"} 0.0']
        return self.metrics.render(extra)


class Endpoint:
    """The plugin's HTTP server on 127.0.0.1, on an event loop of its own thread: asyncio's, as in
    the plugin, or uvloop's, as in the webhook (its probe port), whose transports differ."""

    def __init__(self, limits: HttpLimits, loop: str) -> None:
        self.plugin = FakePlugin()
        self.loop = uvloop.new_event_loop() if loop == "uvloop" else asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            start_http_server(self.plugin, "127.0.0.1", 0, limits), self.loop
        )
        self.server = future.result(10)
        self.port = int(self.server.sockets[0].getsockname()[1])

    def connect(self, source: str = "127.0.0.1") -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(5)
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", self.port))
        return sock

    def request(self, data: bytes, source: str = "127.0.0.1") -> Answer:
        with self.connect(source) as sock:
            sock.sendall(data)
            return read_response(sock)

    def get(self, path: str, method: str = "GET") -> Answer:
        return self.request(f"{method} {path} HTTP/1.1\r\nHost: node\r\nAccept: */*\r\n\r\n".encode())

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            await self.server.wait_closed()

        with contextlib.suppress(TimeoutError):
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@contextlib.contextmanager
def served(caplog: pytest.LogCaptureFixture, limits: HttpLimits, loop: str) -> Iterator[Endpoint]:
    caplog.set_level(logging.INFO)
    endpoint = Endpoint(limits, loop)
    try:
        yield endpoint
    finally:
        endpoint.close()
    # Nothing a client sends may end in a logged error (a 70 KB request line included).
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not errors, [r.getMessage() for r in errors]


@pytest.fixture
def endpoint(caplog: pytest.LogCaptureFixture, loop_kind: str) -> Iterator[Endpoint]:
    with served(caplog, LIMITS, loop_kind) as endpoint:
        yield endpoint


@pytest.fixture
def patient_endpoint(caplog: pytest.LogCaptureFixture, loop_kind: str) -> Iterator[Endpoint]:
    """A head deadline long enough that only evictions close the silent connections."""
    with served(caplog, LIMITS._replace(header_timeout=30), loop_kind) as endpoint:
        yield endpoint


def test_healthz_metrics_and_unknown_paths(endpoint: Endpoint) -> None:
    answer = endpoint.get("/healthz")
    assert (answer.status, answer.body, answer.closed) == (200, b"ok\n", True)
    assert endpoint.get("/healthz?verbose=1").status == 200
    endpoint.plugin.degraded = ["cannot read node n1 for 12s: HTTP Error 503"]
    answer = endpoint.get("/healthz")
    assert (answer.status, answer.body) == (200, b"ok\ncannot read node n1 for 12s: HTTP Error 503\n")
    endpoint.plugin.reasons = ["ixml gone", "not registered with the kubelet for 40s"]
    answer = endpoint.get("/healthz")
    assert answer.status == 503 and answer.body == b"ixml gone\nnot registered with the kubelet for 40s\n"
    answer = endpoint.get("/metrics")
    assert answer.status == 200 and answer.headers["content-type"] == CONTENT_TYPE
    assert b"# TYPE " in answer.body
    assert answer.body.endswith(b'ix_gpu_chip_telemetry_stale{uuid="GPU-0"} 0.0\n')  # the chips' lines last
    answer = endpoint.get("/nothing")
    assert answer.status == 404 and answer.body == b"not found: try /healthz or /metrics or /readyz\n"


def test_readyz_waits_for_registration_and_health(endpoint: Endpoint) -> None:
    """/readyz: 200 only when the agent is registered and healthy (a rolling update stops the old
    plugin only once the new one is ready)."""
    assert endpoint.get("/readyz").body == b"ok\n"
    endpoint.plugin.waiting = ["not registered with the kubelet"]
    answer = endpoint.get("/readyz")
    assert (answer.status, answer.body) == (503, b"not registered with the kubelet\n")
    endpoint.plugin.waiting, endpoint.plugin.reasons = [], ["ixml gone"]
    assert (endpoint.get("/readyz").status, endpoint.get("/healthz").status) == (503, 503)


def test_head_is_answered_without_a_body(endpoint: Endpoint) -> None:
    """HEAD: the GET answer's status and Content-Length, then the connection ends, with no body."""
    for path in ("/healthz", "/metrics", "/nothing"):
        expected = endpoint.get(path)
        with endpoint.connect() as sock:
            sock.sendall(f"HEAD {path} HTTP/1.1\r\nHost: node\r\n\r\n".encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert body == b"", (path, data)
        assert head.startswith(f"HTTP/1.1 {expected.status} ".encode()), head
        assert f"Content-Length: {len(expected.body)}".encode() in head, head


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"POST /healthz HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 405),
        (b"DELETE /metrics HTTP/1.1\r\n\r\n", 405),
        (b"GET /healthz\r\n\r\n", 400),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400),
        (b"GET /healthz SPDY/3\r\n\r\n", 400),
    ],
    ids=["post", "delete", "http-0.9", "tls-hello", "not-http"],
)
def test_other_methods_and_bad_request_lines(endpoint: Endpoint, request_bytes: bytes, status: int) -> None:
    answer = endpoint.request(request_bytes)
    assert answer.status == status and answer.closed, answer
    if status == 405:
        assert answer.headers["allow"] == "GET, HEAD"


def test_70_kb_request_line_is_a_414(endpoint: Endpoint) -> None:
    """Answered as soon as the line passes its cap, whether or not the line is ever finished, and
    the answer arrives although the client's extra bytes were never read (no reset)."""
    line = b"GET /" + b"a" * 70_000
    for finished in (True, False):
        with endpoint.connect() as sock:
            started = time.monotonic()
            sock.sendall(line + (b" HTTP/1.1\r\nHost: node\r\n\r\n" if finished else b""))
            answer = read_response(sock)
            assert answer.status == 414 and answer.closed, answer
            assert time.monotonic() - started < SLACK
    assert endpoint.get("/healthz").status == 200


def test_head_over_the_cap_is_a_431(endpoint: Endpoint) -> None:
    pad = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 1000) for i in range(20))  # about 20 KiB
    answer = endpoint.request(b"GET /healthz HTTP/1.1\r\n" + pad + b"\r\n")
    assert answer.status == 431 and answer.closed, answer
    just_under = b"GET /healthz HTTP/1.1\r\n" + pad[: 12 << 10].rpartition(b"\r\n")[0] + b"\r\n\r\n"
    assert endpoint.request(just_under).status == 200


def test_slow_headers_are_closed_at_one_deadline(endpoint: Endpoint) -> None:
    """One header line every 0.2 s (well within any per-line timeout) is answered 408 at the head
    deadline counted from the connection; so is a connection that sends nothing."""
    with endpoint.connect() as slow, endpoint.connect() as silent:
        started = time.monotonic()
        slow.sendall(b"GET /healthz HTTP/1.1\r\n")
        sent = 0
        slow.settimeout(0.2)
        received = b""
        while time.monotonic() - started < LIMITS.header_timeout + SLACK:
            try:
                received = slow.recv(65536)
                break
            except TimeoutError:
                slow.sendall(b"X-Slow-%d: a\r\n" % sent)
                sent += 1
        seconds = time.monotonic() - started
        slow.settimeout(2)
        answer = read_response(slow, received=received)
        assert answer.status == 408 and answer.closed, answer
        assert LIMITS.header_timeout - 0.1 < seconds < LIMITS.header_timeout + SLACK, seconds
        assert sent >= 3, sent
        assert read_response(silent).status == 408
        assert closed_by_peer(slow, 2.0) and closed_by_peer(silent, 2.0)


def _evicted(sock: socket.socket, wait: float = 0.3) -> bool:
    """Whether the server closed ``sock`` without an answer (what an evicted idle connection
    sees) within ``wait`` seconds."""
    sock.settimeout(wait)
    try:
        return not sock.recv(1)
    except TimeoutError:
        return False
    except ConnectionError:
        return True


def test_at_the_cap_the_oldest_idle_connection_makes_room(patient_endpoint: Endpoint) -> None:
    """Four silent connections fill the cap; each new client is served, and the connections closed
    to make room are the oldest silent ones (or a finished client's, when its close has not been
    seen yet)."""
    silent = [patient_endpoint.connect() for _ in range(LIMITS.max_connections)]
    try:
        time.sleep(0.1)
        for _ in range(3):
            assert patient_endpoint.get("/healthz").status == 200
        closed = [_evicted(sock) for sock in silent]
        assert closed[0] and closed == sorted(closed, reverse=True), closed
        assert not closed[-1], closed
    finally:
        for sock in silent:
            sock.close()


def test_one_address_cannot_take_every_slot(patient_endpoint: Endpoint) -> None:
    """127.0.0.2 may hold three of the four slots: its fourth and fifth connections close its own
    oldest, so it never holds the last slot; a client from 127.0.0.1 is then served without
    evicting anyone."""
    squatter = [patient_endpoint.connect("127.0.0.2") for _ in range(LIMITS.max_per_address + 2)]
    try:
        time.sleep(0.1)
        assert [_evicted(sock) for sock in squatter] == [True, True, False, False, False]
        assert patient_endpoint.get("/healthz").status == 200
        assert [_evicted(sock) for sock in squatter[2:]] == [False, False, False]
    finally:
        for sock in squatter:
            sock.close()
