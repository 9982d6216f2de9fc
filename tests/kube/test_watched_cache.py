"""The list + watch loop's backoff, driven by a scripted API (no HTTP): a failure after a watch that
held starts the backoff afresh, where it used to keep the delay it had grown to before; a watch
that the server accepts and ends at once, with nothing on it, is a failure that waits, and is not
heard (it used to re-watch as fast as the server answered, 415,825 watches in 2 s, and stay ready)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from ix_gpu.kube.list_watch import OPENED
from ix_gpu.kube.watched_cache import WatchedCache
from tests.support.waiting import wait_until


class ScriptedApi:
    """Lists nothing; each watch does the next step of ``steps``: ``fail`` at once, ``held``
    (opens, stays open ``held_for`` seconds, then breaks), ``ends`` (opens and ends at once with no
    event: HTTP 200 and an empty stream), and after the script, ``then`` (by default stays open)."""

    def __init__(
        self, steps: list[str], held_for: float, clock: list[float] | None = None, then: str = "open"
    ) -> None:
        self._steps = iter(steps)
        self._then = then
        self._held_for = held_for
        self._closed = threading.Event()
        self._clock = clock
        self.watch_times: list[float] = []
        self.lists = 0

    def list(self) -> tuple[list[Any], str]:
        self.lists += 1
        return [], "1"

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        self.watch_times.append(time.monotonic())
        step = next(self._steps, self._then)
        if step == "fail":
            raise ConnectionRefusedError("refused")
        yield OPENED
        if step == "ends":
            return
        if step == "held":
            time.sleep(self._held_for)
            raise ConnectionResetError("cut after holding")
        if step == "silent":  # says nothing for a long while (on the test's clock), then breaks
            assert self._clock is not None
            self._clock[0] += self._held_for
            raise ConnectionResetError("cut after a silence")
        self._closed.wait()

    def close(self) -> None:
        self._closed.set()


class Cache(WatchedCache):
    def _entry(self, obj: Any) -> tuple[Any, Any] | None:
        return None


def test_the_backoff_starts_afresh_after_a_watch_that_held() -> None:
    steps = ["fail"] * 5 + ["held", "fail"]
    api = ScriptedApi(steps, held_for=0.35)
    cache = Cache(api, backoff=(0.05, 5.0), held_after=0.3)
    cache.start()
    try:
        wait_until(lambda: len(api.watch_times) >= 8, "the script played", 10, interval=0.01)
    finally:
        cache.stop()
    gaps = [b - a for a, b in zip(api.watch_times, api.watch_times[1:], strict=False)]
    # Five failures grew the delay to 0.8 s (0.05 doubling, jitter ±20 %) ...
    assert gaps[4] >= 0.6, gaps
    # ... the watch that held for 0.35 s reset it: its break waits 0.05 s, not 1.6 s ...
    assert gaps[5] < 0.35 + 0.3, gaps
    # ... and the failure after it doubles from there.
    assert gaps[6] < 0.3, gaps


def test_a_cache_stale_past_half_its_bound_relists_instead_of_resuming_its_watch() -> None:
    """Resuming would leave the cache stale (its replica not ready) until the next bookmark, a
    minute later; past half of ``max_staleness`` the next attempt lists, which is heard at once."""
    now = [1000.0]
    api = ScriptedApi(["fail", "silent", "fail"], held_for=10.0, clock=now)
    cache = Cache(api, backoff=(0.01, 0.05), clock=lambda: now[0], max_staleness=8.0)
    cache.start()
    try:
        wait_until(lambda: len(api.watch_times) >= 4, "the script played", 10, interval=0.01)
    finally:
        cache.stop()
    # The first failure came fresh from the list: the watch resumed. After the 10 s silence the
    # cache was stale past 4 s: it listed again, and was ready at once.
    assert api.lists == 2, api.lists
    assert cache.ready()


def _most_watches(window: float, backoff: tuple[float, float]) -> int:
    """The most watches the backoff allows in ``window`` seconds: the first at once, then one per
    step, each step its delay (``backoff[0]`` doubling to ``backoff[1]``) at its shortest jitter."""
    count, elapsed, delay = 1, 0.0, backoff[0]
    while elapsed + delay * 0.8 <= window:
        elapsed += delay * 0.8
        count += 1
        delay = min(delay * 2, backoff[1])
    return count


def test_a_watch_that_ends_at_once_backs_off_and_is_not_heard() -> None:
    """HTTP 200 and an empty stream, again and again (a broken proxy, a misbehaving apiserver): each
    end waits its backoff step, and the cache, which hears nothing, grows stale by the second."""
    backoff, window = (0.02, 0.32), 2.0
    api = ScriptedApi([], held_for=0.0, then="ends")
    cache = Cache(api, backoff=backoff)
    cache.start()
    try:
        assert cache.wait_synced(5)
        time.sleep(window)
        watches, staleness = len(api.watch_times), cache.staleness_seconds()
        error = cache.last_error()
    finally:
        cache.stop()
    # At most one watch per backoff step (12 in the 2 s), where the old loop made tens of thousands.
    assert 3 <= watches <= _most_watches(window + 0.1, backoff), watches
    gaps = [b - a for a, b in zip(api.watch_times, api.watch_times[1:], strict=False)]
    steps = [min(backoff[0] * 2**i, backoff[1]) for i in range(len(gaps))]
    assert all(gap >= step * 0.8 * 0.95 for gap, step in zip(gaps, steps, strict=True)), gaps
    # Not heard: the list was the last thing heard, and the failure says what went wrong.
    assert staleness >= window - 0.1, staleness
    assert error is not None and "ended" in error, error
    assert api.lists == 1  # without a staleness bound nothing asks for a re-list


def test_a_watch_that_ends_at_once_turns_the_cache_stale_and_not_ready() -> None:
    """With ``max_staleness``, hearing nothing but the ends of empty watches turns the cache not
    ready once the bound passes. Lists still answer here, so the re-list that the first attempt
    past half the bound makes is heard, and makes it ready again: the cache is stale while its
    backoff step (0.4 s, then 0.8 s) outlasts the rest of the bound (0.5 s), as 30 s steps do a
    bound under a minute; with 300 s the re-lists keep it within about 180 s, and ready."""
    api = ScriptedApi([], held_for=0.0, then="ends")
    cache = Cache(api, backoff=(0.05, 0.8), max_staleness=0.5)
    cache.start()
    try:
        assert cache.wait_synced(5) and cache.ready()
        wait_until(lambda: not cache.ready(), "stale", 5, interval=0.01)
        status = cache.status()
        assert cache.stale() and status["stale"] is True and status["ready"] is False, status
        assert status["stalenessSeconds"] > 0.5 and status["synced"] is True, status
        assert 1 <= len(api.watch_times) <= 6, len(api.watch_times)
        wait_until(lambda: api.lists >= 2 and cache.ready(), "re-listed", 5, interval=0.01)
    finally:
        cache.stop()
