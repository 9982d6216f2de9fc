"""What each chip is doing (utilization, memory, temperature, power, clocks, ECC error counts,
health bits), read through the backend that already holds the management library, for the node
agent's ``/metrics``.

Why the node agent and not a separate exporter: the device plugin already has libixml (or NVML)
loaded on every GPU node, so the figures cost no second process and no second copy of the library.
The device plugin serves them, not the DRA plugin: it runs on every GPU node (on DRA nodes too,
offering nothing), so one endpoint per node covers the fleet and the figures are read once.

Reads are bounded so that a scrape never waits on the library:

- each chip is read (one library call per figure) at most once per ``interval``, in a short thread
  of its own; the agent asks every ``interval`` (its telemetry loop), so a reading is at most an
  interval old whatever the scrape interval, and scrapes are served from it;
- a scrape never waits for a read: it starts the reads that are due and answers with what it has;
- a figure whose call fails is absent from that chip's reading (never 0); a chip whose last reading
  is older than two intervals (its call hangs in the library, or its read failed) is **stale**:
  its figures are left out and ``ix_gpu_chip_telemetry_stale`` says 1 for it alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from ix_gpu.node.backends.base import IXML_HEALTH_BITS, Chip

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Figure:
    """One per-chip figure: its key in a reading, its metric, and what other exporters call it.
    ``kind``: the Prometheus type; a count the library keeps (ECC errors) is a counter, so that
    ``increase()`` and ``rate()`` read it right across a driver reload's reset."""

    key: str
    metric: str
    help: str
    ix_exporter: str
    dcgm: str
    kind: Literal["gauge", "counter"] = "gauge"


