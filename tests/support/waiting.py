"""Bounded polling: the one loop every suite uses to wait for a condition.

``wait_until`` returns the first truthy value of ``check()``; it fails with ``WaitTimeout`` (an
``AssertionError``, so a test reads as failed, not errored, with what it waited for and the last
value seen) or, when given the ``process`` the condition depends on, with ``ProcessExited`` as soon
as that process is gone, quoting its log. ``wait_until_async`` is the same for asyncio tests; it can
be woken by an ``asyncio.Event`` instead of sleeping out the interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TypeVar

from tests.support.processes import Process

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The condition did not hold within the timeout."""


class ProcessExited(RuntimeError):
    """The process that the condition depends on exited before it held."""


def _message(what: str, timeout: float, last: object, details: Callable[[], str] | None) -> str:
    message = f"timed out after {timeout:g}s waiting for {what}"
    if last is not None and not isinstance(last, bool):
        message += f"; last: {last!r}"
    if details is not None:
        message += f"; {details()}"
    return message


def _check_process(process: Process | None, what: str, details: Callable[[], str] | None) -> None:
    if process is not None and not process.alive():
        extra = f"; {details()}" if details is not None else ""
        raise ProcessExited(
            f"{process.name} exited with {process.returncode} while waiting for {what}{extra}; "
            f"log {process.log}:\n{process.tail()}"
        )


def wait_until(
    check: Callable[[], T | None],
    what: str,
    timeout: float = 30.0,
    *,
    interval: float = 0.1,
    process: Process | None = None,
    details: Callable[[], str] | None = None,
) -> T:
    """Call ``check`` every ``interval`` seconds until it returns something truthy, and return that.

    ``what`` names the condition in the failure; ``details()`` adds state worth seeing then. With
    ``process``, fail as soon as it has exited (its log's tail is in the message)."""
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last:
            return last
        _check_process(process, what, details)
        if time.monotonic() > deadline:
            if process is not None:
                raise WaitTimeout(
                    _message(what, timeout, last, details) + f"; log {process.log}:\n{process.tail()}"
                )
            raise WaitTimeout(_message(what, timeout, last, details))
        time.sleep(interval)


async def wait_until_async(
    check: Callable[[], T | None],
    what: str,
    timeout: float = 5.0,
    *,
    interval: float = 0.1,
    wake: asyncio.Event | None = None,
    details: Callable[[], str] | None = None,
) -> T:
    """``wait_until`` for a running event loop: between checks, wait for ``wake`` to be set (at most
    ``interval`` seconds), so the check runs as soon as whatever it watches has changed."""
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last:
            return last
        left = deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(_message(what, timeout, last, details))
        if wake is None:
            await asyncio.sleep(min(left, interval))
        else:
            wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=min(left, interval))
