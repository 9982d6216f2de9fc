"""The HTTPS port's connections: uvicorn's httptools protocol with the connection cap, header size
and time limits (:mod:`.limits` says why each), and ``/mutate`` served by :mod:`.mutate_exchange`
without uvicorn's request cycle.

(The CLI never imports this module: :mod:`.server` does, when the webhook starts; so uvicorn's
protocol is imported at the top.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ix_gpu.serving.connection_slots import ConnectionSlots
from ix_gpu.webhook.service.limits import FREED_MEMORY, Limits
from ix_gpu.webhook.service.mutate_exchange import MutateExchange, MutateLane


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """One HTTPS connection: admitted to a slot or refused, its request heads held to the size and
    time limits, ``/mutate`` answered by a :class:`MutateExchange` and every other path by uvicorn's
    request cycle. What it is bound by is set per connection by :func:`guarded_protocol`."""

    _limits: Limits
    _lane: MutateLane
    _slots: ConnectionSlots
    _on_refused: Callable[[str], None]
    url: bytes
    """The request target as it arrives (uvicorn's, which it sets without declaring it)."""
    _header_timer: asyncio.TimerHandle | None = None
    _header_bytes = 0
    _in_headers = True
    _head_begun = False
    """A request's first byte came and its head is not complete yet."""
    _served_in_read = False
    """A review was answered (or begun) in the current read: later ones in it are queued."""
    _over = False
    """This request's headers went past the limit: stop keeping them, answer 431."""

    # The slot's state follows the requests: idle (evictable) from the connection's start, from
    # the end of each answer and while a request's headers arrive (not the server's work yet);
    # busy from complete headers to the end of the answer; closing once nothing more will be
    # served on it (a TLS shutdown can wait on the client for a while).
    def connection_made(self, transport: Any) -> None:
        peer = transport.get_extra_info("peername")
        refusal = self._slots.admit(self, str(peer[0]) if peer else "")
        if refusal is not None:
            self._on_refused(refusal)
            transport.abort()
            return
        super().connection_made(transport)
        # The TLS layer buffers up to 256 KiB of ciphertext per connection before it stops
        # reading the socket; with hundreds of connections streaming bodies that is most of
        # the process's memory. Past 64 KiB the kernel's socket buffer holds the rest.
        if hasattr(transport, "set_read_buffer_limits"):
            transport.set_read_buffer_limits(high=self._limits.tls_read_buffer_bytes)
        self._arm_header_timer()

    def evict(self) -> None:
        """Idle, so nobody waits for an answer; aborted rather than closed, so that its memory
        goes now and not after a TLS shutdown the client may never complete."""
        self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        FREED_MEMORY.note()
        self._slots.release(self)
        self._disarm_header_timer()
        self._unset_keepalive_if_required()
        if self.transport is None:  # refused in connection_made: nothing of uvicorn's to undo
            return
        # Exchanges are told here; uvicorn's own handling below only knows request cycles.
        for cycle in {self.cycle, *(cycle for cycle, _app in self.pipeline)}:
            if isinstance(cycle, MutateExchange):
                cycle.lost()
        if isinstance(self.cycle, MutateExchange):
            self.cycle = None
        super().connection_lost(exc)

    # uvicorn's per-request callbacks are replaced whole, not extended: each of them is a frame of
    # interpreted code per request, about 15 % of a small review's CPU all told. What they do is kept,
    # the keep-alive timer too: armed at each answer, cancelled by the next read. (One timer per
    # connection that looked at the idle time when it fired cost 3 % less CPU, but put the p99 of
    # 64 busy connections at 15 ms instead of 9-11: docs/benchmarks.md.)
    def data_received(self, data: bytes) -> None:
        self._served_in_read = False
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            message = "Invalid HTTP request received."
            self.logger.warning(message)
            self.send_400_response(message)
            return
        except httptools.HttpParserUpgrade:  # as uvicorn: a websocket, or a warning
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        # Headers still incomplete after this read but already over the limit: no need to wait
        # for the rest (the parser callbacks below stopped keeping them).
        if self._over and self._in_headers and not self.transport.is_closing():
            self._refuse_headers()
            return
        # A head begun in this read and still incomplete gets its timer now, not at its first
        # byte: the usual request comes whole in one read and never sets one. Its slot hears of
        # it now too (a used connection counts as just used); a head that came whole went
        # straight from idle to busy, with nothing in between that could evict it.
        if self._head_begun and self._header_timer is None and not self.transport.is_closing():
            self._slots.active(self)
            self._arm_header_timer()
        if isinstance(self.cycle, MutateExchange):
            self.cycle.waiting()

    # Header bytes are counted in the parser's callbacks, whatever the reads look like: one
    # read may hold a whole request (or several), and a request may start mid-read.
    def on_message_begin(self) -> None:
        # uvicorn's own begins the ASGI scope here; a /mutate exchange needs none, so the scope
        # is made at complete headers, for the other paths only (:meth:`on_headers_complete`).
        self.url, self.headers, self.expect_100_continue = b"", [], False
        self._in_headers, self._header_bytes, self._over = True, 0, False
        self._head_begun = True

    def on_url(self, url: bytes) -> None:
        if not self._count(len(url)):
            self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._count(len(name) + len(value) + 4):
            return
        name = name.lower()  # as uvicorn keeps them: the scope's headers and ours alike
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_headers = self._head_begun = False
        self._disarm_header_timer()
        if self._over:
            self._refuse_headers()
            return
        self._slots.busy(self)
        if self._lane.serves(self.url) and not self.parser.should_upgrade():
            self._begin_exchange(self._lane)
            return
        url, headers, expect = self.url, self.headers, self.expect_100_continue
        HttpToolsProtocol.on_message_begin(self)  # the scope, which resets what it refers to
        self.url, self.headers, self.expect_100_continue = url, headers, expect
        self.scope["headers"] = headers
        super().on_headers_complete()

    def _begin_exchange(self, lane: MutateLane) -> None:
        """A ``/mutate`` request: answered now, or queued behind the connection's unanswered
        requests exactly as uvicorn queues its cycles (:meth:`_start_asgi_task` starts it)."""
        parser = self.parser
        exchange = MutateExchange(
            lane,
            self,
            parser.get_method(),
            self.headers,
            keep_alive=parser.get_http_version() != "1.0" and parser.should_keep_alive(),
            expect_continue=self.expect_100_continue,
        )
        existing = self.cycle
        self.cycle = exchange  # type: ignore[assignment]
        idle = existing is None or existing.response_complete
        if idle and not self._served_in_read:
            self._served_in_read = True
            exchange.start(True)
            return
        # Behind an unanswered request, or behind one answered in this same read: queued, so
        # that one read of pipelined requests costs the loop one review at a time. (The answer
        # before it armed the keep-alive timeout, which must not close a connection that has a
        # request to serve.)
        self._unset_keepalive_if_required()
        self.flow.pause_reading()
        self.pipeline.appendleft((exchange, self.app))  # type: ignore[arg-type]
        if idle:  # nothing is left to answer before it that would start it
            self.loop.call_soon(self._serve_queued)

    def _serve_queued(self) -> None:
        """Start the request queued behind one answered in the same read, as uvicorn starts a
        queued cycle once the one before it is answered: reading resumes (its body may still be
        on the way), then the request starts. Nothing else starts it: everything parsed after it
        queued behind it."""
        if self.pipeline and not self.transport.is_closing():
            self.flow.resume_reading()
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if isinstance(cycle, MutateExchange):
            # The next turn of the loop, not here: here is inside the previous answer, and a
            # queue of small reviews would otherwise recurse through one another's answers.
            self.loop.call_soon(cycle.start, False)
        else:
            super()._start_asgi_task(cycle, app)

    @property
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        """uvicorn's headers for every answer (``date``, refreshed each second by its server)."""
        return self.server_state.default_headers

    def track(self, task: asyncio.Task[None]) -> None:
        """An exchange's answer that has to wait: graceful shutdown waits for it, as for a cycle."""
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def on_body(self, body: bytes) -> None:
        if self._over:
            return
        if isinstance(self.cycle, MutateExchange):
            self.cycle.body(body)
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._over:
            return
        if isinstance(self.cycle, MutateExchange):
            self.cycle.complete()
        else:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        """An answer has left: the next pipelined request starts, or the connection is idle."""
        self.server_state.total_requests += 1
        transport = self.transport
        if transport.is_closing():
            self._slots.closing(self)
            # Answered and closing (a refusal, often before the body was read): what the
            # client still sends is not wanted, so stop decrypting it into memory.
            transport.pause_reading()
        else:
            if self.flow.read_paused:
                self.flow.resume_reading()
            if self.pipeline:
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)
            else:
                self._unset_keepalive_if_required()
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler
                )
                self._slots.idle(self)
        # The next request's headers count from their first byte; until then the keep-alive
        # timeout governs the idle connection.
        self._in_headers = True
        self._header_bytes = 0

    def _count(self, size: int) -> bool:
        """Add header bytes; True when over the limit (the bytes are then not kept)."""
        self._header_bytes += size
        if self._header_bytes > self._limits.max_header_bytes:
            self._over = True
        return self._over

    def _refuse_headers(self) -> None:
        if not self.transport.is_closing():
            self._on_refused("header_size")
            self._refuse(b"431 Request Header Fields Too Large")

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self._limits.header_timeout, self._header_too_slow)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_too_slow(self) -> None:
        self._header_timer = None
        if self._in_headers and not self.transport.is_closing():
            self._on_refused("header_timeout")
            self._refuse(b"408 Request Timeout")

    def timeout_keep_alive_handler(self) -> None:
        super().timeout_keep_alive_handler()
        self._slots.closing(self)

    def send_400_response(self, msg: str) -> None:
        super().send_400_response(msg)
        self._slots.closing(self)

    def _refuse(self, status: bytes) -> None:
        self._disarm_header_timer()
        self._slots.closing(self)
        body = b'{"error":"' + status.split(b" ", 1)[1] + b'"}'
        self.transport.write(
            b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        self.transport.close()


def guarded_protocol(
    limits: Limits,
    lane: MutateLane,
    on_refused: Callable[[str], None],
    on_evicted: Callable[[], None],
) -> Callable[..., asyncio.Protocol]:
    """The connection factory for one server: each :class:`GuardedHttpToolsProtocol` it makes is
    bound to ``limits``, the ``/mutate`` ``lane``, and one set of connection slots that all its
    connections share. uvicorn calls it as it would call a protocol class. (A factory rather than a
    subclass per server: the class is compiled by mypyc, and an interpreted class cannot inherit
    from a compiled one.)"""
    slots = ConnectionSlots(
        limits.max_connections,
        limits.max_connections_per_address,
        limits.keep_idle_per_address,
        on_evict=on_evicted,
    )

    def connection(*args: Any, **kwargs: Any) -> GuardedHttpToolsProtocol:
        protocol = GuardedHttpToolsProtocol(*args, **kwargs)
        protocol._limits, protocol._lane, protocol._slots = limits, lane, slots
        protocol._on_refused = on_refused
        return protocol

    return connection
