"""Long-lived tasks that never end unseen.

A node agent's background loops (health, registration) are what keep a node's GPUs advertised and
its slice current. A loop that dies of an exception nobody expected would stop all of that without
a word: asyncio keeps a task's exception until someone awaits the task, and the awaiting is often
only at shutdown. :func:`supervise` runs such a loop and, when it raises, logs the traceback,
counts it, waits (:class:`~ix_gpu.process.backoff.Backoff`, reset once the loop has run a while)
and starts it again. The process keeps serving what it can meanwhile; shutdown is not disturbed
(the supervisor itself ends only when it is cancelled or the loop returns).

The rule, for both agents: **restart, never exit**. An unexpected error in one loop is no reason to
drop the kubelet's connection (the device plugin's devices would turn Unhealthy on every node at
once for a fault that may be one bad answer from the apiserver); the crash counter and the log
make it visible, and ``/healthz`` reports a loop that is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from ix_gpu.process.backoff import Backoff

log = logging.getLogger(__name__)

STABLE_AFTER = 60.0
"""A loop that ran this long before it failed starts again at the first backoff step."""


class Supervised:
    """One supervised loop's state: how often it failed, and whether it is waiting to restart."""

    def __init__(self, name: str, backoff: Backoff | None = None) -> None:
        self.name = name
        self.backoff = backoff or Backoff(first=1.0, cap=30.0)
        self.crashes = 0
        self.last_error: str | None = None
        self.restarting = False
        """True between a failure and the loop's restart."""


async def supervise(
    loop: Callable[[], Awaitable[None]],
    state: Supervised,
    stop: asyncio.Event,
    *,
    on_crash: Callable[[str], None] | None = None,
) -> None:
    """Run ``loop()`` until it returns or ``stop`` is set; restart it after each failure."""
    while not stop.is_set():
        started = time.monotonic()
        try:
            await loop()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if time.monotonic() - started >= STABLE_AFTER:
                state.backoff.succeeded()
            state.crashes += 1
            state.last_error = f"{type(exc).__name__}: {exc}"[:300]
            delay = state.backoff.failed()
            log.exception(
                "the %s failed (%d time%s so far); restarting it in %.1fs",
                state.name,
                state.crashes,
                "" if state.crashes == 1 else "s",
                delay,
            )
            if on_crash is not None:
                on_crash(state.name)
            state.restarting = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
            state.restarting = False
