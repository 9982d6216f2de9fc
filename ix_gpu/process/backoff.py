"""Exponential backoff with jitter, for the node agents' retries against the API server.

A node agent runs on every GPU node. When its writes fail for a cluster-wide reason (an RBAC or
admission policy that refuses them, an apiserver that is down), retrying on the health loop's
few-second timer would make a 5,000-node cluster send the apiserver a thousand or more requests a
second for as long as the fault lasts. So a failing write or read waits ``first`` seconds, then
twice as long each time, up to ``cap``; each wait is stretched by up to ``jitter`` of itself, so
that the nodes that failed together do not retry together. The stretch only lengthens a wait: at
the cap an agent sends at most one request per ``cap`` seconds, and the first retry still comes
within seconds. A success resets it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable


class Backoff:
    def __init__(
        self,
        first: float = 1.0,
        cap: float = 60.0,
        *,
        jitter: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if not 0 < first <= cap:
            raise ValueError(f"backoff needs 0 < first <= cap, got first={first} cap={cap}")
        self.first, self.cap, self.jitter = first, cap, jitter
        self._clock, self._rng = clock, rng
        self.failures = 0
        """Failures since the last success."""
        self.next_at: float | None = None
        """When the next attempt may be made (monotonic clock); None: now."""

    def ready(self) -> bool:
        """May an attempt be made now?"""
        return self.next_at is None or self._clock() >= self.next_at

    def remaining(self) -> float:
        """Seconds until the next attempt may be made (0: now)."""
        return 0.0 if self.next_at is None else max(0.0, self.next_at - self._clock())

    def failed(self) -> float:
        """Record a failure; the wait before the next attempt, in seconds."""
        base: float = min(self.cap, self.first * 2.0 ** min(self.failures, 62))
        delay = base * (1 + self.jitter * self._rng())
        self.failures += 1
        self.next_at = self._clock() + delay
        return delay

    def succeeded(self) -> None:
        self.failures = 0
        self.next_at = None
