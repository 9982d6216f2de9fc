"""The fake backend's devices file: its schema (pydantic) and what a scan of it yields.

Validated in a short-lived child by :class:`ix_gpu.node.backends.fake.FakeBackend` (the plugin process
never imports pydantic), or directly by tests and ``ix-gpu devices``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ix_gpu.config.schema_base import StrictModel, parse_yaml
from ix_gpu.node.backends.base import Chip, decode_ixml_health
from ix_gpu.node.backends.fake import FakeScan


class FakeChip(StrictModel):
    uuid: str = Field(min_length=1, max_length=58)
    minor: int | None = Field(default=None, ge=0)
    """Defaults to the chip's position in the whole file."""
    index: int | None = Field(default=None, ge=0)
    memory_mib: int = Field(default=32768, ge=0, alias="memoryMiB")
    health: int = Field(default=0, ge=0)
    """ixmlDeviceGetHealth bitmask; 0 is healthy, e.g. 0x4 is over-temperature."""
    pci_bus_id: str = Field(default="", max_length=64, alias="pciBusId")


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
    driver_version: str = Field(default="", max_length=64, alias="driverVersion")

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
                        pci_bus_id=fake.pci_bus_id,
                        driver_version=self.driver_version,
                    )
                )
                position += 1
        return chips


def parse_fake_devices(content: bytes | str, source: str) -> FakeDevices:
    return parse_yaml(FakeDevices, content, source)


def scan(content: bytes | str, source: str) -> FakeScan:
    """Validate a devices file's content and give the plain result the backend holds."""
    parsed = parse_fake_devices(content, source)
    return FakeScan(
        vendor=parsed.vendor,
        control_nodes=parsed.control_nodes,
        library_error=parsed.library_error,
        chips=tuple(parsed.to_chips()),
    )
