"""The node agents' retry schedule (process/backoff.py) and their loop supervisor
(process/supervision.py), on a clock and loops the tests drive."""

from __future__ import annotations

import asyncio
import logging

import pytest

from ix_gpu.process.backoff import Backoff
from ix_gpu.process.supervision import Supervised, supervise


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("rng", [0.0, 0.5, 0.999])
def test_waits_double_from_the_first_to_the_cap_and_jitter_only_lengthens_them(rng: float) -> None:
    clock = Clock()
    backoff = Backoff(first=1.0, cap=60.0, jitter=0.25, clock=clock, rng=lambda: rng)
    assert backoff.ready() and backoff.remaining() == 0
    waits = [backoff.failed() for _ in range(10)]
    nominal = [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]
    for wait, base in zip(waits, nominal, strict=True):
        assert base <= wait <= base * 1.25
        assert wait == pytest.approx(base * (1 + 0.25 * rng))
    assert not backoff.ready() and backoff.remaining() == pytest.approx(waits[-1])
    clock.now += waits[-1]
    assert backoff.ready()
    backoff.succeeded()
    assert backoff.failures == 0 and backoff.failed() == pytest.approx(1 + 0.25 * rng)


def test_a_steady_failure_is_at_most_one_attempt_a_minute_after_the_first_minute() -> None:
    """What an agent's loop does with it: it ticks every 5 s and attempts whenever allowed."""
    clock = Clock()
    backoff = Backoff(first=1.0, cap=60.0, clock=clock)
    attempts = []
    start = clock.now
    while clock.now - start < 600:
        if backoff.ready():
            attempts.append(clock.now - start)
            backoff.failed()
        clock.now += 5
    first_retry = attempts[1] - attempts[0]
    assert first_retry <= 5, "the first retry comes within seconds"
    per_minute = [sum(1 for t in attempts if m * 60 <= t < (m + 1) * 60) for m in range(10)]
    assert all(n <= 1 for n in per_minute[2:]), per_minute
    assert max(per_minute[1:]) <= 2, per_minute


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="0 < first <= cap"):
        Backoff(first=10, cap=1)


def test_a_loop_that_raises_is_logged_counted_and_restarted_and_stop_ends_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs = 0
    crashed: list[str] = []

    async def scenario() -> Supervised:
        stop = asyncio.Event()
        state = Supervised("health loop", Backoff(first=0.01, cap=0.02))

        async def loop() -> None:
            nonlocal runs
            runs += 1
            if runs <= 2:
                raise KeyError("stored slice without metadata")
            await stop.wait()

        task = asyncio.create_task(supervise(loop, state, stop, on_crash=crashed.append))
        while runs < 3:
            await asyncio.sleep(0.005)
        assert not task.done()
        stop.set()
        await asyncio.wait_for(task, 2)
        return state

    with caplog.at_level(logging.ERROR, logger="ix_gpu.process.supervision"):
        state = asyncio.run(scenario())
    assert runs == 3
    assert state.crashes == 2 and crashed == ["health loop", "health loop"]
    assert state.last_error == "KeyError: 'stored slice without metadata'"
    assert not state.restarting
    failures = [r for r in caplog.records if "the health loop failed" in r.getMessage()]
    assert len(failures) == 2
    assert all(r.exc_info is not None for r in failures), "logged with its traceback"


def test_cancelling_the_supervisor_cancels_the_loop() -> None:
    async def scenario() -> bool:
        stop = asyncio.Event()
        cancelled = asyncio.Event()

        async def loop() -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        task = asyncio.create_task(supervise(loop, Supervised("loop"), stop))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return cancelled.is_set()

    assert asyncio.run(scenario())
