"""A read of the API server repeated on an interval that keeps its last answer when it fails.

The node agents read their node and the DRA driver's ResourceSlices this way. What a node offers
must change only on an answer: an apiserver restart, or a rolling upgrade that lands on a read,
must not empty every GPU node of a cluster at once. So a read that fails (any error of the API
client, which are all ``OSError``; ``ValueError`` for an answer of the wrong shape) leaves
:attr:`PeriodicRead.value` as it was, is logged once per distinct error, reported to ``on_error``
(a metric), and retried sooner than the interval: after 1 s, doubling up to half the interval,
with jitter (:class:`~ix_gpu.runtime.backoff.Backoff`). Before the first answer the value is None,
and the caller decides what that means.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from ix_gpu.config.text import one_line
from ix_gpu.runtime.backoff import Backoff

T = TypeVar("T")


class PeriodicRead(Generic[T]):
    def __init__(
        self,
        what: str,
        read: Callable[[], T],
        interval: float,
        *,
        logger: logging.Logger,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        """``what``: the thing read, for the log (``node n1``). ``read``: one blocking read, which
        raises ``OSError`` or ``ValueError`` when it gets no answer."""
        self.what = what
        self._read = read
        self.interval = interval
        self.logger = logger
        self.on_error = on_error
        self.value: T | None = None
        """The last answer; None before the first."""
        self.error: str | None = None
        """The last read's error while reads fail; None once one succeeds."""
        self.failing_since: float | None = None
        self._read_at: float | None = None
        first = min(1.0, interval)
        self._retry = Backoff(first=first, cap=max(first, interval / 2))

    def get(self) -> T | None:
        """The value, read again when the interval (or, while reads fail, the backoff) is over."""
        now = time.monotonic()
        if self.error is not None:
            if not self._retry.ready():
                return self.value
        elif self._read_at is not None and now - self._read_at < self.interval:
            return self.value
        self._read_at = now
        try:
            value = self._read()
        except (OSError, ValueError) as exc:
            message = one_line(exc, 300)
            delay = self._retry.failed()
            if message != self.error:
                self.logger.error(
                    "cannot read %s (keeping the last answer%s; retrying in %.0fs): %s",
                    self.what,
                    "" if self.value is not None else ", none yet",
                    delay,
                    message,
                )
            if self.error is None:
                self.failing_since = now
            self.error = message
            if self.on_error is not None:
                self.on_error(message)
            return self.value
        if self.error is not None:
            failed_for = now - (self.failing_since or now)
            self.logger.info("read %s again (it failed for %.0fs)", self.what, failed_for)
        self._retry.succeeded()
        self.error, self.failing_since = None, None
        self.value = value
        return value

    def problem(self) -> str | None:
        """``cannot read <what> for Ns: <error>`` while reads fail."""
        if self.error is None:
            return None
        failing_for = time.monotonic() - (self.failing_since or 0)
        return f"cannot read {self.what} for {failing_for:.0f}s: {self.error}"
