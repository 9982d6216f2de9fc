"""Who keeps a connection slot when a server is full: the newcomer, in place of the connection that
has been idle longest.

Why not refuse at the cap, the obvious rule: a client that opens as many keep-alive connections as
the cap and sends one tiny request on each now and then keeps them all, and every later client,
the apiserver's next connection and the kubelet's probes among them, is closed after its handshake
for as long as it likes (measured against the webhook's old cap of 128: 0 of 60 new clients served;
200 connections that sent nothing refused half of the new clients until the header timeout). A
connection that is not working on a request holds nothing anyone is waiting for, so at the cap the
longest-idle one is closed and the newcomer takes its slot. Only when every connection is in the
middle of a request is the newcomer refused; those are bounded by the servers' own deadlines.

Refinements:

- **Per client address.** One address may hold at most ``max_per_address`` slots; past that its
  own longest-idle connection makes room. One squatting pod then cannot fill the server even with
  busy connections, whatever the total cap is.
- **Each address keeps its most recently used idle connections**, ``keep_recent`` of them. A
  keep-alive client (Go's transport, the apiserver's) takes the most recently used connection of
  its pool first, so those are the ones its next requests travel on, and closing one while a
  request is on its way fails that request; deeper in its pool are spares it rarely picks. A burst
  of new connections, however long, then never costs a client the connections it is using (a
  time grace instead, say 15 s idle, lost them to a burst that lasted longer, and let a squatter
  that sends a request on each connection more often than that keep them all).
- **Connections that never sent a request go before used ones of the same age.** A real client
  sends its first request as soon as its handshake is done, so a connection still without one is
  the least likely to be waited on.
- **Closing connections go first** (their answer said ``Connection: close``, or a TLS shutdown is
  waiting on the client): nothing more will be served on them.

"Idle" means no request is being served: from the connection's start, from the end of its last
answer, or from the first byte of a request whose headers are not complete yet (a client trickling
headers holds nothing the server is working on; the header deadline ends it anyway).

Single-threaded by design: every call comes from the event loop that owns the connections.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

REFUSED_TOTAL = "connections"
"""The refusal reason when every slot holds a connection in the middle of a request."""
REFUSED_ADDRESS = "connections_per_address"
"""The refusal reason when every slot of the client's address holds a busy connection."""

_CLOSING = float("-inf")
"""The idle-since of a closing connection: older than any, so it goes first."""


class Evictable(Protocol):
    """What the slots need of a connection. (At module level, not under ``TYPE_CHECKING``: the
    webhook's build compiles this module with mypyc, which takes no class inside a block.)"""

    def evict(self) -> None:
        """Close the connection now, without an answer (it is idle: nobody waits for one)."""


class _Idle:
    """The idle connections of one scope (the server, or one address), oldest first: those that
    never served a request (closing ones in front) and those that did."""

    __slots__ = ("fresh", "used")

    def __init__(self) -> None:
        self.fresh: OrderedDict[Evictable, float] = OrderedDict()
        self.used: OrderedDict[Evictable, float] = OrderedDict()

    def discard(self, conn: Evictable) -> None:
        self.fresh.pop(conn, None)
        self.used.pop(conn, None)


