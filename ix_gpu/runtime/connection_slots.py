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

Two refinements:

- **Per client address.** One address may hold at most ``max_per_address`` slots; past that its
  own longest-idle connection makes room. One squatting pod then cannot fill the server even with
  busy connections, whatever the total cap is.
- **Recently used connections are kept.** A connection is evictable only once it has been idle for
  ``evict_after`` seconds. A keep-alive client (Go's transport, the apiserver's) reuses its most
  recently used connection first, so a connection idle a moment ago is the one likely to carry the
  next request, and closing it while that request is on its way fails the request; one idle for
  seconds is a spare the client rarely picks. Servers that answer one request per connection have
  no such race and use 0.

"Idle" means no request is being served: from the connection's start, or from the end of its last
answer, or from the first byte of a request whose headers are not complete yet (a client trickling
headers holds nothing the server is working on; the header deadline ends it anyway). A connection
that is closing (its answer said ``Connection: close``, a TLS shutdown waiting on the client) is
evicted first, whatever its age.

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
    def evict(self) -> None:
        """Close the connection now, without an answer (it is idle: nobody is waiting for one)."""


class ConnectionSlots:
    """The connections of one server: how many, from which address, which are idle since when."""

    def __init__(
        self,
        max_connections: int,
        max_per_address: int,
        evict_after: float,
        *,
        on_evict: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_connections = max_connections
        self.max_per_address = min(max_per_address, max_connections)
        self.evict_after = evict_after
        self._on_evict = on_evict
        self._clock = clock
        self._address: dict[Evictable, str] = {}
        self._count: dict[str, int] = {}
        # Insertion order is idle order: the first entry has been idle longest (or is closing).
        self._idle: OrderedDict[Evictable, float] = OrderedDict()
        self._idle_by_address: dict[str, OrderedDict[Evictable, float]] = {}

    def __len__(self) -> int:
        return len(self._address)

    def count(self, address: str) -> int:
        return self._count.get(address, 0)

    def admit(self, conn: Evictable, address: str) -> str | None:
        """Give ``conn`` (from ``address``) a slot, evicting an idle connection if that is what it
        takes; None when admitted (as idle), else the refusal reason (the caller closes ``conn``)."""
        if self._count.get(address, 0) >= self.max_per_address and not self._evict_oldest(
            self._idle_by_address.get(address)
        ):
            return REFUSED_ADDRESS
        if len(self._address) >= self.max_connections and not self._evict_oldest(self._idle):
            return REFUSED_TOTAL
        self._address[conn] = address
        self._count[address] = self._count.get(address, 0) + 1
        self.idle(conn)
        return None

    def idle(self, conn: Evictable) -> None:
        """``conn`` is serving no request from now on (or a request of its has just begun to arrive)."""
        self._mark(conn, self._clock(), last=True)

    def closing(self, conn: Evictable) -> None:
        """``conn`` will serve nothing more: it is the first to make room."""
        self._mark(conn, _CLOSING, last=False)

    def busy(self, conn: Evictable) -> None:
        """``conn`` is serving a request: it keeps its slot until :meth:`idle` or :meth:`release`."""
        address = self._address.get(conn)
        if address is not None:
            self._idle.pop(conn, None)
            self._idle_by_address[address].pop(conn, None)

    def release(self, conn: Evictable) -> None:
        """``conn`` is gone; calling this again, or for a connection never admitted, does nothing."""
        address = self._address.pop(conn, None)
        if address is None:
            return
        self._idle.pop(conn, None)
        idle_here = self._idle_by_address[address]
        idle_here.pop(conn, None)
        left = self._count[address] - 1
        if left:
            self._count[address] = left
        else:  # addresses come and go: keep no entry for one that has no connection
            del self._count[address]
            del self._idle_by_address[address]

    def _mark(self, conn: Evictable, since: float, *, last: bool) -> None:
        address = self._address.get(conn)
        if address is None:
            return
        for idle in (self._idle, self._idle_by_address.setdefault(address, OrderedDict())):
            idle[conn] = since
            idle.move_to_end(conn, last=last)

    def _evict_oldest(self, idle: OrderedDict[Evictable, float] | None) -> bool:
        """Close the longest-idle connection of ``idle`` if it has been idle long enough."""
        if not idle:
            return False
        victim, since = next(iter(idle.items()))
        if self._clock() - since < self.evict_after:
            return False
        self.release(victim)
        victim.evict()
        if self._on_evict is not None:
            self._on_evict()
        return True
