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


def test_the_longest_idle_connection_makes_room(clock: Clock) -> None:
    table = slots(clock)
    a, b, c = Conn("a"), Conn("b"), Conn("c")
    for conn in (a, b, c):
        assert table.admit(conn, "10.0.0.1") is None
        clock.now += 1
    clock.now += 5
    table.idle(a)  # a answered a request just now: b is now the longest idle
    newcomer = Conn("new")
    assert table.admit(newcomer, "10.0.0.2") is None
    assert [b.evicted, a.evicted, c.evicted] == [True, False, False]
    assert len(table) == 3 and table.count("10.0.0.1") == 2


def test_recently_used_and_busy_connections_are_kept(clock: Clock) -> None:
    table = slots(clock)
    conns = [Conn(f"c{i}") for i in range(3)]
    for conn in conns:
        table.admit(conn, "10.0.0.1")
    clock.now += 1.9
    assert table.admit(Conn("early"), "10.0.0.2") == REFUSED_TOTAL  # none idle 2 s yet
    table.busy(conns[0])
    clock.now += 10
    assert table.admit(Conn("later"), "10.0.0.2") is None
    assert [c.evicted for c in conns] == [False, True, False]
    for conn in conns:
        table.busy(conn)
    assert table.admit(Conn("all-busy"), "10.0.0.2") == REFUSED_TOTAL


def test_closing_connections_go_first_whatever_their_age(clock: Clock) -> None:
    table = slots(clock)
    old, mid, young = Conn("old"), Conn("mid"), Conn("young")
    for conn in (old, mid, young):
        table.admit(conn, "10.0.0.1")
        clock.now += 5
    table.closing(young)
    assert table.admit(Conn("new"), "10.0.0.2") is None
    assert (old.evicted, mid.evicted, young.evicted) == (False, False, True)


def test_one_address_makes_room_from_its_own_connections(clock: Clock) -> None:
    table = slots(clock, total=4, per_address=2)
    other = Conn("other")
    table.admit(other, "10.0.0.9")
    clock.now += 60  # the longest idle of all, but not from the address over its share
    first, second = Conn("s1"), Conn("s2")
    table.admit(first, "10.0.0.1")
    table.admit(second, "10.0.0.1")
    clock.now += 5
    third = Conn("s3")
    assert table.admit(third, "10.0.0.1") is None
    assert (first.evicted, second.evicted, other.evicted) == (True, False, False)
    table.busy(second)
    table.busy(third)
    assert table.admit(Conn("s4"), "10.0.0.1") == REFUSED_ADDRESS
    assert table.count("10.0.0.1") == 2 and len(table) == 3


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
    assert table._count == {} and table._idle_by_address == {} and not table._idle


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
