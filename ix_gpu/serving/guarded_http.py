"""A small HTTP/1.1 server for a few GET endpoints (``/healthz``, ``/readyz``, ``/metrics``), with
the webhook's limits: one request per connection, request line and header size caps, one deadline
for the whole head, and a connection cap that never locks new clients out.

Why not uvicorn, which the webhook has: the device plugin runs on every GPU node and its RSS is
the budget (about 30.5 MiB at rest); uvicorn, httptools and their imports would add several MiB.
This is a single :class:`asyncio.Protocol` over the standard library. Why not
``asyncio.start_server`` with ``readline()``, what the plugin had: a line longer than the stream's
64 KiB limit raises out of ``readline()``; each line got a fresh timeout, so a client sending one
header line every few seconds held its connection for ever; ``HEAD`` got a body; and nothing capped
the connections.

What a client gets:

- a request line over ``max_request_line`` bytes: ``414``; a head over ``max_head_bytes``: ``431``;
  both as soon as the limit is passed, without waiting for the rest;
- a head not complete ``header_timeout`` seconds after the connection was made: ``408``;
- a request line that is not ``METHOD TARGET HTTP/1.x``: ``400``; a method other than GET or
  HEAD: ``405``; ``HEAD``: the GET answer's status and headers, without the body;
- every answer closes the connection (``Connection: close``): probes and scrapes make one request
  per connection, so keep-alive would only hold slots.

Connections beyond the cap are handled by :class:`~ix_gpu.serving.connection_slots.ConnectionSlots`:
every connection here is idle until its head is complete, and the answer is written in the same
step, so the newcomer always takes the slot of the oldest connection instead of being refused.

After an answer the server stops sending (FIN) and discards what the client still sends for up to
``linger`` seconds before closing: closing a socket with unread bytes makes the kernel send a
reset, which can destroy the answer before the client reads it (a 414 to a 70 KB request line).

Every listener of ix-gpu (this server's, and the webhook's HTTPS port, whose socket uvicorn is
handed) is bound by :func:`listen_socket`, so what ``::`` means is decided once: every address of
both IP families, from one dual-stack socket, because a cluster may be IPv4-only, IPv6-only or
dual-stack and the kubelet's probes and Prometheus dial the pod's primary address, whichever
family that is.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any, NamedTuple, cast

from ix_gpu.serving.connection_slots import ConnectionSlots

Answer = tuple[int, str, bytes]
"""Status, content type and body of an answer."""
Route = Callable[[], Answer]
OnRefused = Callable[[str], None]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_TEXT = "text/plain; charset=utf-8"

log = logging.getLogger(__name__)

ANY_ADDRESS = "::"
"""The default listen address: every address of both IP families (of IPv4 alone where the kernel
has no IPv6). An explicit address, ``0.0.0.0`` included, binds that address's family only."""


class HttpLimits(NamedTuple):
    """(A named tuple rather than a dataclass: a third of the memory, in the plugin's process.)"""

    max_connections: int = 32
    max_per_address: int = 8
    max_request_line: int = 8 << 10
    max_head_bytes: int = 16 << 10
    header_timeout: float = 5.0
    linger: float = 1.0


def _answer_bytes(status: int, content_type: str, body: bytes, *, head_only: bool, extra: str = "") -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") if head_only else head.encode("latin-1") + body


class _Connection(asyncio.Protocol):
    """One client connection: gathers the head within the limits, answers once, closes."""

    transport: asyncio.Transport | None = None
    _timer: asyncio.TimerHandle | None = None

    def __init__(self, server: _Server) -> None:
        self._server = server
        self._head = bytearray()
        self._answered = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (asyncio's or uvloop's, which does not subclass asyncio.Transport).
        transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        refusal = self._server.slots.admit(self, address)
        if refusal is not None:
            self._server.on_refused(refusal)
            transport.abort()
            return
        self.transport = transport
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._server.limits.header_timeout, self._too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self._server.slots.release(self)
        self._head = bytearray()

    def evict(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._answered:
            return  # lingering: the client's leftovers are discarded
        limits = self._server.limits
        searched = max(len(self._head) - 3, 0)
        self._head += data
        line_end = self._head.find(b"\n", 0, limits.max_request_line + 2)
        if line_end < 0:
            if len(self._head) > limits.max_request_line + 1:
                self._refuse(414, "request_line")
            return
        end = self._head.find(b"\n\r\n", max(searched - 1, line_end), limits.max_head_bytes + 3)
        if end < 0:
            end = self._head.find(b"\n\n", max(searched, line_end), limits.max_head_bytes + 2)
        if end < 0:
            if len(self._head) > limits.max_head_bytes:
                self._refuse(431, "header_size")
            return
        self._respond(bytes(self._head[:line_end]).rstrip(b"\r"))

    def eof_received(self) -> bool | None:
        if not self._answered:
            self._finish()  # the client stopped sending before its head was complete
        return None

    def _respond(self, line: bytes) -> None:
        parts = line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or not parts[0].isalpha():
            self._send(_answer_bytes(400, _TEXT, b"bad request line\n", head_only=False))
            return
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        head_only = method == b"HEAD"
        if method not in (b"GET", b"HEAD"):
            body = b"GET or HEAD only\n"
            self._send(_answer_bytes(405, _TEXT, body, head_only=False, extra="Allow: GET, HEAD\r\n"))
            return
        route = self._server.routes.get(target.decode("latin-1"))
        if route is None:
            status, content_type, body = 404, _TEXT, self._server.not_found
        else:
            try:
                status, content_type, body = route()
            except Exception:  # a bug behind one endpoint: say so in the log, answer 500, serve on
                log.exception("answering %s failed", target.decode("latin-1"))
                status, content_type, body = 500, _TEXT, b"internal error\n"
        self._send(_answer_bytes(status, content_type, body, head_only=head_only))

    def _refuse(self, status: int, reason: str) -> None:
        self._server.on_refused(reason)
        body = f"{_REASONS[status]}\n".encode()
        self._send(_answer_bytes(status, _TEXT, body, head_only=False))

    def _too_slow(self) -> None:
        self._timer = None
        if not self._answered:
            self._refuse(408, "header_timeout")

    def _send(self, answer: bytes) -> None:
        self._answered = True
        self._head = bytearray()
        self._cancel_timer()
        self._server.slots.closing(self)
        transport = self.transport
        assert transport is not None
        transport.write(answer)
        if transport.can_write_eof():
            transport.write_eof()
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._server.limits.linger, self._finish)
        else:
            transport.close()

    def _finish(self) -> None:
        self._timer = None
        if self.transport is not None:
            self.transport.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Server:
    def __init__(self, routes: dict[str, Route], limits: HttpLimits, on_refused: OnRefused) -> None:
        self.routes = routes
        self.limits = limits
        self.on_refused = on_refused
        self.not_found = f"not found: try {' or '.join(sorted(routes))}\n".encode()
        self.slots = ConnectionSlots(limits.max_connections, limits.max_per_address, keep_recent=0)

    def connection(self) -> _Connection:
        return _Connection(self)


