"""The ``ixml`` backend: Iluvatar's management library ``libixml.so`` through ctypes.

libixml exports NVML's C names (``nvmlInit_v2``, ``nvmlDeviceGetUUID``, ...) plus Iluvatar
additions, of which we use ``ixmlDeviceGetBoardPosition`` (which chip names a board) and
``ixmlDeviceGetHealth`` (a bitmask, decoded by :func:`ix_gpu.node.backends.base.decode_ixml_health`).
The driver version (``nvmlSystemGetDriverVersion``, optional) is read once per discovery, for all
chips: the DRA plugin publishes it as a device attribute.
ctypes rather than a compiled extension keeps the image free of a toolchain and lets the tests
load a gcc-built stand-in through exactly this code path.

Static facts (UUID, minor, board) are cached per index, so a chip whose queries start failing
mid-run is still reported — as Unhealthy, with the library's error — instead of vanishing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ix_gpu.devicemodel.vendors import ILUVATAR, Vendor
from ix_gpu.node.backends.base import (
    PCI_DEVICES,
    BackendError,
    Chip,
    decode_ixml_health,
    existing_control_nodes,
    numa_node,
    run_reset_tool,
)

log = logging.getLogger(__name__)

LIBRARY = "libixml.so"
NVML_SUCCESS = 0
_BUFFER = 96
_VERSION_BUFFER = 80  # NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2


class _PciInfo(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


def library_candidates() -> list[str]:
    """Where libixml is looked for, in order: ``$COREX_HOME/lib64``, the default CoreX install,
    then the dynamic loader's own search (LD_LIBRARY_PATH, ldconfig cache)."""
    out = []
    corex_home = os.environ.get("COREX_HOME")
    if corex_home:
        out.append(str(Path(corex_home) / "lib64" / LIBRARY))
    out.append(str(Path(ILUVATAR.library_dir) / LIBRARY))
    out.append(LIBRARY)
    return out


IXSMI = "ixsmi"


def ixsmi_candidates() -> list[str]:
    """Where the reset tool is looked for: beside the library (``$COREX_HOME/bin``, the default
    CoreX install's ``bin``), then on PATH."""
    corex_home = os.environ.get("COREX_HOME")
    homes = [corex_home] if corex_home else []
    homes.append(str(Path(ILUVATAR.library_dir).parent))
    return [str(Path(home) / "bin" / IXSMI) for home in homes]


def reset_tool() -> str | None:
    found = next((c for c in ixsmi_candidates() if os.access(c, os.X_OK)), None)
    return found or shutil.which(IXSMI)


def load_library() -> ctypes.CDLL:
    errors = []
    for candidate in library_candidates():
        if os.sep in candidate and not os.path.exists(candidate):
            errors.append(f"{candidate}: not found")
            continue
        try:
            return ctypes.CDLL(candidate)
        except OSError as exc:
            errors.append(f"{candidate}: {exc}")
    raise BackendError(f"cannot load {LIBRARY} ({'; '.join(errors)})")


