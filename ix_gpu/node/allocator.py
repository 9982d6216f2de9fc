"""One allocator per node: the device plugin or the DRA plugin hands out a node's GPUs, never both.

The operator picks per node with the label ``ix-gpu.io/gpu.allocation``:

- absent or ``device-plugin``: the device plugin advertises the GPUs; the DRA plugin's
  ResourceSlice lists no device and it prepares no new claim;
- ``dra``: the DRA plugin publishes them; the device plugin advertises none;
- anything else: neither. A typo must not hand the chips out twice.

Absent means ``device-plugin`` so that a cluster which never heard of DRA keeps working unlabelled.

The label alone cannot make a switch safe: each process reads it on its own timer, so for up to an
interval the old allocator would still offer the chips while the new one already does. So each
process also waits until the API server shows that the other one has withdrawn:

- the DRA plugin publishes only while the node's ``status.allocatable`` offers nothing of its
  vendor's device-plugin domain (``iluvatar.com/*``): the kubelet sets it to 0 once the device
  plugin advertises nothing, or once no device plugin runs there;
- the device plugin, when told the DRA driver's name, advertises only while no ResourceSlice of
  that driver for this node lists a device, and advertises nothing while it cannot tell.

Either check alone already refuses the double offer in its direction, whatever the other process
does or how the chart was rendered. What neither can see is a chip a running pod still holds from
the previous allocator: switch a node's mode only after its GPU pods are gone.

Pure: the processes read the Node and the slices and pass what they found.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from ix_gpu.devicemodel import labels

LABEL: Final = labels.GPU_ALLOCATION
DEVICE_PLUGIN: Final = "device-plugin"
DRA: Final = "dra"
MODES: Final = (DEVICE_PLUGIN, DRA)


@dataclass(frozen=True)
class NodeFacts:
    """What both processes need of their Node: its labels and the kubelet's allocatable."""

    labels: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, str] = field(default_factory=dict)
    uid: str = ""
    """Which Node of that name: a Node deleted and registered again is another object, and what
    was owned by the old one (a DRA plugin's ResourceSlices) went with it."""

    @classmethod
    def from_node(cls, node: object) -> NodeFacts:
        """From a Node as the API server returns it; anything malformed reads as empty."""
        if not isinstance(node, dict):
            return cls()
        metadata = node.get("metadata") or {}
        uid = metadata.get("uid") if isinstance(metadata, dict) else None
        return cls(
            _strings(metadata.get("labels") if isinstance(metadata, dict) else None),
            _strings((node.get("status") or {}).get("allocatable")),
            uid if isinstance(uid, str) else "",
        )


def _strings(found: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str


def node_mode(node_labels: Mapping[str, str]) -> str | None:
    """``device-plugin`` or ``dra``; None for a value that is neither."""
    value = node_labels.get(LABEL)
    if value is None or value == "":
        return DEVICE_PLUGIN
    return value if value in MODES else None


def _mode_problem(node_labels: Mapping[str, str]) -> str:
    return (
        f"node label {LABEL}={node_labels.get(LABEL, '')[:63]!r} is neither {DEVICE_PLUGIN!r} nor {DRA!r}: "
        "no allocator hands out this node's GPUs until it is fixed"
    )


def device_plugin_verdict(
    node: NodeFacts | None, dra_driver: str | None = None, dra_devices: int | None = 0
) -> Verdict:
    """May the device plugin advertise this node's GPUs?

    ``node``: None when it could not be read yet. ``dra_driver``: the DRA driver that may run in
    this cluster (None: none is expected; then an unreadable node is no reason to stop).
    ``dra_devices``: how many devices that driver's ResourceSlices for this node list, None when
    they could not be listed.
    """
    if node is None:
        if dra_driver is None:
            return Verdict(True, "node not read; no DRA driver expected")
        return Verdict(False, "cannot read this node's allocation label yet")
    mode = node_mode(node.labels)
    if mode is None:
        return Verdict(False, _mode_problem(node.labels))
    if mode == DRA:
        return Verdict(False, f"node labelled {LABEL}={DRA}: the DRA plugin hands out its GPUs")
    if dra_driver is None:
        return Verdict(True, f"node in {DEVICE_PLUGIN} mode")
    if dra_devices is None:
        return Verdict(False, f"cannot list the ResourceSlices of {dra_driver} for this node")
    if dra_devices > 0:
        return Verdict(
            False,
            f"ResourceSlices of {dra_driver} still list {dra_devices} devices on this node "
            "(waiting for the DRA plugin to withdraw them)",
        )
    return Verdict(True, f"node in {DEVICE_PLUGIN} mode, no {dra_driver} devices published")


def device_plugin_offer(allocatable: Mapping[str, str], domain: str) -> dict[str, str]:
    """The resources of ``domain`` (``iluvatar.com``) the kubelet offers, with a positive count:
    a renamed or time-sliced resource of the device plugin stays in its vendor's domain. A value
    that is not a plain count is taken as an offer."""
    offered = {}
    for name, quantity in allocatable.items():
        if name.partition("/")[0] != domain:
            continue
        if not (quantity.isdigit() and int(quantity) == 0):
            offered[name] = quantity
    return offered


def dra_verdict(node: NodeFacts | None, domain: str) -> Verdict:
    """May the DRA plugin publish this node's GPUs and prepare new claims? ``domain``: the
    vendor's device-plugin resource domain."""
    if node is None:
        return Verdict(False, "cannot read this node's allocation label yet")
    mode = node_mode(node.labels)
    if mode is None:
        return Verdict(False, _mode_problem(node.labels))
    if mode != DRA:
        how = f"labelled {LABEL}={mode}" if node.labels.get(LABEL) else f"without the label {LABEL}={DRA}"
        return Verdict(False, f"node {how}: the device plugin hands out its GPUs")
    offered = device_plugin_offer(node.allocatable, domain)
    if offered:
        listed = ", ".join(f"{name}={count}" for name, count in sorted(offered.items()))
        return Verdict(
            False,
            f"the kubelet still offers {listed} from a device plugin (waiting for it to advertise none)",
        )
    return Verdict(True, f"node labelled {LABEL}={DRA}, no device-plugin GPUs offered")
