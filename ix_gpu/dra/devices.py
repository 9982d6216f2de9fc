"""From chips to the devices of a ResourceSlice (``resource.k8s.io/v1``): names, attributes,
capacity, shared counters and health taints. Pure: no I/O, no gRPC.

Two layouts, decided by what the cluster serves (:mod:`ix_gpu.dra.slices` reads it back):

* **Partitionable** (``DRAPartitionableDevices``, beta and on from Kubernetes 1.36): a board of
  several chips is published as the whole board *and* each of its chips, every one of them
  consuming from one counter set per board (a counter per chip), so the scheduler never allocates
  the board together with one of its chips, or a chip twice. Each claim picks its form: the
  ``wholeBoard`` and ``chips`` attributes say which a device is. A one-chip board is one device.
  ``splitboard`` picks the form the default DeviceClass selects: the ``defaultForm`` attribute is
  true on the chips with ``splitboard: true``, on the boards otherwise.
* **Plain** (older clusters, where the apiserver drops counters silently): the device plugin's
  unit (:func:`ix_gpu.node.devices.device_list.physical_devices`), one device per chip with
  ``splitboard: true``, one per board otherwise, all of them ``defaultForm``.

Either way the device plugin and the DRA driver agree on what a pod may own.

**Shared devices** (``sharing.timeSlicing.replicas: N`` above 1; ``DRAConsumableCapacity``, beta
and on from Kubernetes 1.36): each device of the form ``splitboard`` picks is published with
``allowMultipleAllocations`` and its memory split in N equal shares (``requestPolicy``: one share
by default, whole shares up to the memory), so independent claims each take shares and the
scheduler never gives out more than the device's memory. With partitionable boards too (an
opt-in of the plugin: ``--partitionable with-shares``), every device is shared, the board and each
of its chips: Kubernetes 1.37's scheduler charges a shared device's counters once, with its first
share, and skips the counter check for a device that already holds shares, so a board's shares and
its chips' shares never go together, and the shares of one device stack up to its memory. Before
1.37 the allocator did not count a shared device's counters in later scheduling cycles
(kubernetes#139034, fixed by #139040), so a board's share and its chip's share could both be
given: hence opt-in, as no slice written back can tell which scheduler runs. The share a claim
got reaches its containers as an advisory variable (:mod:`ix_gpu.dra.prepare`); nothing enforces
it. Pods can also share a GPU by sharing one ResourceClaim, on any cluster.

Names (:mod:`ix_gpu.node.devices.dra_names`): a chip device is ``gpu-<index>`` and a board device
``board-<index of its first chip>`` (a one-chip board is ``gpu-<index>`` when partitionable, as
it is a chip too).

Identity: ``uuid`` names the device itself, so a selector on it matches one device. A one-chip
device (a chip, or a one-chip board) carries that chip's UUID, which is what a selector should
match on when it means one physical GPU. A device of several chips (a whole board) carries
:func:`board_uuid`, ``board-<UUID of its first chip>``: its own, unique in the cluster as the
chip's is, and never a chip's, so ``uuid == "<a chip's UUID>"`` through the catch-all DeviceClass
selects that chip and not the board that holds it (the board would give away its neighbour too).
The attribute stays on every device because a CEL lookup of an attribute a device lacks is a
runtime error that fails the claim's allocation rather than skipping the device. ``board`` is
the backend's board identifier, equal on a board and its chips: ``board == "<id>" && wholeBoard``
selects a board, ``board == "<id>" && chips == 1`` its chips.

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

import collections
import dataclasses
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
    whole_board: bool
    """The device is every chip of its board (a one-chip board's chip is one too)."""
    default_form: bool = True
    """The default DeviceClass selects it: the form ``splitboard`` picks."""
    counter_set: str | None = None
    """The board's counter set it consumes from (partitionable layout, multi-chip boards only)."""
    shares: int = 1
    """Above 1: claims share the device, each taking whole shares of its memory (module doc)."""

    @property
    def share_mib(self) -> int:
        """One share of the device's memory, in MiB (the whole memory when not shared)."""
        return self.physical.memory_mib // self.shares

    @property
    def healthy(self) -> bool:
        return all(chip.healthy for chip in self.physical.chips)

    @property
    def unhealthy_reason(self) -> str:
        return "; ".join(chip.unhealthy_reason for chip in self.physical.chips if chip.unhealthy_reason)


def dra_devices(
    chips: Iterable[Chip], *, splitboard: bool, partitionable: bool = False, shares: int = 1
) -> tuple[DraDevice, ...]:
    """This node's devices, in device-node order (what ``ix-gpu devices`` prints); with
    ``partitionable``, each multi-chip board is followed by its chips; with ``shares`` above 1,
    every device of that layout is shared (module doc)."""
    chips = list(chips)
    if shares > 1:
        # At most one share per MiB: a device of unknown (0) memory is not shared.
        laid_out = dra_devices(chips, splitboard=splitboard, partitionable=partitionable)
        return tuple(
            dataclasses.replace(device, shares=max(1, min(shares, device.physical.memory_mib)))
            for device in laid_out
        )
    board_size = collections.Counter(chip.board_id for chip in chips)
    out: list[DraDevice] = []
    for phys in physical_devices(chips, splitboard=not partitionable and splitboard):
        if not partitionable:
            whole = len(phys.chips) == board_size[phys.board_id]
            out.append(DraDevice(dra_device_name(phys, board=not splitboard), phys, whole_board=whole))
        elif len(phys.chips) == 1:
            out.append(DraDevice(dra_device_name(phys, board=False), phys, whole_board=True))
        else:
            counters = dra_device_name(phys, board=True)
            out.append(DraDevice(counters, phys, True, default_form=not splitboard, counter_set=counters))
            for chip in (PhysicalDevice(id=c.uuid, chips=(c,), board_id=c.board_id) for c in phys.chips):
                name = dra_device_name(chip, board=False)
                out.append(DraDevice(name, chip, False, default_form=splitboard, counter_set=counters))
    names = [device.name for device in out]
    if len(set(names)) != len(names):
        raise ValueError(f"two devices would share a name (duplicate chip indices?): {sorted(names)}")
    return tuple(out)


BOARD_UUID_PREFIX = "board-"


def board_uuid(phys: PhysicalDevice) -> str:
    """A multi-chip device's own ``uuid``: derived from its first chip's, which makes it unique in
    the cluster, and prefixed, so that no selector on a chip's UUID matches it (module doc). The
    form libixml's board identifiers take, so on Iluvatar nodes it equals the ``board`` attribute."""
    return f"{BOARD_UUID_PREFIX}{phys.chips[0].uuid}"


def device_uuid(phys: PhysicalDevice) -> str:
    """The ``uuid`` attribute: the chip's UUID for one chip, :func:`board_uuid` for several."""
    return phys.chips[0].uuid if len(phys.chips) == 1 else board_uuid(phys)


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
        "uuid": _string(device_uuid(phys)),
        "index": {"int": min(chip.index for chip in phys.chips)},
        "board": _string(phys.board_id),
        "chips": {"int": len(phys.chips)},
        "wholeBoard": {"bool": device.whole_board},
        "defaultForm": {"bool": device.default_form},
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
    if device.counter_set is not None:
        entry["consumesCounters"] = [
            {
                "counterSet": device.counter_set,
                "counters": {_counter(chip): {"value": "1"} for chip in device.physical.chips},
            }
        ]
    if device.shares > 1:
        share = f"{device.share_mib}Mi"
        entry["allowMultipleAllocations"] = True
        entry["capacity"]["memory"]["requestPolicy"] = {
            "default": share,
            "validRange": {"min": share, "max": f"{device.share_mib * device.shares}Mi", "step": share},
        }
    if not device.healthy:
        reason = label_value(device.unhealthy_reason)
        entry["taints"] = [{"key": f"{driver}/unhealthy", "value": reason, "effect": TAINT_EFFECT}]
    return entry


def _counter(chip: Chip) -> str:
    """A chip's counter in its board's set: a DNS label, by the chip's index on the node."""
    return f"gpu-{chip.index}"


def counter_sets(devices: Iterable[DraDevice]) -> list[dict[str, Any]]:
    """``spec.sharedCounters`` for ``devices``: one set per multi-chip board, named like the board's
    device, with one counter of 1 per chip. A board consumes all of them and a chip its own, so
    the board and any of its chips, or one chip twice, never fit together."""
    sets: dict[str, dict[str, Any]] = {}
    for device in devices:
        if device.counter_set is not None:
            counters = sets.setdefault(device.counter_set, {"name": device.counter_set, "counters": {}})
            counters["counters"].update({_counter(chip): {"value": "1"} for chip in device.physical.chips})
    return list(sets.values())


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
