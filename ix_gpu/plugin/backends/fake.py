"""The ``fake`` backend: chips described by a YAML file, re-read whenever its content changes.

It exists for tests, demos and the real-kubelet harness: flipping ``health`` in the file is how a
test makes a chip fail, and ``libraryError`` is how it makes the "library" fail mid-run. The file is
compared by content digest rather than mtime or inotify, because a ConfigMap-mounted file changes by
a symlink swap that neither reliably reports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from ix_gpu.devicemodel.schema_base import StrictModel, parse_yaml
from ix_gpu.devicemodel.vendors import VENDORS, Vendor
from ix_gpu.plugin.backends.base import BackendError, Chip, decode_ixml_health
from ix_gpu.runtime.reload import LastGoodFiles


class FakeChip(StrictModel):
    uuid: str = Field(min_length=1, max_length=58)
    minor: int | None = Field(default=None, ge=0)
    """Defaults to the chip's position in the whole file."""
    index: int | None = Field(default=None, ge=0)
    memory_mib: int = Field(default=32768, ge=0, alias="memoryMiB")
    health: int = Field(default=0, ge=0)
    """ixmlDeviceGetHealth bitmask; 0 is healthy, e.g. 0x4 is over-temperature."""


class FakeBoard(StrictModel):
    id: str | None = None
    product: str = "Iluvatar BI-V150"
    numa_node: int | None = None
    chips: tuple[FakeChip, ...] = Field(min_length=1)


class FakeDevices(StrictModel):
    vendor: Literal["iluvatar", "nvidia"] = "iluvatar"
    control_nodes: tuple[str, ...] = ()
    """Control nodes to report as present (the real backends look in /dev)."""
    library_error: str | None = None
    """When set, discovery fails with this message, as a broken library would."""
    boards: tuple[FakeBoard, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> FakeDevices:
        uuids = [chip.uuid for board in self.boards for chip in board.chips]
        dupes = sorted({u for u in uuids if uuids.count(u) > 1})
        if dupes:
            raise ValueError(f"chip uuids must be unique: {', '.join(dupes)}")
        return self

    def to_chips(self) -> list[Chip]:
        chips: list[Chip] = []
        position = 0
        for b, board in enumerate(self.boards):
            board_id = board.id or f"board{b}"
            for p, fake in enumerate(board.chips):
                chips.append(
                    Chip(
                        uuid=fake.uuid,
                        index=fake.index if fake.index is not None else position,
                        minor=fake.minor if fake.minor is not None else position,
                        board_id=board_id,
                        board_position=p,
                        product=board.product,
                        memory_mib=fake.memory_mib,
                        numa_node=board.numa_node,
                        unhealthy_reason=decode_ixml_health(fake.health),
                    )
                )
                position += 1
        return chips


def parse_fake_devices(content: bytes | str, source: str) -> FakeDevices:
    return parse_yaml(FakeDevices, content, source)


class FakeBackend:
    """Backend from a file. A file that becomes unreadable or invalid mid-run is reported as a
    backend failure (all chips Unhealthy, reason logged), exactly like a library that errors."""

    name = "fake"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file = LastGoodFiles(
            "fake devices", [self.path], lambda contents: parse_fake_devices(contents[0], str(self.path))
        )
        self._parsed: FakeDevices | None = None
        self._load()  # fail at start-up, where a usage error is still possible
        assert self._parsed is not None
        # The vendor decides resource name and device paths; it is fixed at start-up.
        self._vendor: Vendor = VENDORS[self._parsed.vendor]

    def _load(self) -> FakeDevices:
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
        return parsed.to_chips()

    def control_nodes(self) -> tuple[str, ...]:
        parsed = self._parsed
        return parsed.control_nodes if parsed is not None else ()

    def close(self) -> None:
        pass
