"""Whose is each chip: the kubelet's PodResources answer (what it allocated to each container)
turned into holders per chip, on all three allocation paths. Pure: the caller reads the API.

- **Device plugin:** a container's device IDs of our resource are the IDs the plugin advertised: a
  chip's UUID, a board's (every chip of the board), or a time-slicing replica ``<id>::<n>`` (the
  chips of ``<id>``, shared with the other replicas' holders).
- **DRA:** a claim's devices of our driver in this node's pool, by device name
  (:mod:`ix_gpu.node.devices.dra_names`). A claim shared by several pods, or several claims on a
  chip, give the chip several holders, each with its claim.

Each holder gets its own series; the chip's figures stay unlabelled by pod, so no sum over holders
counts a chip twice.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ix_gpu.node.backends.base import Chip
from ix_gpu.node.devices.dra_names import chips_of_dra_device


@dataclass(frozen=True, order=True)
class Holder:
    namespace: str
    pod: str
    container: str
    claim: str = ""
    """``<namespace>/<name>`` of the DRA claim; empty for a device-plugin allocation."""


@dataclass(frozen=True)
class ContainerDevices:
    """One container of one pod, as PodResources lists it: its device-plugin device IDs by
    resource name, and its DRA devices as (claim namespace/name, driver, pool, device)."""

    namespace: str
    pod: str
    container: str
    devices: Mapping[str, Sequence[str]]
    claims: Sequence[tuple[str, str, str, str]] = ()


def replica_base(device_id: str) -> str:
    """A time-slicing replica's ID names its device before ``::``."""
    return device_id.split("::", 1)[0]


def holders_by_chip(
    containers: Iterable[ContainerDevices],
    chips: Sequence[Chip],
    *,
    resources: Collection[str],
    device_chips: Mapping[str, Sequence[str]],
    dra_driver: str | None,
    pool: str,
) -> dict[str, list[Holder]]:
    """Chip UUID → its holders, sorted. ``resources``: the names the device plugin advertises
    under (another plugin's IDs may look like ours); ``device_chips``: each device ID it makes of
    the chips → their UUIDs; ``dra_driver``/``pool``: which DRA devices are ours."""
    known = {chip.uuid for chip in chips}
    found: dict[str, set[Holder]] = {}
    for entry in containers:
        holder = Holder(entry.namespace, entry.pod, entry.container)
        for resource in resources:
            for device_id in entry.devices.get(resource, ()):
                uuids = device_chips.get(device_id) or device_chips.get(replica_base(device_id), ())
                for uuid in uuids:
                    if uuid in known:
                        found.setdefault(uuid, set()).add(holder)
        for claim, driver, claim_pool, device in entry.claims:
            if dra_driver is None or driver != dra_driver or claim_pool != pool:
                continue
            holder = Holder(entry.namespace, entry.pod, entry.container, claim)
            for chip in chips_of_dra_device(device, chips):
                found.setdefault(chip.uuid, set()).add(holder)
    return {uuid: sorted(holders) for uuid, holders in found.items()}