class IxmlBackend:
    name = "ixml"

    def __init__(self, root: Path = Path("/"), library: ctypes.CDLL | None = None) -> None:
        self.root = root
        self._lib = library or load_library()
        self._bind()
        self._check("nvmlInit_v2", self._lib.nvmlInit_v2())
        self._static: dict[int, Chip] = {}
        self._boards: dict[tuple[str, ...], dict[str, tuple[str, int]]] = {}
        self._version_error = ""

    @property
    def vendor(self) -> Vendor:
        return ILUVATAR

    def _bind(self) -> None:
        lib = self._lib
        handle_p = ctypes.POINTER(ctypes.c_void_p)
        uint_p = ctypes.POINTER(ctypes.c_uint)
        signatures: dict[str, list[Any]] = {
            "nvmlInit_v2": [],
            "nvmlShutdown": [],
            "nvmlDeviceGetCount_v2": [uint_p],
            "nvmlDeviceGetHandleByIndex_v2": [ctypes.c_uint, handle_p],
            "nvmlDeviceGetUUID": [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint],
            "nvmlDeviceGetName": [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint],
            "nvmlDeviceGetMinorNumber": [ctypes.c_void_p, uint_p],
            "nvmlDeviceGetMemoryInfo": [ctypes.c_void_p, ctypes.POINTER(_Memory)],
            "nvmlDeviceGetPciInfo": [ctypes.c_void_p, ctypes.POINTER(_PciInfo)],
        }
        optional: dict[str, list[Any]] = {
            "nvmlDeviceOnSameBoard": [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)],
            "ixmlDeviceGetBoardPosition": [ctypes.c_void_p, uint_p],
            "ixmlDeviceGetHealth": [ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulonglong)],
            "nvmlSystemGetDriverVersion": [ctypes.c_char_p, ctypes.c_uint],
            # Telemetry (ix_gpu.node.telemetry): each one optional, its figure absent without it.
            "nvmlDeviceGetUtilizationRates": [ctypes.c_void_p, ctypes.POINTER(_Utilization)],
            "nvmlDeviceGetTemperature": [ctypes.c_void_p, ctypes.c_int, uint_p],
            "nvmlDeviceGetPowerUsage": [ctypes.c_void_p, uint_p],
            "nvmlDeviceGetClockInfo": [ctypes.c_void_p, ctypes.c_int, uint_p],
            "ixmlDeviceGetEccErros": [ctypes.c_void_p, uint_p, uint_p],  # sic: the library's name
        }
        missing = []
        for name, argtypes in {**signatures, **optional}.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                if name in signatures:
                    missing.append(name)
                continue
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
        if missing:
            raise BackendError(f"{LIBRARY} lacks {', '.join(missing)}")
        try:
            lib.nvmlErrorString.argtypes = [ctypes.c_int]
            lib.nvmlErrorString.restype = ctypes.c_char_p
        except AttributeError:
            pass
        self._has = {name: hasattr(lib, name) for name in optional}

    def _error(self, code: int) -> str:
        try:
            text = self._lib.nvmlErrorString(code)
        except AttributeError:
            text = None
        return f"{text.decode(errors='replace') if text else 'error'} (code {code})"

    def _check(self, what: str, code: int) -> None:
        if code != NVML_SUCCESS:
            raise BackendError(f"{what}: {self._error(code)}")

    def _call(self, what: str, fn: Callable[..., int], *args: Any) -> None:
        self._check(what, fn(*args))

    def _read_chip(self, index: int) -> tuple[Chip, ctypes.c_void_p]:
        lib = self._lib
        handle = ctypes.c_void_p()
        self._call(
            "nvmlDeviceGetHandleByIndex_v2", lib.nvmlDeviceGetHandleByIndex_v2, index, ctypes.byref(handle)
        )
        uuid = ctypes.create_string_buffer(_BUFFER)
        self._call("nvmlDeviceGetUUID", lib.nvmlDeviceGetUUID, handle, uuid, _BUFFER)
        name = ctypes.create_string_buffer(_BUFFER)
        self._call("nvmlDeviceGetName", lib.nvmlDeviceGetName, handle, name, _BUFFER)
        minor = ctypes.c_uint()
        self._call("nvmlDeviceGetMinorNumber", lib.nvmlDeviceGetMinorNumber, handle, ctypes.byref(minor))
        memory = _Memory()
        self._call("nvmlDeviceGetMemoryInfo", lib.nvmlDeviceGetMemoryInfo, handle, ctypes.byref(memory))
        pci = _PciInfo()
        numa = None
        bus_id = ""
        if lib.nvmlDeviceGetPciInfo(handle, ctypes.byref(pci)) == NVML_SUCCESS:
            bus_id = f"{pci.domain:04x}:{pci.bus:02x}:{pci.device:02x}.0"
            numa = numa_node(self.root / PCI_DEVICES / bus_id)
        position = 0
        if self._has["ixmlDeviceGetBoardPosition"]:
            pos = ctypes.c_uint()
            if lib.ixmlDeviceGetBoardPosition(handle, ctypes.byref(pos)) == NVML_SUCCESS:
                position = pos.value
        reason = ""
        if self._has["ixmlDeviceGetHealth"]:
            mask = ctypes.c_ulonglong()
            code = lib.ixmlDeviceGetHealth(handle, ctypes.byref(mask))
            reason = (
                decode_ixml_health(mask.value)
                if code == NVML_SUCCESS
                else f"ixmlDeviceGetHealth: {self._error(code)}"
            )
        chip = Chip(
            uuid=uuid.value.decode(errors="replace"),
            index=index,
            minor=minor.value,
            board_id="",
            board_position=position,
            product=name.value.decode(errors="replace"),
            memory_mib=memory.total // (1024 * 1024),
            numa_node=numa,
            unhealthy_reason=reason,
            pci_bus_id=bus_id,
        )
        return chip, handle

    def _board_ids(self, chips: list[Chip], handles: list[ctypes.c_void_p]) -> dict[str, tuple[str, int]]:
        """uuid → (board id, position). Boards come from nvmlDeviceOnSameBoard, computed once per
        set of chips (it is pairwise, and boards do not change while the driver is loaded)."""
        key = tuple(c.uuid for c in chips)
        if key in self._boards:
            return self._boards[key]
        parent = list(range(len(chips)))

        def find(i: int) -> int:
            while parent[i] != i:
                i = parent[i]
            return i

        if self._has["nvmlDeviceOnSameBoard"]:
            same = ctypes.c_int()
            for i in range(len(chips)):
                for j in range(i + 1, len(chips)):
                    code = self._lib.nvmlDeviceOnSameBoard(handles[i], handles[j], ctypes.byref(same))
                    if code == NVML_SUCCESS and same.value:
                        parent[find(j)] = find(i)
        groups: dict[int, list[int]] = {}
        for i in range(len(chips)):
            groups.setdefault(find(i), []).append(i)
        result = {}
        for members in groups.values():
            first = min(members, key=lambda i: (chips[i].board_position, chips[i].minor))
            board = f"board-{chips[first].uuid}"
            for i in members:
                result[chips[i].uuid] = (board, chips[i].board_position)
        self._boards = {key: result}
        return result

    def driver_version(self) -> str:
        """The kernel driver's version; ``""`` when the library has no such call or it fails (said
        once per distinct error, not on every health interval)."""
        if not self._has["nvmlSystemGetDriverVersion"]:
            return ""
        buffer = ctypes.create_string_buffer(_VERSION_BUFFER)
        code = self._lib.nvmlSystemGetDriverVersion(buffer, _VERSION_BUFFER)
        if code != NVML_SUCCESS:
            error = self._error(code)
            if error != self._version_error:
                log.warning("nvmlSystemGetDriverVersion: %s; devices carry no driver version", error)
            self._version_error = error
            return ""
        self._version_error = ""
        return buffer.value.decode(errors="replace").strip()

    def chips(self) -> list[Chip]:
        count = ctypes.c_uint()
        self._call("nvmlDeviceGetCount_v2", self._lib.nvmlDeviceGetCount_v2, ctypes.byref(count))
        chips: list[Chip] = []
        handles: list[ctypes.c_void_p] = []
        failed: dict[int, str] = {}
        for index in range(count.value):
            try:
                chip, handle = self._read_chip(index)
            except BackendError as exc:
                failed[index] = str(exc)
                continue
            chips.append(chip)
            handles.append(handle)
        boards = self._board_ids(chips, handles)
        version = self.driver_version()
        out = []
        for chip in chips:
            board, position = boards[chip.uuid]
            chip = replace(chip, board_id=board, board_position=position, driver_version=version)
            self._static[chip.index] = chip
            out.append(chip)
        for index, error in failed.items():
            known = self._static.get(index)
            if known is None:
                log.error("GPU index %d cannot be read and was never seen healthy: %s", index, error)
                continue
            out.append(replace(known, unhealthy_reason=error))
        return sorted(out, key=lambda c: c.index)

    def control_nodes(self) -> tuple[str, ...]:
        return existing_control_nodes(self.root, ILUVATAR)

    def read_telemetry(self, chip: Chip) -> dict[str, float]:
        """One call per figure (:mod:`ix_gpu.node.telemetry`); a call the library lacks or fails
        leaves its figure out. ECC: ``ixmlDeviceGetEccErros`` gives single-bit (corrected) and
        double-bit (uncorrected) counts in one call. Power: the header documents milliwatts
        (ix-exporter reads the value as watts; not confirmed on hardware here), published as watts."""
        lib, has = self._lib, self._has
        handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByIndex_v2(chip.index, ctypes.byref(handle)) != NVML_SUCCESS:
            return {}
        out: dict[str, float] = {}
        value = ctypes.c_uint()
        if has["nvmlDeviceGetUtilizationRates"]:
            rates = _Utilization()
            if lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(rates)) == NVML_SUCCESS:
                out["gpu_utilization"], out["memory_utilization"] = rates.gpu, rates.memory
        memory = _Memory()
        if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) == NVML_SUCCESS:
            out["memory_used_bytes"], out["memory_total_bytes"] = memory.used, memory.total
        temperature = lib.nvmlDeviceGetTemperature if has["nvmlDeviceGetTemperature"] else None
        if temperature and temperature(handle, NVML_TEMPERATURE_GPU, ctypes.byref(value)) == NVML_SUCCESS:
            out["temperature_celsius"] = value.value
        power = lib.nvmlDeviceGetPowerUsage if has["nvmlDeviceGetPowerUsage"] else None
        if power and power(handle, ctypes.byref(value)) == NVML_SUCCESS:
            out["power_watts"] = value.value / 1000
        if has["nvmlDeviceGetClockInfo"]:
            for key, clock in (("sm_clock_hertz", NVML_CLOCK_SM), ("memory_clock_hertz", NVML_CLOCK_MEM)):
                if lib.nvmlDeviceGetClockInfo(handle, clock, ctypes.byref(value)) == NVML_SUCCESS:
                    out[key] = value.value * 1e6
        if has["ixmlDeviceGetEccErros"]:
            single, double = ctypes.c_uint(), ctypes.c_uint()
            if lib.ixmlDeviceGetEccErros(handle, ctypes.byref(single), ctypes.byref(double)) == NVML_SUCCESS:
                out["ecc_corrected_errors"], out["ecc_uncorrected_errors"] = single.value, double.value
        if has["ixmlDeviceGetHealth"]:
            mask = ctypes.c_ulonglong()
            if lib.ixmlDeviceGetHealth(handle, ctypes.byref(mask)) == NVML_SUCCESS:
                out["health_mask"] = mask.value
        return {key: float(v) for key, v in out.items()}

    @property
    def reset_method(self) -> str | None:
        tool = reset_tool()
        return f"{tool} -r -i <chip UUIDs>" if tool else None

    def reset(self, chips: Sequence[Chip], timeout: float) -> None:
        """``ixsmi -r -i <uuids>`` (the vendor's tool; the library has no reset call) with the
        library shut down meanwhile, as Iluvatar's plugin does: a handle held open would keep the
        chip busy. The library is initialised again whatever the tool did, and what was known of
        each index is forgotten: a reset chip may come back with another UUID."""
        tool = reset_tool()
        if tool is None:
            raise BackendError(f"no {IXSMI} in {', '.join(ixsmi_candidates())} or on PATH")
        self._lib.nvmlShutdown()
        try:
            run_reset_tool([tool, "-r", "-i", ",".join(chip.uuid for chip in chips)], timeout)
        finally:
            self._static.clear()
            self._boards.clear()
            self._check("nvmlInit_v2", self._lib.nvmlInit_v2())

    def close(self) -> None:
        self._lib.nvmlShutdown()
