"""From chips to the devices of a ResourceSlice (``resource.k8s.io/v1``): names, attributes,
capacity and health taints. Pure: no I/O, no gRPC.

The unit is the device plugin's (:func:`ix_gpu.node.devices.device_list.physical_devices`): one
device per chip with ``splitboard: true``, one per board otherwise, so the two plugins agree on
what a pod may own. Time-slicing replicas have no DRA form: pods that share a GPU reference one
ResourceClaim.

Names (:mod:`ix_gpu.node.devices.dra_names`): a chip device is ``gpu-<index>`` and a board device
``board-<index of its first chip>``. The UUID is an attribute, which is what a selector should
match on when it means one physical GPU.

Attribute names without a domain belong to the driver's domain: CEL sees ``product`` as
``device.attributes["gpu.iluvatar.com"].product``. The PCI bus ID and NUMA node use the names
Kubernetes standardised (``resource.kubernetes.io/pciBusID``, ``.../numaNode``), which other
drivers publish too, so a claim can ask for a GPU and a NIC on one PCIe root or node.

An unhealthy device stays in the slice with a ``NoSchedule`` taint (``Device.taints``, GA in
Kubernetes 1.37 with the ``DRADeviceTaints`` gate on by default since 1.36): claims already
allocated keep resolving their device, and the scheduler allocates it to no new claim. On a
cluster where the field is disabled the apiserver drops taints silently, so ``remove`` (the
device leaves the slice) exists for those.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from ix_gpu.devicemodel.labels import gpu_product_value, label_value
from ix_gpu.devicemodel.vendors import Vendor
from ix_gpu.node.backends.base import Chip
from ix_gpu.node.devices.device_list import PhysicalDevice, physical_devices
from ix_gpu.node.devices.dra_names import dra_device_name

UnhealthyMode = Literal["taint", "remove"]
UNHEALTHY_MODES: tuple[UnhealthyMode, ...] = ("taint", "remove")

PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
NUMA_NODE = "resource.kubernetes.io/numaNode"
MAX_STRING = 64
"""A string or version attribute's limit in ``resource.k8s.io/v1``."""
TAINT_EFFECT = "NoSchedule"

# semver 2.0.0, as the apiserver checks a ``version`` attribute; a driver version that is not
# one (``4.1.0.20240101``) is published as a string instead of being refused.
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)


@dataclass(frozen=True)
class DraDevice:
    """One device of this node's pool, and the chips a claim on it gets."""

    name: str
    physical: PhysicalDevice
    board: bool
    """True when the device is a whole board (``splitboard: false``)."""

    @property
    def healthy(self) -> bool:
        return all(chip.healthy for chip in self.physical.chips)

    @property
    def unhealthy_reason(self) -> str:
        return "; ".join(chip.unhealthy_reason for chip in self.physical.chips if chip.unhealthy_reason)


def dra_devices(chips: Iterable[Chip], *, splitboard: bool) -> tuple[DraDevice, ...]:
    """This node's devices, in device-node order (what ``ix-gpu devices`` prints)."""
    out = []
    for phys in physical_devices(chips, splitboard):
        name = dra_device_name(phys, board=not splitboard)
        out.append(DraDevice(name=name, physical=phys, board=not splitboard))
    names = [device.name for device in out]
    if len(set(names)) != len(names):
        raise ValueError(f"two devices would share a name (duplicate chip indices?): {sorted(names)}")
    return tuple(out)


def _string(value: str) -> dict[str, Any]:
    return {"string": value[:MAX_STRING]}


def attributes(device: DraDevice, vendor: Vendor) -> dict[str, Any]:
    """The device's attributes: at most 32 together with its capacities."""
    phys = device.physical
    first = phys.chips[0]
    found: dict[str, Any] = {
        "vendor": _string(vendor.name),
        # The node label's value, so one name selects a model both ways.
        "product": _string(gpu_product_value(phys.product)),
        "uuid": _string(phys.id),
        "index": {"int": min(chip.index for chip in phys.chips)},
        "board": _string(phys.board_id),
        "chips": {"int": len(phys.chips)},
    }
    if first.pci_bus_id:
        found[PCI_BUS_ID] = _string(first.pci_bus_id)
    if phys.numa_node is not None:
        found[NUMA_NODE] = {"int": phys.numa_node}
    if version := first.driver_version:
        kind = "version" if _SEMVER.fullmatch(version) else "string"
        found["driverVersion"] = {kind: version[:MAX_STRING]}
    return found


def slice_device(device: DraDevice, vendor: Vendor, driver: str) -> dict[str, Any]:
    """One entry of ``spec.devices``; an unhealthy device carries the taint (see the module doc)."""
    entry: dict[str, Any] = {
        "name": device.name,
        "attributes": attributes(device, vendor),
        "capacity": {"memory": {"value": f"{device.physical.memory_mib}Mi"}},
    }
    if not device.healthy:
        reason = label_value(device.unhealthy_reason)
        entry["taints"] = [{"key": f"{driver}/unhealthy", "value": reason, "effect": TAINT_EFFECT}]
    return entry


def slice_devices(
    devices: Iterable[DraDevice],
    vendor: Vendor,
    driver: str,
    unhealthy: UnhealthyMode = "taint",
) -> list[dict[str, Any]]:
    """``spec.devices`` of this node's ResourceSlice."""
    return [
        slice_device(device, vendor, driver) for device in devices if device.healthy or unhealthy == "taint"
    ]
