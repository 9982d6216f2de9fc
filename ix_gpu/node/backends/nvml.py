"""The ``nvml`` backend: NVIDIA GPUs through nvidia-ml-py (``pynvml``), resource ``nvidia.com/gpu``.

Boards come from ``nvmlDeviceGetBoardId`` (dual-GPU cards share one id). NVML has no single health
word like ixml's bitmask, so a chip is Unhealthy when querying it fails — e.g. ``GPU is lost`` after
it fell off the bus — and the NVML error text is the reason. Static facts are cached per index so
a failing chip stays listed (Unhealthy) instead of vanishing from capacity. The driver version
(``nvmlSystemGetDriverVersion``) is read once per discovery, for all chips.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ix_gpu.devicemodel.vendors import NVIDIA, Vendor
from ix_gpu.node.backends.base import (
    PCI_DEVICES,
    BackendError,
    Chip,
    existing_control_nodes,
    numa_node,
    run_reset_tool,
)

log = logging.getLogger(__name__)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _rates(rates: Any) -> tuple[float, float]:
    return float(rates.gpu), float(rates.memory)


def _memory(memory: Any) -> tuple[float, float]:
    return float(memory.used), float(memory.total)


def _sysfs_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` → sysfs's ``0000:3b:00.0``."""
    domain, _, rest = bus_id.partition(":")
    return f"{domain[-4:]}:{rest}".lower()


NVML_LIBRARY = "libnvidia-ml.so.1"
NVIDIA_SMI = "nvidia-smi"
"""What pynvml loads on Linux (``pynvml._LoadNvmlLibrary``)."""


def _require_library() -> None:
    """Fail before importing pynvml where NVIDIA's driver is absent: ``auto`` tries this backend on
    every node that ixml does not serve, and pynvml's import alone costs the plugin about 2 MiB,
    kept for the life of the process even when nvmlInit then fails."""
    import ctypes

    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError as exc:
        raise BackendError(f"nvmlInit: {NVML_LIBRARY} cannot be loaded ({exc})") from None


