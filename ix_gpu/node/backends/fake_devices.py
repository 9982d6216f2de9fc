"""The fake backend's devices file: its schema (pydantic) and what a scan of it yields.

Validated in a short-lived child by :class:`ix_gpu.node.backends.fake.FakeBackend` (the plugin process
never imports pydantic), or directly by tests and ``ix-gpu devices``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ix_gpu.config.schema_base import StrictModel, parse_yaml
from ix_gpu.node.backends.base import Chip, decode_ixml_health
from ix_gpu.node.backends.fake_scan import FakeReset, FakeScan

MIB = 1024 * 1024


class FakeTelemetry(StrictModel):
    """What the chip reports to a telemetry read; a figure left out is one the library fails."""

    utilization: float | None = Field(default=None, ge=0, le=100)
    memory_utilization: float | None = Field(default=None, ge=0, le=100)
    memory_used_mib: float | None = Field(default=None, ge=0, alias="memoryUsedMiB")
    temperature: float | None = None
    power_watts: float | None = Field(default=None, ge=0)
    sm_clock_mhz: float | None = Field(default=None, ge=0, alias="smClockMHz")
    memory_clock_mhz: float | None = Field(default=None, ge=0, alias="memoryClockMHz")
    ecc_corrected_errors: int | None = Field(default=None, ge=0)
    ecc_uncorrected_errors: int | None = Field(default=None, ge=0)
    hang_seconds: float = Field(default=0, ge=0, le=3600)
    """A read of this chip blocks this long first, as a wedged library call does."""


class FakeChipReset(StrictModel):
    """How a reset of the chip goes: fails with ``fails`` (the tool's error), takes ``seconds``,
    and gives the chip the UUID ``uuidAfter`` (a board whose identity changes with a reset)."""

    fails: str | None = Field(default=None, max_length=200)
    seconds: float = Field(default=0, ge=0, le=3600)
    uuid_after: str | None = Field(default=None, min_length=1, max_length=58)


class FakeChip(StrictModel):
    uuid: str = Field(min_length=1, max_length=58)
    minor: int | None = Field(default=None, ge=0)
    """Defaults to the chip's position in the whole file."""
    index: int | None = Field(default=None, ge=0)
    memory_mib: int = Field(default=32768, ge=0, alias="memoryMiB")
    health: int = Field(default=0, ge=0)
    """ixmlDeviceGetHealth bitmask; 0 is healthy, e.g. 0x4 is over-temperature."""
    pci_bus_id: str = Field(default="", max_length=64, alias="pciBusId")
    telemetry: FakeTelemetry = Field(default_factory=FakeTelemetry)
    reset: FakeChipReset = Field(default_factory=FakeChipReset)


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

    def telemetry(self) -> tuple[tuple[str, tuple[tuple[str, float], ...], float], ...]:
        """Per chip, the figures a telemetry read gives (keys of :data:`ix_gpu.node.telemetry.FIGURES`)."""
        out = []
        for board in self.boards:
            for fake in board.chips:
                t = fake.telemetry
                figures = {
                    "gpu_utilization": t.utilization,
                    "memory_utilization": t.memory_utilization,
                    "memory_used_bytes": None if t.memory_used_mib is None else t.memory_used_mib * MIB,
                    "memory_total_bytes": fake.memory_mib * MIB,
                    "temperature_celsius": t.temperature,
                    "power_watts": t.power_watts,
                    "sm_clock_hertz": None if t.sm_clock_mhz is None else t.sm_clock_mhz * 1e6,
                    "memory_clock_hertz": None if t.memory_clock_mhz is None else t.memory_clock_mhz * 1e6,
                    "ecc_corrected_errors": t.ecc_corrected_errors,
                    "ecc_uncorrected_errors": t.ecc_uncorrected_errors,
                    "health_mask": fake.health,
                }
                kept = tuple((key, float(value)) for key, value in figures.items() if value is not None)
                out.append((fake.uuid, kept, t.hang_seconds))
        return tuple(out)

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
        telemetry=parsed.telemetry(),
        resets=tuple(
            FakeReset(chip.uuid, chip.reset.fails, chip.reset.seconds, chip.reset.uuid_after)
            for board in parsed.boards
            for chip in board.chips
            if chip.reset != FakeChipReset()
        ),
    )
