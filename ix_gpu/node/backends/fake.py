"""The ``fake`` backend: chips described by a YAML file, re-read whenever its content changes.

It exists for tests, demos and the real-kubelet harness: flipping ``health`` in the file is how a
test makes a chip fail, and ``libraryError`` is how it makes the "library" fail mid-run. The file is
compared by content digest rather than mtime or inotify, because a ConfigMap-mounted file changes by
a symlink swap that neither reliably reports.

The backend knows devices, not processes: how the file is watched and where it is validated (a
short-lived child, because the schema is pydantic) is the node layer's business
(:func:`ix_gpu.node.fake_devices_file.fake_backend`), handed in as a :class:`DevicesFile`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

from ix_gpu.devicemodel.vendors import VENDORS, Vendor
from ix_gpu.node.backends.base import BackendError, Chip
from ix_gpu.node.backends.fake_scan import FakeScan


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
        return list(parsed.chips)

    def control_nodes(self) -> tuple[str, ...]:
        parsed = self._parsed
        return parsed.control_nodes if parsed is not None else ()

    def read_telemetry(self, chip: Chip) -> dict[str, float]:
        """The file's figures for ``chip`` (``telemetry`` under it), after its ``hangSeconds``:
        what the file leaves out is absent, as a call the library fails."""
        parsed = self._parsed
        for uuid, figures, hang in parsed.telemetry if parsed is not None else ():
            if uuid == chip.uuid:
                if hang > 0:
                    time.sleep(hang)
                return dict(figures)
        return {}

    def close(self) -> None:
        pass