class NvmlBackend:
    name = "nvml"

    def __init__(self, root: Path = Path("/"), nvml: Any = None) -> None:
        self.root = root
        if nvml is None:
            _require_library()
            try:
                import pynvml
            except ImportError as exc:
                raise BackendError(f"nvidia-ml-py is not installed ({exc})") from None
            nvml = pynvml
        self.nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise BackendError(f"nvmlInit: {exc}") from None
        self._static: dict[int, Chip] = {}
        self._version_error = ""

    @property
    def vendor(self) -> Vendor:
        return NVIDIA

    def _read_chip(self, index: int) -> Chip:
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        try:
            board = nvml.nvmlDeviceGetBoardId(handle)
        except nvml.NVMLError:
            board = 0
        bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
        return Chip(
            uuid=uuid,
            index=index,
            minor=int(nvml.nvmlDeviceGetMinorNumber(handle)),
            # Board id 0 means "unknown": then the GPU is a board of its own.
            board_id=f"board-{board:x}" if board else f"board-{uuid}",
            board_position=0,
            product=_text(nvml.nvmlDeviceGetName(handle)),
            memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024),
            numa_node=numa_node(self.root / PCI_DEVICES / _sysfs_bus_id(bus_id)),
            pci_bus_id=_sysfs_bus_id(bus_id),
        )

    def driver_version(self) -> str:
        """The kernel driver's version; ``""`` when NVML cannot tell (said once per distinct error)."""
        nvml = self.nvml
        read = getattr(nvml, "nvmlSystemGetDriverVersion", None)
        if read is None:  # a binding without the call (a test's stand-in)
            return ""
        try:
            version = _text(read()).strip()
        except nvml.NVMLError as exc:
            if str(exc) != self._version_error:
                log.warning("nvmlSystemGetDriverVersion: %s; devices carry no driver version", exc)
            self._version_error = str(exc)
            return ""
        self._version_error = ""
        return version

    def chips(self) -> list[Chip]:
        nvml = self.nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            raise BackendError(f"nvmlDeviceGetCount: {exc}") from None
        chips: list[Chip] = []
        for index in range(count):
            try:
                chip = self._read_chip(index)
            except nvml.NVMLError as exc:
                known = self._static.get(index)
                if known is None:
                    log.error("GPU index %d cannot be read and was never seen healthy: %s", index, exc)
                    continue
                chips.append(replace(known, unhealthy_reason=f"NVML: {exc}"))
                continue
            chips.append(chip)
        positions: dict[str, int] = {}
        version = self.driver_version()
        out = []
        for chip in sorted(chips, key=lambda c: c.index):
            position = positions.get(chip.board_id, 0)
            positions[chip.board_id] = position + 1
            chip = replace(chip, board_position=position, driver_version=version)
            if chip.healthy:
                self._static[chip.index] = chip
            out.append(chip)
        return out

    def control_nodes(self) -> tuple[str, ...]:
        return existing_control_nodes(self.root, NVIDIA)

    def read_telemetry(self, chip: Chip) -> dict[str, float]:
        """One NVML call per figure (:mod:`ix_gpu.node.telemetry`); one that fails leaves its
        figure out. NVML reports power in milliwatts and clocks in MHz."""
        nvml = self.nvml
        out: dict[str, float] = {}
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(chip.index)
        except nvml.NVMLError:
            return out
        reads: tuple[tuple[tuple[str, ...], Callable[[], tuple[float, ...]]], ...] = (
            (
                ("gpu_utilization", "memory_utilization"),
                lambda: _rates(nvml.nvmlDeviceGetUtilizationRates(handle)),
            ),
            (
                ("memory_used_bytes", "memory_total_bytes"),
                lambda: _memory(nvml.nvmlDeviceGetMemoryInfo(handle)),
            ),
            (("temperature_celsius",), lambda: (nvml.nvmlDeviceGetTemperature(handle, 0),)),
            (("power_watts",), lambda: (nvml.nvmlDeviceGetPowerUsage(handle) / 1000,)),
            (("sm_clock_hertz",), lambda: (nvml.nvmlDeviceGetClockInfo(handle, 1) * 1e6,)),
            (("memory_clock_hertz",), lambda: (nvml.nvmlDeviceGetClockInfo(handle, 2) * 1e6,)),
            # Corrected (0) and uncorrected (1) errors, volatile counts (0: since the driver loaded);
            # a GPU without ECC, or with it off, answers NOT_SUPPORTED and the figures are absent.
            (("ecc_corrected_errors",), lambda: (nvml.nvmlDeviceGetTotalEccErrors(handle, 0, 0),)),
            (("ecc_uncorrected_errors",), lambda: (nvml.nvmlDeviceGetTotalEccErrors(handle, 1, 0),)),
        )
        for keys, read in reads:
            try:
                values = read()
            except (nvml.NVMLError, AttributeError):  # failed, or a binding without the call
                continue
            out.update((key, float(value)) for key, value in zip(keys, values, strict=True))
        return out

    @property
    def reset_method(self) -> str | None:
        tool = shutil.which(NVIDIA_SMI)
        return f"{tool} --gpu-reset -i <chip UUIDs>" if tool else None

    def reset(self, chips: Sequence[Chip], timeout: float) -> None:
        """``nvidia-smi --gpu-reset -i <uuids>``: NVML has no public reset call; the tool needs the
        GPUs idle, so NVML is shut down meanwhile and initialised again after, and what was known of
        each index is forgotten."""
        tool = shutil.which(NVIDIA_SMI)
        if tool is None:
            raise BackendError(f"no {NVIDIA_SMI} on PATH")
        nvml = self.nvml
        nvml.nvmlShutdown()
        try:
            run_reset_tool([tool, "--gpu-reset", "-i", ",".join(chip.uuid for chip in chips)], timeout)
        finally:
            self._static.clear()
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as exc:
                raise BackendError(f"nvmlInit after the reset: {exc}") from None

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as exc:
            log.warning("nvmlShutdown: %s", exc)
