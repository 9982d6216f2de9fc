"""What the plugin needs to know about GPU chips, and the one interface every backend implements.

The servicer, the device-list builder and the health tracker depend only on this module — never on
libixml, NVML or sysfs — so each backend is testable alone and the gRPC side is testable with the
``fake`` backend (NVIDIA splits ``internal/rm`` from ``server.go`` for the same reason).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ix_gpu.devicemodel.vendors import Vendor

# ixmlDeviceGetHealth bits, in the order the vendor header defines them.
IXML_HEALTH_BITS: tuple[tuple[int, str], ...] = (
    (0x01, "SYSHUB error"),
    (0x02, "memory-controller error"),
    (0x04, "over temperature"),
    (0x08, "over voltage"),
    (0x10, "ECC error"),
    (0x20, "memory error"),
    (0x40, "PCIe error"),
)


def decode_ixml_health(mask: int) -> str:
    """Turn the health bitmask into words for logs and ``ix-gpu devices``; ``""`` when healthy."""
    if mask == 0:
        return ""
    words = [name for bit, name in IXML_HEALTH_BITS if mask & bit]
    unknown = mask & ~sum(bit for bit, _ in IXML_HEALTH_BITS)
    if unknown:
        words.append(f"unknown bits 0x{unknown:x}")
    return f"{', '.join(words)} (health 0x{mask:x})"


@dataclass(frozen=True)
class Chip:
    """One GPU chip as a backend sees it at one moment (a BI-V150 board carries two)."""

    uuid: str
    index: int
    """The management library's enumeration index (what ``deviceIdStrategy: index`` exposes)."""
    minor: int
    """Device-node minor: the chip is ``/dev/iluvatar<minor>``."""
    board_id: str
    """Equal for chips on the same board; opaque."""
    board_position: int
    """0 for the board's first chip: its UUID names the board when boards are not split."""
    product: str
    memory_mib: int
    numa_node: int | None
    unhealthy_reason: str = ""
    """Empty when healthy; otherwise why not (decoded bitmask, library error...)."""
    pci_bus_id: str = ""
    """``dddd:bb:dd.f`` as sysfs names it; empty when the backend does not know. Published by the
    DRA plugin as the standard attribute, so claims can align a GPU with a NIC."""
    driver_version: str = ""
    """The kernel driver's version as the management library reports it; empty when unknown."""

    @property
    def healthy(self) -> bool:
        return not self.unhealthy_reason


class BackendError(RuntimeError):
    """The management library (or the file standing in for it) failed; the message says how."""


class Backend(Protocol):
    """A discovery backend: the source of chips. ``chips()`` is called once per health interval,
    so it both discovers (chips may appear or vanish) and reports health; it raises
    :class:`BackendError` when it cannot tell at all, which is different from "a chip is
    unhealthy"."""

    @property
    def name(self) -> str: ...

    @property
    def vendor(self) -> Vendor: ...

    def chips(self) -> list[Chip]: ...

    def control_nodes(self) -> tuple[str, ...]:
        """Host paths of the vendor's control nodes that exist (e.g. ``/dev/itrctl`` on newer
        drivers); every container that gets a GPU gets these too."""
        ...

    def read_telemetry(self, chip: Chip) -> dict[str, float]:
        """What ``chip`` is doing now, by figure key (:data:`ix_gpu.node.telemetry.FIGURES`, plus
        ``health_mask``): one library call per figure, a call that fails leaving its figure out.
        Blocking and possibly slow: only the telemetry reader thread calls it."""
        ...

    @property
    def reset_method(self) -> str | None:
        """How :meth:`reset` resets chips (``ixsmi -r``...), for logs; None: this backend cannot."""
        ...

    def reset(self, chips: Sequence[Chip], timeout: float) -> None:
        """Reset ``chips`` (their memory and state cleared for a new tenant), done within
        ``timeout`` seconds or not at all: raises :class:`BackendError` saying why. The library is
        released for the reset and taken again after it, so no other call may run meanwhile
        (:class:`ix_gpu.node.gpu_reset.SerializedBackend` sees to it); chips may come back with
        other indices or UUIDs."""
        ...

    def close(self) -> None: ...


# -- what every backend reads from the host the same way -------------------------------------------

PCI_DEVICES = Path("sys/bus/pci/devices")
"""Relative to the host root: backends take ``--root`` so tests can point them at a fake tree."""


def numa_node(pci_device_dir: Path) -> int | None:
    """The NUMA node sysfs reports for a PCI device; None when unknown (sysfs writes -1 then)."""
    try:
        value = int((pci_device_dir / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def existing_control_nodes(root: Path, vendor: Vendor) -> tuple[str, ...]:
    """The vendor's control nodes that exist under ``root`` (drivers differ in which they create)."""
    return tuple(path for path in vendor.control_nodes if (root / path.lstrip("/")).exists())


# -- resetting chips with the vendor's tool ---------------------------------------------------------

RESET_OUTPUT_CHARS = 400
"""What of a failed reset tool's output goes into the error: enough for its message."""


def run_reset_tool(argv: Sequence[str], timeout: float) -> None:
    """Run the vendor's reset tool (``ixsmi -r``, ``nvidia-smi --gpu-reset``) to completion within
    ``timeout`` seconds, in a session of its own so that a tool that hangs is killed with
    everything it started; raises :class:`BackendError` with why it failed."""
    try:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        raise BackendError(f"{argv[0]}: {exc.strerror or exc}") from None
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise BackendError(f"{argv[0]} did not finish in {timeout:g}s; it was killed") from None
    if process.returncode != 0:
        said = output.decode(errors="replace").strip()[-RESET_OUTPUT_CHARS:] or "no output"
        raise BackendError(f"{' '.join(argv)} exited {process.returncode}: {said}")