FIGURES: tuple[Figure, ...] = (
    Figure("gpu_utilization", "ix_gpu_chip_utilization_percent",
           "Percent of the last sample period the chip was busy (nvmlDeviceGetUtilizationRates gpu).",
           "ix_gpu_utilization", "DCGM_FI_DEV_GPU_UTIL"),
    Figure("memory_utilization", "ix_gpu_chip_memory_utilization_percent",
           "Percent of the last sample period memory was read or written (nvmlDeviceGetUtilizationRates).",
           "ix_mem_utilization", "DCGM_FI_DEV_MEM_COPY_UTIL"),
    Figure("memory_used_bytes", "ix_gpu_chip_memory_used_bytes",
           "Device memory in use, bytes (nvmlDeviceGetMemoryInfo used).",
           "ix_mem_used (MiB)", "DCGM_FI_DEV_FB_USED (MiB)"),
    Figure("memory_total_bytes", "ix_gpu_chip_memory_total_bytes",
           "Device memory in all, bytes (nvmlDeviceGetMemoryInfo total).",
           "ix_mem_total (MiB)", "DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE (MiB)"),
    Figure("temperature_celsius", "ix_gpu_chip_temperature_celsius",
           "Chip temperature, degrees Celsius (nvmlDeviceGetTemperature, GPU sensor).",
           "ix_gpu_temperature", "DCGM_FI_DEV_GPU_TEMP"),
    Figure("power_watts", "ix_gpu_chip_power_watts",
           "Power draw, watts (nvmlDeviceGetPowerUsage, which reports milliwatts).",
           "ix_power_usage", "DCGM_FI_DEV_POWER_USAGE"),
    Figure("sm_clock_hertz", "ix_gpu_chip_sm_clock_hertz",
           "Shader (SM) clock, hertz (nvmlDeviceGetClockInfo SM, which reports MHz).",
           "ix_sm_clock (MHz)", "DCGM_FI_DEV_SM_CLOCK (MHz)"),
    Figure("memory_clock_hertz", "ix_gpu_chip_memory_clock_hertz",
           "Memory clock, hertz (nvmlDeviceGetClockInfo MEM, which reports MHz).",
           "ix_mem_clock (MHz)", "DCGM_FI_DEV_MEM_CLOCK (MHz)"),
    Figure("ecc_corrected_errors", "ix_gpu_chip_ecc_corrected_errors_total",
           "Single-bit (corrected) ECC errors the library has counted "
           "(ixmlDeviceGetEccErros single; nvmlDeviceGetTotalEccErrors corrected, volatile).",
           "ix_ecc_sbe_vol_status", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", kind="counter"),
    Figure("ecc_uncorrected_errors", "ix_gpu_chip_ecc_uncorrected_errors_total",
           "Double-bit (uncorrected) ECC errors the library has counted "
           "(ixmlDeviceGetEccErros double; nvmlDeviceGetTotalEccErrors uncorrected, volatile).",
           "ix_ecc_dbe_vol_status", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", kind="counter"),
)  # fmt: skip
HEALTH_MASK = "health_mask"
"""A reading's ixmlDeviceGetHealth bitmask, exported decoded as ``ix_gpu_chip_health_problem``."""
LABELS = ("node", "uuid", "index", "board", "product")

Reading = dict[str, float]
"""Figure key → value; what the backend could not read is absent."""


class TelemetrySource(Protocol):
    def read_telemetry(self, chip: Chip) -> Reading:
        """One library call per figure for ``chip``; a call that fails leaves its figure out.
        Blocking, and may hang in the library: only the reader thread calls it."""
        ...


@dataclass
class ChipTelemetry:
    chip: Chip
    reading: Reading
    stale: bool


@dataclass
class _ChipState:
    reading: Reading | None = None
    read_at: float = float("-inf")
    """When the read that gave ``reading`` started."""
    reading_since: float | None = None
    """When the read in flight started (None: none is)."""


class Telemetry:
    """The latest reading of every chip. Each chip is read in a short thread of its own when due,
    so a chip whose library call hangs holds only its own thread and goes stale alone; it is not
    read again until that call returns."""

    def __init__(
        self, source: TelemetrySource, interval: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.source, self.interval, self.clock = source, interval, clock
        self._chips: dict[str, _ChipState] = {}
        self._lock = threading.Lock()
        self.reads = 0
        """Completed chip reads (for tests and the benchmark)."""

    def _read(self, chip: Chip, started: float) -> None:
        try:
            reading: Reading | None = self.source.read_telemetry(chip)
        except Exception as exc:  # a backend bug must not end telemetry for good
            log.warning("telemetry read of %s failed: %s", chip.uuid, exc)
            reading = None
        with self._lock:
            state = self._chips.setdefault(chip.uuid, _ChipState())
            state.reading_since = None
            if reading is not None:
                state.reading, state.read_at = reading, started
            self.reads += 1

    def collect(self, chips: Sequence[Chip]) -> list[ChipTelemetry]:
        """What a scrape shows now; starts a read of each chip that is due, never waits for one."""
        now = self.clock()
        due: list[Chip] = []
        out = []
        with self._lock:
            for uuid in set(self._chips) - {chip.uuid for chip in chips}:
                if self._chips[uuid].reading_since is None:
                    del self._chips[uuid]  # a chip that is gone, and no read of it in flight
            for chip in chips:
                state = self._chips.setdefault(chip.uuid, _ChipState())
                if state.reading_since is None and now - state.read_at >= self.interval:
                    state.reading_since = now
                    due.append(chip)
                reading = state.reading
                stale = reading is None or now - state.read_at > 2 * self.interval
                out.append(ChipTelemetry(chip, {} if stale or reading is None else reading, stale))
        for chip in due:
            threading.Thread(target=self._read, args=(chip, now), name="telemetry", daemon=True).start()
        return out


def chip_labels(node: str, chip: Chip) -> tuple[str, ...]:
    return (node, chip.uuid, str(chip.index), chip.board_id, chip.product)


def health_problems(mask: int) -> list[str]:
    """The names of the ixmlDeviceGetHealth bits set in ``mask``."""
    return [name for bit, name in IXML_HEALTH_BITS if mask & bit]