async def start_guarded_http(
    routes: dict[str, Route],
    where: tuple[str, int] | socket.socket,
    *,
    limits: HttpLimits | None = None,
    on_refused: OnRefused | None = None,
) -> asyncio.Server:
    """Serve ``routes`` (path -> answer) on ``where``: a (host, port) to bind with
    :func:`listen_socket`, or a bound socket.

    ``on_refused(reason)`` is called for each request or connection a limit ended: ``request_line``,
    ``header_size``, ``header_timeout``, or a :class:`ConnectionSlots` refusal reason."""
    server = _Server(routes, limits or HttpLimits(), on_refused or (lambda _reason: None))
    sock = where if isinstance(where, socket.socket) else listen_socket(*where)
    try:
        return await asyncio.get_running_loop().create_server(server.connection, sock=sock)
    except BaseException:
        if sock is not where:
            sock.close()
        raise


def address_text(host: str, port: int) -> str:
    """``host:port`` as a URL writes it (``[::]:9401``), so an IPv6 address in a message is not
    misread as a longer address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _stream_socket(family: socket.AddressFamily) -> socket.socket:
    """A new TCP socket. Kept apart because this is the step that fails (EAFNOSUPPORT) for AF_INET6
    on a kernel booted with ``ipv6.disable=1``, where ``socket.has_ipv6`` still says True: that
    describes how Python was built, not the running kernel."""
    return socket.socket(family, socket.SOCK_STREAM)


def _dual_stack_socket() -> socket.socket:
    """An AF_INET6 socket that also accepts IPv4 (clients seen as ``::ffff:a.b.c.d``). IPV6_V6ONLY
    is turned off here rather than left to the host's ``net.ipv6.bindv6only``, which some
    distributions set to 1: ``::`` would then silently stop answering IPv4."""
    sock = _stream_socket(socket.AF_INET6)
    try:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    except BaseException:
        sock.close()
        raise
    return sock


def _listening(sock: socket.socket, address: tuple[Any, ...], backlog: int) -> socket.socket:
    """Bind ``sock`` and listen, closing it on failure so a refused address leaks no descriptor."""
    try:
        # A restart while the old process's connections sit in TIME_WAIT must not find the port
        # "in use" (asyncio and socket.create_server do the same).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def listen_socket(host: str, port: int, *, backlog: int = 100) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (port 0: a free one), for every ix-gpu listener.

    ``::`` (:data:`ANY_ADDRESS`) is one dual-stack socket; where the kernel cannot make AF_INET6
    sockets it is ``0.0.0.0`` instead, with a warning, since an agent that refused to start on an
    IPv4-only host would fail every probe for a choice nobody made. Which one it got is logged. Only
    the socket's creation falls back: a port in use stays an error. Any other ``host`` (an IPv4 or
    IPv6 literal, or a name, of which the first address counts) binds exactly that, its family
    alone. Raises :class:`OSError` (``socket.gaierror`` for a name that does not resolve)."""
    if host == ANY_ADDRESS:
        try:
            sock = _dual_stack_socket()
        except OSError as exc:
            sock = _listening(_stream_socket(socket.AF_INET), ("0.0.0.0", port), backlog)
            where = address_text("0.0.0.0", sock.getsockname()[1])
            log.warning("IPv6 unavailable (%s): listening on %s, IPv4 only", exc.strerror or exc, where)
            return sock
        sock = _listening(sock, ("::", port), backlog)
        log.info("listening on %s, IPv6 and IPv4", address_text("::", sock.getsockname()[1]))
        return sock
    family, _type, _proto, _name, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    return _listening(_stream_socket(family), address, backlog)
