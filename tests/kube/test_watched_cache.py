"""The list + watch loop's backoff, driven by a scripted API (no HTTP): a failure after a watch that
held starts the backoff afresh, where it used to keep the delay it had grown to before."""

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
    (opens, stays open ``held_for`` seconds, then breaks), and after the script, stays open."""

    def __init__(self, steps: list[str], held_for: float, clock: list[float] | None = None) -> None:
        self._steps = iter(steps)
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
        step = next(self._steps, "open")
        if step == "fail":
            raise ConnectionRefusedError("refused")
        yield OPENED
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
