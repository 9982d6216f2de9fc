"""Waiting for the machine to settle before a measured burst, and saying how busy it was when the
burst began.

Why: the arms of ``bench/scale.py --webhook`` share two cores with everything the cluster runs, and
a burst that starts while the previous cluster's teardown, the 10,000 namespaces just created, or
the ServiceAccount controller's work behind them is still on the CPU measures that work, not the
webhook. The 1-minute load average is too slow for this (it lags by a minute either way), so the
busy share of the CPUs is read from ``/proc/stat`` over short windows instead: settled once a
window is below ``quiet`` of the machine, or once it stops falling (an idle cluster of 1,000 kwok
nodes is never idle: its heartbeats are work that every arm has alike), and never longer than
``max_s``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot: the first line of ``/proc/stat``, with idle
    and iowait counted as not busy."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])  # guest time is already inside user and nice
    return total - idle, total


def busy_share(window_s: float, times: Callable[[], tuple[int, int]] = cpu_times) -> float:
    """The share of all CPUs that was busy over the next ``window_s`` seconds, 0.0 to 1.0."""
    busy0, total0 = times()
    time.sleep(window_s)
    busy1, total1 = times()
    return (busy1 - busy0) / max(1, total1 - total0)


@dataclass(frozen=True)
class Settled:
    """How the wait ended: its length, the busy share of each window, and why it stopped."""

    waited_s: float
    shares: list[float]
    reason: str

    @property
    def busy_at_start(self) -> float:
        return self.shares[-1] if self.shares else 0.0


def settle(
    *,
    quiet: float = 0.35,
    window_s: float = 5.0,
    flat_windows: int = 3,
    flat_by: float = 0.03,
    max_s: float = 180.0,
    sample: Callable[[float], float] = busy_share,
) -> Settled:
    """Windows of ``window_s`` until one is below ``quiet``, or the last ``flat_windows`` did not
    fall by more than ``flat_by`` from the first of them (what runs now is the steady state), or
    ``max_s`` passed. ``sample`` reads one window (tests give their own)."""
    start = time.monotonic()
    shares: list[float] = []
    while True:
        shares.append(round(sample(window_s), 3))
        waited = round(time.monotonic() - start, 1)
        if shares[-1] < quiet:
            return Settled(waited, shares, "quiet")
        recent = shares[-flat_windows - 1 :]
        if len(recent) > flat_windows and recent[0] - min(recent[1:]) <= flat_by:
            return Settled(waited, shares, "steady")
        if waited >= max_s:
            return Settled(waited, shares, "max_s")
