"""The ``fake`` backend: chips described by a YAML file, re-read whenever its content changes.

It exists for tests, demos and the real-kubelet harness: flipping ``health`` in the file is how a
test makes a chip fail, and ``libraryError`` is how it makes the "library" fail mid-run. The file is
compared by content digest rather than mtime or inotify, because a ConfigMap-mounted file changes by
a symlink swap that neither reliably reports.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, model_validator

from devicemodel.schema_base import ConfigError, StrictModel, parse_document
from devicemodel.vendors import VENDORS, Vendor
from plugin.discovery import BackendError, Chip, decode_ixml_health


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


def parse_fake_devices(text: str, source: str) -> FakeDevices:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None
    return parse_document(FakeDevices, data, source)


class FakeBackend:
    """Discovery from a file. A file that becomes unreadable or invalid mid-run is reported as a
    backend failure (all chips Unhealthy, reason logged), exactly like a library that errors."""

    name = "fake"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._digest = ""
        self._parsed: FakeDevices | None = None
        self._vendor: Vendor | None = None
        self._load()  # fail at start-up, where a usage error is still possible

    def _load(self) -> FakeDevices:
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            raise BackendError(f"fake devices file {self.path}: cannot read: {exc.strerror or exc}") from None
        digest = hashlib.sha256(raw).hexdigest()
        if digest != self._digest or self._parsed is None:
            try:
                parsed = parse_fake_devices(raw.decode("utf-8", errors="replace"), str(self.path))
            except ConfigError as exc:
                raise BackendError(str(exc)) from None
            self._parsed, self._digest = parsed, digest
            if self._vendor is None:
                # The vendor decides resource name and device paths; it is fixed at start-up.
                self._vendor = VENDORS[parsed.vendor]
        return self._parsed

    @property
    def vendor(self) -> Vendor:
        assert self._vendor is not None
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
