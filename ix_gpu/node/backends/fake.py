"""The ``fake`` backend: chips described by a YAML file, re-read whenever its content changes.

It exists for tests, demos and the real-kubelet harness: flipping ``health`` in the file is how a
test makes a chip fail, and ``libraryError`` is how it makes the "library" fail mid-run. A chip's
``reset:`` says how a reset of it goes (fails, is slow, comes back with another UUID); every reset
that succeeds is appended to ``<file>.resets`` (one line, the chips' UUIDs), which a test outside the
process reads. The file is
compared by content digest rather than mtime or inotify, because a ConfigMap-mounted file changes by
a symlink swap that neither reliably reports.

The backend knows devices, not processes: how the file is watched and where it is validated (a
short-lived child, because the schema is pydantic) is the node layer's business
(:func:`ix_gpu.node.fake_devices_file.fake_backend`), handed in as a :class:`DevicesFile`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from ix_gpu.devicemodel.vendors import VENDORS, Vendor
from ix_gpu.node.backends.base import BackendError, Chip
from ix_gpu.node.backends.fake_scan import FakeReset, FakeScan


class DevicesFile(Protocol):
    """The devices file as the backend reads it: the newest good scan, and why the file's current
    content is not in use (None when it is)."""

    @property
    def paths(self) -> tuple[Path, ...]: ...

    last_error: str | None

    def poll(self) -> FakeScan | None:
        """The newly scanned content when the file changed and is good, else None."""


class FakeBackend:
    """Backend from a file. A file that becomes unreadable or invalid mid-run is reported as a
    backend failure (all chips Unhealthy, reason logged), exactly like a library that errors."""

    name = "fake"

    def __init__(self, devices: DevicesFile) -> None:
        self.path = devices.paths[0]
        self._file = devices
        self._parsed: FakeScan | None = None
        self._renamed: dict[str, str] = {}
        """A chip's UUID in the file → its UUID since a reset gave it another."""
        self._load()  # fail at start-up, where a usage error is still possible
        assert self._parsed is not None
        # The vendor decides resource name and device paths; it is fixed at start-up.
        self._vendor: Vendor = VENDORS[self._parsed.vendor]

    def _load(self) -> FakeScan:
        parsed = self._file.poll()
        if parsed is not None:
            self._parsed = parsed
        if self._file.last_error is not None or self._parsed is None:
            raise BackendError(f"fake devices file {self._file.last_error or self.path}")
        return self._parsed

    @property
    def vendor(self) -> Vendor:
        return self._vendor

    def chips(self) -> list[Chip]:
        parsed = self._load()
        if parsed.library_error:
            raise BackendError(parsed.library_error)
        renamed = self._renamed
        return [replace(c, uuid=renamed[c.uuid]) if c.uuid in renamed else c for c in parsed.chips]

    @property
    def reset_method(self) -> str:
        return "the devices file's reset: entries (fake)"

    def reset(self, chips: Sequence[Chip], timeout: float) -> None:
        """Sleep each chip's ``reset.seconds`` (up to ``timeout``), fail with its ``reset.fails``,
        else record the reset and rename the chips that have a ``reset.uuidAfter``."""
        parsed = self._load()
        by_uuid = {entry.uuid: entry for entry in parsed.resets}
        original = {new: old for old, new in self._renamed.items()}
        entries = [by_uuid.get(original.get(c.uuid, c.uuid), FakeReset(c.uuid)) for c in chips]
        seconds = sum(entry.seconds for entry in entries)
        time.sleep(min(seconds, timeout))
        if seconds > timeout:
            raise BackendError(f"reset did not finish in {timeout:g}s")
        if failed := next((entry for entry in entries if entry.fails), None):
            raise BackendError(failed.fails)
        with self.resets_log.open("a") as log:
            log.write(" ".join(chip.uuid for chip in chips) + "\n")
        for chip, entry in zip(chips, entries, strict=True):
            if entry.uuid_after is not None:
                self._renamed[original.get(chip.uuid, chip.uuid)] = entry.uuid_after

    @property
    def resets_log(self) -> Path:
        return self.path.with_name(self.path.name + ".resets")

    def control_nodes(self) -> tuple[str, ...]:
        parsed = self._parsed
        return parsed.control_nodes if parsed is not None else ()

    def read_telemetry(self, chip: Chip) -> dict[str, float]:
        """The file's figures for ``chip`` (``telemetry`` under it), after its ``hangSeconds``:
        what the file leaves out is absent, as a call the library fails."""
        parsed = self._parsed
        wanted = next((old for old, new in self._renamed.items() if new == chip.uuid), chip.uuid)
        for uuid, figures, hang in parsed.telemetry if parsed is not None else ():
            if uuid == wanted:
                if hang > 0:
                    time.sleep(hang)
                return dict(figures)
        return {}

    def close(self) -> None:
        pass