class ConnectionSlots:
    """The connections of one server: how many, from which address, which are idle since when."""

    def __init__(
        self,
        max_connections: int,
        max_per_address: int,
        keep_recent: int,
        *,
        on_evict: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_connections = max_connections
        self.max_per_address = min(max_per_address, max_connections)
        self.keep_recent = keep_recent
        self._on_evict = on_evict
        self._clock = clock
        self._address: dict[Evictable, str] = {}
        self._counts: dict[str, int] = {}
        self._idle = _Idle()
        self._idle_by_address: dict[str, _Idle] = {}

    def __len__(self) -> int:
        return len(self._address)

    def count(self, address: str) -> int:
        return self._counts.get(address, 0)

    def admit(self, conn: Evictable, address: str) -> str | None:
        """Give ``conn`` (from ``address``) a slot, evicting an idle connection if that is what it
        takes; None when admitted (as idle, without a request yet), else the refusal reason (the
        caller closes ``conn``)."""
        if self.count(address) >= self.max_per_address and not self._evict(self._idle_by_address[address]):
            # Named after the total cap when the server had no room for anyone either.
            full = len(self._address) >= self.max_connections and self._victim(self._idle) is None
            return REFUSED_TOTAL if full else REFUSED_ADDRESS
        if len(self._address) >= self.max_connections and not self._evict(self._idle):
            return REFUSED_TOTAL
        self._address[conn] = address
        self._counts[address] = self.count(address) + 1
        now = self._clock()
        for scope in self._scopes(address):
            scope.fresh[conn] = now
        return None

    def active(self, conn: Evictable) -> None:
        """A request of ``conn``'s has begun to arrive: a used connection counts as just used (a
        fresh one keeps its age: a real client's first request is never slow to come)."""
        address = self._address.get(conn)
        if address is not None and conn in self._idle.used:
            self._mark(conn, address, self._clock(), used=True)

    def idle(self, conn: Evictable) -> None:
        """``conn`` has answered a request and serves none now."""
        address = self._address.get(conn)
        if address is not None:
            self._mark(conn, address, self._clock(), used=True)

    def closing(self, conn: Evictable) -> None:
        """``conn`` will serve nothing more: it is the first to make room."""
        address = self._address.get(conn)
        if address is not None:
            self._mark(conn, address, _CLOSING, used=False)

    def busy(self, conn: Evictable) -> None:
        """``conn`` is serving a request: it keeps its slot until :meth:`idle` or :meth:`release`."""
        address = self._address.get(conn)
        if address is not None:
            for scope in self._scopes(address):
                scope.discard(conn)

    def release(self, conn: Evictable) -> None:
        """``conn`` is gone; calling this again, or for a connection never admitted, does nothing."""
        address = self._address.pop(conn, None)
        if address is None:
            return
        for scope in self._scopes(address):
            scope.discard(conn)
        left = self._counts[address] - 1
        if left:
            self._counts[address] = left
        else:  # addresses come and go: keep no entry for one that has no connection
            del self._counts[address]
            del self._idle_by_address[address]

    def _scopes(self, address: str) -> tuple[_Idle, _Idle]:
        here = self._idle_by_address.get(address)
        if here is None:
            here = self._idle_by_address[address] = _Idle()
        return self._idle, here

    def _mark(self, conn: Evictable, address: str, since: float, *, used: bool) -> None:
        for scope in self._scopes(address):
            scope.discard(conn)
            if used:
                scope.used[conn] = since
            else:
                scope.fresh[conn] = since
                scope.fresh.move_to_end(conn, last=False)

    def _victim(self, scope: _Idle) -> Evictable | None:
        """The connection of ``scope`` to close for a newcomer, if any may be: the one idle longest
        of the oldest fresh one and the oldest used one beyond its address's ``keep_recent``."""
        fresh = next(iter(scope.fresh.items()), None)
        used = None
        kept: set[str] = set()
        for conn, since in scope.used.items():  # at most max_connections, only at a cap
            address = self._address[conn]
            if address in kept:
                continue
            # The first met of an address is its longest idle: kept if it is among the most recent.
            if len(self._idle_by_address[address].used) > self.keep_recent:
                used = (conn, since)
                break
            kept.add(address)
        if fresh is None or (used is not None and used[1] < fresh[1]):
            return None if used is None else used[0]
        return fresh[0]

    def _evict(self, scope: _Idle) -> bool:
        victim = self._victim(scope)
        if victim is None:
            return False
        self.release(victim)
        victim.evict()
        if self._on_evict is not None:
            self._on_evict()
        return True
