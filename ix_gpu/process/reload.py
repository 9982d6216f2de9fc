"""Reload by content digest, keeping the last good value: one mechanism for every watched file.

Files are polled and compared by content digest rather than watched with inotify or by mtime:
Kubernetes updates Secret and ConfigMap volumes by swapping a ``..data`` symlink, which sends no
event for the file path we hold, and ``subPath`` mounts never change at all. Re-reading a few small
files every few seconds is cheap and catches every way a file can change.

A bad new content never replaces the good value in use. Its error is kept in ``last_error`` (for
``/readyz`` and health checks), reported once per distinct content (not once per poll), and
cleared when the file returns to the content in use. Any exception the parser raises counts as
"bad content", not as a crash: a config of random bytes or a YAML nested 5,000 deep must show up
in ``last_error`` like a misspelled key.

:meth:`LastGoodFiles.poll` reads and parses, so it blocks: event-loop code calls it through
``asyncio.to_thread``. One poller at a time per instance.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

from ix_gpu.config.input_files import CONFIG_MAX_BYTES, ConfigError, read_capped
from ix_gpu.config.text import one_line
from ix_gpu.process.outcomes import ERROR, SUCCESS

T = TypeVar("T")

DEFAULT_MAX_BYTES = CONFIG_MAX_BYTES
"""1 MiB: what a ConfigMap can hold. A larger file is refused unread."""


def content_digest(*parts: bytes) -> str:
    """SHA-256 over length-prefixed parts, so (a, bc) and (ab, c) differ."""
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(len(part).to_bytes(8, "big"))
        hasher.update(part)
    return hasher.hexdigest()


class LastGoodFiles(Generic[T]):
    """A value parsed from one or more files, replaced only by a good parse of new content.

    ``parse`` gets the files' contents in ``paths`` order and returns the value or raises (any
    exception: its message becomes the error). ``record`` is told ``SUCCESS`` or ``ERROR``
    (:mod:`ix_gpu.process.outcomes`) for each attempted load, for a metric.
    """

    def __init__(
        self,
        what: str,
        paths: Sequence[Path],
        parse: Callable[[list[bytes]], T],
        *,
        loaded: list[bytes] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        record: Callable[[str], None] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.what = what
        self.paths = tuple(paths)
        self._parse = parse
        self._max_bytes = max_bytes
        self._record = record
        self._log = logger
        self.loaded_digest = content_digest(*loaded) if loaded is not None else ""
        """Digest of the content the value in use came from ("" before the first load)."""
        self._seen = self.loaded_digest
        self.last_error: str | None = None
        """Why the files' current content is not in use; None when it is."""

    def poll(self) -> T | None:
        """Read the files; the newly parsed value when their content changed and is good, else None."""
        try:
            contents = [read_capped(path, self._max_bytes) for path in self.paths]
        except ConfigError as exc:
            # Unreadable (a ConfigMap mid-swap can briefly lack the file; the next poll sees the
            # new one) or too large (refused unread): reported once per outage, not once per poll.
            if str(exc) != self.last_error:
                self._fail(str(exc))
            self._seen = ""
            return None
        digest = content_digest(*contents)
        if digest == self._seen:
            return None
        self._seen = digest
        if digest == self.loaded_digest:
            # Back to the content in use (e.g. a bad edit reverted): nothing to load.
            self.last_error = None
            return None
        if any(not content.strip() for content in contents):
            # An empty file would parse as "all defaults": far more likely a truncated write.
            self._fail(f"{self.paths[0]}: file is empty")
            return None
        try:
            value = self._parse(contents)
        except RecursionError:
            self._fail(f"{self.paths[0]}: nested too deeply")
            return None
        except Exception as exc:
            self._fail(one_line(exc))
            return None
        self.loaded_digest = digest
        self.last_error = None
        if self._record is not None:
            self._record(SUCCESS)
        return value

    def _fail(self, message: str) -> None:
        self.last_error = message
        if self._record is not None:
            self._record(ERROR)
        if self._log is not None:
            self._log.error(
                f"{self.what} reload failed; keeping the last good one",
                extra={"fields": {"error": message}},
            )
