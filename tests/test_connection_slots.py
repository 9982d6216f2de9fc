"""The connection-cap policy both HTTP servers share (:mod:`ix_gpu.runtime.connection_slots`), on a
fake clock: at a cap the longest-idle connection makes room; busy and recently used connections
keep theirs; one address cannot hold more than its share; closing connections go first."""

from __future__ import annotations

import pytest

from ix_gpu.runtime.connection_slots import REFUSED_ADDRESS, REFUSED_TOTAL, ConnectionSlots


class Conn:
    def __init__(self, name: str) -> None:
        self.name = name
        self.evicted = False

    def evict(self) -> None:
        self.evicted = True

    def __repr__(self) -> str:
        return self.name


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def slots(clock: Clock, total: int = 3, per_address: int = 3, evict_after: float = 2.0) -> ConnectionSlots:
    return ConnectionSlots(total, per_address, evict_after, clock=clock)


def served(table: ConnectionSlots, conn: Conn, address: str = "10.0.0.1") -> Conn:
    """Admit ``conn`` and let it answer one request: a used keep-alive connection, idle now."""
    assert table.admit(conn, address) is None
    table.busy(conn)
    table.idle(conn)
    return conn


def test_the_longest_idle_connection_makes_room(clock: Clock) -> None:
    table = slots(clock)
    a, b, c = Conn("a"), Conn("b"), Conn("c")
    for conn in (a, b, c):
        served(table, conn)
        clock.now += 1
    clock.now += 5
    table.busy(a)
    table.idle(a)  # a answered a request just now: b is now the longest idle
    assert table.admit(Conn("new"), "10.0.0.2") is None
    assert [b.evicted, a.evicted, c.evicted] == [True, False, False]
    assert len(table) == 3 and table.count("10.0.0.1") == 2


def test_recently_used_and_busy_connections_are_kept(clock: Clock) -> None:
    table = slots(clock)
    conns = [served(table, Conn(f"c{i}")) for i in range(3)]
    clock.now += 1.9
    assert table.admit(Conn("early"), "10.0.0.2") == REFUSED_TOTAL  # none idle 2 s yet
    table.busy(conns[0])
    clock.now += 10
    later = Conn("later")
    assert table.admit(later, "10.0.0.2") is None
    assert [c.evicted for c in conns] == [False, True, False]
    for conn in (*conns, later):
        table.busy(conn)
    assert table.admit(Conn("all-busy"), "10.0.0.2") == REFUSED_TOTAL


def test_a_request_arriving_renews_a_used_connection_only(clock: Clock) -> None:
    """A used connection whose next request is arriving is as good as just used; a fresh one whose
    first request trickles in stays as evictable as it was."""
    table = slots(clock, total=2)
    kept = served(table, Conn("kept"))
    clock.now += 10
    table.active(kept)
    trickler = Conn("trickler")
    table.admit(trickler, "10.0.0.1")
    table.active(trickler)
    assert table.admit(Conn("new"), "10.0.0.2") is None
    assert (kept.evicted, trickler.evicted) == (False, True)


def test_connections_without_a_request_rank_as_idle_longer(clock: Clock) -> None:
    """A connection that never sent a request may make room at once, before one used a moment
    ago; it counts as idle ``evict_after`` longer than it is, so a long-idle used one goes first."""
    table = slots(clock)
    used = [served(table, Conn(f"u{i}")) for i in range(2)]
    clock.now += 1
    silent = Conn("silent")
    table.admit(silent, "10.0.0.1")
    assert table.admit(Conn("new"), "10.0.0.2") is None
    assert silent.evicted and not any(c.evicted for c in used)

    table = slots(clock)
    long_idle = served(table, Conn("long-idle"))
    clock.now += 10
    silent = Conn("silent-1s")
    table.admit(silent, "10.0.0.1")
    table.admit(Conn("third"), "10.0.0.1")
    clock.now += 1
    assert table.admit(Conn("new"), "10.0.0.2") is None
    assert long_idle.evicted and not silent.evicted


def test_closing_connections_go_first_whatever_their_age(clock: Clock) -> None:
    table = slots(clock)
    old, mid, young = Conn("old"), Conn("mid"), Conn("young")
    for conn in (old, mid, young):
        served(table, conn)
        clock.now += 5
    table.closing(young)
    assert table.admit(Conn("new"), "10.0.0.2") is None
    assert (old.evicted, mid.evicted, young.evicted) == (False, False, True)


def test_one_address_makes_room_from_its_own_connections(clock: Clock) -> None:
    table = slots(clock, total=4, per_address=2)
    other = served(table, Conn("other"), "10.0.0.9")
    clock.now += 60  # the longest idle of all, but not from the address over its share
    first = served(table, Conn("s1"))
    second = served(table, Conn("s2"))
    clock.now += 5
    third = Conn("s3")
    assert table.admit(third, "10.0.0.1") is None
    assert (first.evicted, second.evicted, other.evicted) == (True, False, False)
    table.busy(second)
    table.busy(third)
    assert table.admit(Conn("s4"), "10.0.0.1") == REFUSED_ADDRESS
    assert table.count("10.0.0.1") == 2 and len(table) == 3
    # The server full too, with nothing idle anywhere: named after the total cap.
    table.admit(Conn("o2"), "10.0.0.8")
    table.busy(other)
    assert table.admit(Conn("o3"), "10.0.0.7") is None  # o2 (never used) made room
    for conn in list(table._address):
        table.busy(conn)
    assert table.admit(Conn("s5"), "10.0.0.1") == REFUSED_TOTAL


def test_per_address_share_is_at_most_the_total(clock: Clock) -> None:
    assert ConnectionSlots(4, 64, 0.0).max_per_address == 4


def test_release_is_idempotent_and_forgets_the_address(clock: Clock) -> None:
    table = slots(clock, evict_after=0.0)
    conn = Conn("c")
    table.admit(conn, "10.0.0.1")
    table.release(conn)
    table.release(conn)
    table.release(Conn("never-admitted"))
    table.idle(conn)
    table.busy(conn)
    table.closing(conn)
    assert len(table) == 0 and table.count("10.0.0.1") == 0
    assert table._counts == {} and table._idle_by_address == {}
    assert not table._idle.fresh and not table._idle.used


def test_evicted_connection_leaves_at_once(clock: Clock) -> None:
    """The slot is the newcomer's before the victim's close completes (a TLS shutdown may take
    seconds); the victim's later release changes nothing."""
    evictions: list[str] = []
    table = ConnectionSlots(1, 1, 0.0, on_evict=lambda: evictions.append("x"), clock=clock)
    victim, newcomer = Conn("v"), Conn("n")
    table.admit(victim, "10.0.0.1")
    assert table.admit(newcomer, "10.0.0.1") is None
    table.release(victim)
    assert len(table) == 1 and table.count("10.0.0.1") == 1 and evictions == ["x"]
