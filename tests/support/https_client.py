"""Low-overhead HTTPS clients for load and limit tests of the real webhook, trusting only its CA.

httpx costs about a millisecond per request on the 2-core test machine, as much as the webhook's own
work on a small review, so suites that send tens of thousands of requests, or need to send what an
HTTP client will not (a lying Content-Length, half a header, a body that stops), use these:

- :class:`KeepAlive`: one persistent ``http.client`` connection that reconnects when the server
  closes it, timing each request on the client's clock.
- :func:`connect_tls`, :func:`request_head`, :func:`read_response`: raw TLS sockets for requests
  written byte by byte.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.webhook_process import ca_context

JSON_HEADERS = {"content-type": "application/json"}


@dataclass(slots=True)
class Answer:
    """One HTTP answer as the client saw it."""

    status: int
    body: bytes
    seconds: float
    """Client-measured: from the first byte sent to the last byte of the answer read."""
    headers: dict[str, str] = field(default_factory=dict)
    """Lower-cased names; the last value of a repeated header."""
    closed: bool = False
    """The server said ``Connection: close`` (or HTTP/1.0)."""


def host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None, url
    return parts.hostname, parts.port


class KeepAlive:
    """One keep-alive HTTPS connection to ``url``; a new one is made when the server closes it.

    Not thread-safe: one per thread. ``connections`` counts the TLS connections made, so a test can
    tell answers that closed the connection from those that kept it.
    """

    def __init__(self, url: str, ca_file: Path, timeout: float = 15.0) -> None:
        self.host, self.port = host_port(url)
        self.context = ca_context(ca_file)
        self.timeout = timeout
        self.connections = 0
        self._conn = self._connect()

    def _connect(self) -> http.client.HTTPSConnection:
        self.connections += 1
        return http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=self.timeout)

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> Answer:
        """Send one request and read its whole answer; transport errors propagate (after which the
        next request uses a new connection)."""
        started = time.perf_counter()
        try:
            self._conn.request(method, path, body=body, headers=headers or {})
            response = self._conn.getresponse()
            data = response.read()
        except BaseException:
            self.reconnect()
            raise
        seconds = time.perf_counter() - started
        answer = Answer(
            response.status,
            data,
            seconds,
            {name.lower(): value for name, value in response.getheaders()},
            response.will_close,
        )
        if response.will_close:
            self.reconnect()
        return answer

    def post(self, body: bytes, path: str = "/mutate", headers: dict[str, str] | None = None) -> Answer:
        return self.request("POST", path, body, headers or JSON_HEADERS)

    def get(self, path: str) -> Answer:
        return self.request("GET", path)

    def reconnect(self) -> None:
        self._conn.close()
        self._conn = self._connect()

    def close(self) -> None:
        self._conn.close()


# ------------------------------------------------------------------------------ raw TLS sockets


def connect_tls(url: str, ca_file: Path, timeout: float = 10.0) -> ssl.SSLSocket:
    """A TLS socket to ``url``'s host and port, handshake done, verified against ``ca_file`` only."""
    host, port = host_port(url)
    raw = socket.create_connection((host, port), timeout=timeout)
    try:
        return ca_context(ca_file).wrap_socket(raw, server_hostname=host)
    except BaseException:
        raw.close()
        raise


def request_head(
    method: str = "POST",
    path: str = "/mutate",
    *,
    length: int | str | None = None,
    chunked: bool = False,
    extra: dict[str, str] | None = None,
) -> bytes:
    """The request line and headers of an HTTP/1.1 request, ending with the blank line."""
    lines = [f"{method} {path} HTTP/1.1", "Host: localhost", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    lines += [f"{name}: {value}" for name, value in (extra or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class NoAnswer(ConnectionError):
    """The connection ended (or timed out) before a complete status line and headers arrived."""


def read_response(sock: socket.socket, started: float | None = None, received: bytes = b"") -> Answer:
    """Read one answer from ``sock`` (after the ``received`` bytes already read from it): status,
    headers and a Content-Length body.

    Raises :class:`NoAnswer` when the server closes (or stays silent past the socket's timeout)
    before the headers are complete; ``seconds`` counts from ``started`` (default: now)."""
    began = time.perf_counter() if started is None else started
    data = received
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise NoAnswer(f"closed after {len(data)} bytes: {data[:200]!r}")
            data += chunk
    except (TimeoutError, ssl.SSLError, ConnectionError) as exc:
        if isinstance(exc, NoAnswer):
            raise
        raise NoAnswer(f"{type(exc).__name__} after {len(data)} bytes: {exc}") from exc
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    try:
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
    except (TimeoutError, ssl.SSLError, ConnectionError):
        pass  # the status and headers are what these tests look at; a short body shows in len()
    return Answer(
        int(status_line.split(" ", 2)[1]),
        rest,
        time.perf_counter() - began,
        headers,
        headers.get("connection", "").lower() == "close",
    )


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """Whether the server has closed ``sock`` (EOF or reset) within ``timeout`` seconds, reading and
    discarding anything it still sends."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except (ssl.SSLError, ConnectionError):
            return True


def drip(
    sock: socket.socket, head: bytes, trickle: bytes, every: float, limit: float
) -> tuple[Answer | None, float]:
    """Send ``head``, then ``trickle`` one byte every ``every`` seconds, until the server answers or
    closes, ``trickle`` runs out, or ``limit`` seconds pass; then read the answer.

    Returns (the answer, or None when the connection ended without one; seconds since ``head``
    was sent) — how slowloris clients look from the server's side."""
    started = time.monotonic()
    sock.sendall(head)
    received = b""
    for byte in trickle:
        if time.monotonic() - started > limit:
            break
        sock.settimeout(every)
        try:
            received = sock.recv(65536)
            break  # the server said something, or closed (b"")
        except TimeoutError:
            pass
        except (ssl.SSLError, ConnectionError):
            return None, time.monotonic() - started
        try:
            sock.sendall(bytes([byte]))
        except (ssl.SSLError, ConnectionError):
            break
    sock.settimeout(max(0.5, limit - (time.monotonic() - started)))
    try:
        answer = read_response(sock, received=received)
    except NoAnswer:
        return None, time.monotonic() - started
    return answer, time.monotonic() - started
