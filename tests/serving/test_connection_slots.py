"""The connection-cap policy both HTTP servers share (:mod:`ix_gpu.serving.connection_slots`), on a
fake clock: at a cap the longest-idle connection makes room; busy connections and each address's
most recently used idle ones keep theirs; one address cannot hold more than its share; closing
connections go first, then those that never sent a request."""

from __future__ import annotations

import pytest

from ix_gpu.serving.connection_slots import REFUSED_ADDRESS, REFUSED_TOTAL, ConnectionSlots


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
        self.now += 0.001  # every event a moment after the last
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def slots(clock: Clock, total: int = 3, per_address: int = 3, keep_recent: int = 1) -> ConnectionSlots:
    return ConnectionSlots(total, per_address, keep_recent, clock=clock)


def served(table: ConnectionSlots, conn: Conn, address: str = "10.0.0.1") -> Conn:
    """Admit ``conn`` and let it answer one request: a used keep-alive connection, idle now."""
    assert table.admit(conn, address) is None
    table.busy(conn)
    table.idle(conn)
    return conn


def test_the_longest_idle_connection_makes_room(clock: Clock) -> None:
    table = slots(clock)
    a, b, c = (served(table, Conn(name)) for name in "abc")
    table.busy(a)
    table.idle(a)  # a answered a request just now: b is now the longest idle
    assert table.admit(Conn("new"), "10.0.0.2") is None
    assert [b.evicted, a.evicted, c.evicted] == [True, False, False]
    assert len(table) == 3 and table.count("10.0.0.1") == 2


def test_each_address_keeps_its_most_recently_used_idle_connections(clock: Clock) -> None:
    """However many newcomers arrive, an address's last ``keep_recent`` idle connections stay:
    they are the ones its next requests travel on."""
    table = slots(clock, total=4, keep_recent=2)
    a, b, c = (served(table, Conn(name)) for name in "abc")
    newcomers = [Conn(f"n{i}") for i in range(3)]
    assert table.admit(newcomers[0], "10.0.0.2") is None  # a free slot
    for conn in newcomers[:1]:
        table.busy(conn)
    assert table.admit(newcomers[1], "10.0.0.2") is None  # a made room; b, c are the last two
    table.busy(newcomers[1])
    assert table.admit(newcomers[2], "10.0.0.2") == REFUSED_TOTAL
    assert (a.evicted, b.evicted, c.evicted) == (True, False, False)


def test_busy_connections_are_kept(clock: Clock) -> None:
    table = slots(clock, keep_recent=0)
    conns = [served(table, Conn(f"c{i}")) for i in range(3)]
    table.busy(conns[0])
    later = Conn("later")
    assert table.admit(later, "10.0.0.2") is None
    assert [c.evicted for c in conns] == [False, True, False]
    for conn in (*conns, later):
        table.busy(conn)
    assert table.admit(Conn("all-busy"), "10.0.0.2") == REFUSED_TOTAL


def test_a_request_arriving_renews_a_used_connection_only(clock: Clock) -> None:
    """A used connection whose next request is arriving is as good as just used; a fresh one whose
    first request trickles in keeps its age."""
    table = slots(clock, total=3, keep_recent=0)
    kept = served(table, Conn("kept"))
    trickler = Conn("trickler")
    table.admit(trickler, "10.0.0.1")
    table.active(kept)
    table.active(trickler)
    table.admit(Conn("third"), "10.0.0.3")
    assert table.admit(Conn("new"), "10.0.0.2") is None
    assert (kept.evicted, trickler.evicted) == (False, True)


@pytest.mark.parametrize("older", ["used", "silent"])
def test_silent_and_used_connections_rank_by_idle_time(clock: Clock, older: str) -> None:
    """A connection that never sent a request and one idle after its answer: the one idle longer
    makes room, whichever it is."""
    table = slots(clock, keep_recent=0)
    silent = Conn("silent")
    if older == "silent":
        table.admit(silent, "10.0.0.1")
        used = served(table, Conn("used"))
    else:
        used = served(table, Conn("used"))
        table.admit(silent, "10.0.0.1")
    table.admit(Conn("busy"), "10.0.0.3")
    table.busy(next(c for c in table._address if repr(c) == "busy"))
    assert table.admit(Conn("new"), "10.0.0.2") is None
    assert (used.evicted, silent.evicted) == (older == "used", older == "silent")


def test_closing_connections_go_first_whatever_their_age(clock: Clock) -> None:
    table = slots(clock, keep_recent=0)
    old, mid, young = (served(table, Conn(name)) for name in ("old", "mid", "young"))
    table.closing(young)
    assert table.admit(Conn("new"), "10.0.0.2") is None
    assert (old.evicted, mid.evicted, young.evicted) == (False, False, True)


def test_one_address_makes_room_from_its_own_connections(clock: Clock) -> None:
    table = slots(clock, total=4, per_address=2, keep_recent=0)
    other = served(table, Conn("other"), "10.0.0.9")  # the longest idle of all, but elsewhere
    first = served(table, Conn("s1"))
    second = served(table, Conn("s2"))
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


def test_the_total_cap_skips_addresses_with_only_kept_connections(clock: Clock) -> None:
    """The server's longest-idle connection is kept when it is among its address's most recent; the
    next one, from an address with more idle connections, makes room."""
    table = slots(clock, total=4, keep_recent=1)
    lone = served(table, Conn("lone"), "10.0.0.9")
    a1, a2 = served(table, Conn("a1")), served(table, Conn("a2"))
    table.admit(Conn("busy"), "10.0.0.3")
    table.busy(next(c for c in table._address if repr(c) == "busy"))
    assert table.admit(Conn("new"), "10.0.0.2") is None
    assert (lone.evicted, a1.evicted, a2.evicted) == (False, True, False)


def test_per_address_share_is_at_most_the_total() -> None:
    assert ConnectionSlots(4, 64, 0).max_per_address == 4


def test_release_is_idempotent_and_forgets_the_address(clock: Clock) -> None:
    table = slots(clock)
    conn = Conn("c")
    table.admit(conn, "10.0.0.1")
    table.release(conn)
    table.release(conn)
    table.release(Conn("never-admitted"))
    table.idle(conn)
    table.busy(conn)
    table.closing(conn)
    table.active(conn)
    assert len(table) == 0 and table.count("10.0.0.1") == 0
    assert table._counts == {} and table._idle_by_address == {}
    assert not table._idle.fresh and not table._idle.used


def test_evicted_connection_leaves_at_once(clock: Clock) -> None:
    """The slot is the newcomer's before the victim's close completes (a TLS shutdown may take
    seconds); the victim's later release changes nothing."""
    evictions: list[str] = []
    table = ConnectionSlots(1, 1, 0, on_evict=lambda: evictions.append("x"), clock=clock)
    victim, newcomer = Conn("v"), Conn("n")
    table.admit(victim, "10.0.0.1")
    assert table.admit(newcomer, "10.0.0.1") is None
    table.release(victim)
    assert len(table) == 1 and table.count("10.0.0.1") == 1 and evictions == ["x"]
