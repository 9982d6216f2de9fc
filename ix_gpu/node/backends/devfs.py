"""The ``devfs`` backend: no management library, just PCI sysfs and device nodes.

The fallback when neither libixml nor NVML loads (e.g. a minimal image). It cannot see boards, so
each chip is its own board — with ``splitboard: false`` a BI-V150 then counts as two devices, which
is logged at start-up so nobody mistakes it for the vendor's grouping. Chip IDs are derived from
PCI addresses (``PCI-0000:8a:00.0``): stable across reboots, unlike enumeration order. Health is
"the PCI function and its device node are both present".

Everything is read under ``root`` so tests can point it at a temporary tree.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

from ix_gpu.devicemodel.vendors import ILUVATAR, NVIDIA, Vendor
from ix_gpu.node.backends.base import PCI_DEVICES, BackendError, Chip, existing_control_nodes, numa_node

log = logging.getLogger(__name__)

# PCI base classes of GPUs: 0x03 display controller, 0x12 processing accelerator. NVIDIA cards
# also expose an audio function (0x04) with the same vendor id, which must not count as a GPU.
_GPU_CLASSES = (0x03, 0x12)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _hex(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


class DevfsBackend:
    name = "devfs"

    def __init__(self, root: Path = Path("/"), vendors: tuple[Vendor, ...] = (ILUVATAR, NVIDIA)) -> None:
        self.root = root
        for vendor in vendors:
            if self._pci_functions(vendor):
                self._vendor = vendor
                break
        else:
            ids = ", ".join(f"{v.name} 0x{v.pci_vendor_id:04x}" for v in vendors)
            raise BackendError(f"no GPU PCI devices ({ids}) under {root / PCI_DEVICES}")
        log.info(
            "devfs backend: %s GPUs found without a management library; boards cannot be detected, "
            "every chip is advertised as its own board",
            self._vendor.name,
        )

    @property
    def vendor(self) -> Vendor:
        return self._vendor

    def _pci_functions(self, vendor: Vendor) -> list[Path]:
        base = self.root / PCI_DEVICES
        found = []
        for dev in sorted(base.glob("*")) if base.is_dir() else []:
            if _hex(_read(dev / "vendor")) != vendor.pci_vendor_id:
                continue
            pci_class = _hex(_read(dev / "class"))
            if pci_class is not None and (pci_class >> 16) not in _GPU_CLASSES:
                continue
            found.append(dev)
        return found

    def _minors(self) -> list[int]:
        template = self._vendor.device_node_template
        directory, _, pattern = template.rpartition("/")
        regex = re.compile("^" + re.escape(pattern).replace(re.escape("{minor}"), r"(\d+)") + "$")
        dev_dir = self.root / directory.lstrip("/")
        minors = []
        for node in dev_dir.iterdir() if dev_dir.is_dir() else []:
            if match := regex.match(node.name):
                minors.append(int(match.group(1)))
        return sorted(minors)

    def chips(self) -> list[Chip]:
        functions = self._pci_functions(self._vendor)
        minors = self._minors()
        if not functions:
            raise BackendError(f"the {self._vendor.name} PCI devices disappeared")
        chips = []
        # Without a library, pair PCI functions and device nodes in order: the drivers number
        # minors in PCI enumeration order.
        for index, dev in enumerate(functions):
            address = dev.name
            minor = minors[index] if index < len(minors) else index
            reason = "" if index < len(minors) else f"no device node for PCI device {address}"
            device_id = _hex(_read(dev / "device"))
            chips.append(
                Chip(
                    uuid=f"PCI-{address}",
                    index=index,
                    minor=minor,
                    board_id=address,
                    board_position=0,
                    product=f"{self._vendor.name} 0x{device_id or 0:04x}",
                    memory_mib=0,
                    numa_node=numa_node(dev),
                    unhealthy_reason=reason,
                )
            )
        return chips

    def control_nodes(self) -> tuple[str, ...]:
        return existing_control_nodes(self.root, self._vendor)

    def read_telemetry(self, chip: Chip) -> dict[str, float]:
        """Nothing: sysfs alone tells no GPU figure (each is absent, never 0)."""
        return {}

    @property
    def reset_method(self) -> None:
        """None: without the vendor's library or tool there is no reset (``reset_gpu`` refuses to
        start on this backend)."""
        return None

    def reset(self, chips: Sequence[Chip], timeout: float) -> None:
        raise BackendError("the devfs backend cannot reset chips (no management library or tool)")

    def close(self) -> None:
        pass
