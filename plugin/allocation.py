"""Allocate and GetPreferredAllocation as pure functions of the current device list.

Kept free of gRPC so the rules can be tested directly and so the servicer stays a thin adapter.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from devicemodel.plugin_config import DeviceIdStrategy, PluginConfig, ReplicaPolicy
from devicemodel.vendors import Vendor
from plugin.device_list import Device, DeviceList, PhysicalDevice

log = logging.getLogger(__name__)

REPLICA_DEVICES_ENV = "IX_REPLICA_DEVICES"
"""Lists the replica IDs a container got, so a time-slicing-aware runtime can tell sharing apart."""
DEVICE_PERMISSIONS = "rw"


class AllocationError(ValueError):
    """The request cannot be honoured; the message goes back to the kubelet (INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class DeviceNode:
    host_path: str
    container_path: str
    permissions: str = DEVICE_PERMISSIONS


@dataclass(frozen=True)
class ContainerAllocation:
    envs: dict[str, str]
    device_nodes: tuple[DeviceNode, ...]


def allocate_container(
    device_ids: Sequence[str],
    devices: DeviceList,
    *,
    vendor: Vendor,
    control_nodes: Sequence[str],
    config: PluginConfig,
) -> ContainerAllocation:
    """What one container needs for ``device_ids``: its chips' device nodes, the control nodes,
    and the visible-devices variable."""
    if not device_ids:
        raise AllocationError("no device IDs in the container request")
    unknown = [i for i in device_ids if i not in devices.by_id]
    if unknown:
        raise AllocationError(
            f"unknown device ID {unknown[0]!r}"
            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
            + f": not among the {len(devices.devices)} devices this plugin advertises"
        )
    if devices.shared and config.sharing.time_slicing.fail_requests_greater_than_one and len(device_ids) > 1:
        raise AllocationError(
            f"{len(device_ids)} shared devices requested but sharing.timeSlicing.failRequestsGreaterThanOne "
            "is set: a time-sliced replica is not a whole GPU, request 1"
        )
    physical: dict[str, PhysicalDevice] = {}
    for device_id in device_ids:
        phys = devices.by_id[device_id].physical
        physical.setdefault(phys.id, phys)
    chips = [chip for phys in physical.values() for chip in phys.chips]
    nodes = [DeviceNode(vendor.device_node(c.minor), vendor.device_node(c.minor)) for c in chips]
    nodes.extend(DeviceNode(path, path) for path in control_nodes)
    if config.device_id_strategy is DeviceIdStrategy.INDEX:
        visible = ",".join(str(c.index) for c in chips)
    else:
        visible = ",".join(c.uuid for c in chips)
    envs = {vendor.visible_devices_env: visible}
    if devices.shared:
        envs[REPLICA_DEVICES_ENV] = ",".join(device_ids)
    return ContainerAllocation(envs=envs, device_nodes=tuple(nodes))


def preferred_allocation(
    devices: DeviceList,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    policy: ReplicaPolicy,
) -> list[str]:
    """Choose ``size`` IDs from ``available``, always keeping ``must_include``.

    Never raises: the kubelet treats a failed call as a failed pod admission, while a merely
    unhelpful answer costs nothing. Asked for more than is available, it returns what there is.
    """
    try:
        return _preferred(devices, available, must_include, size, policy)
    except Exception:  # a bug here must not fail admission; log it loudly instead
        log.exception("GetPreferredAllocation failed; answering with the first available devices")
        chosen = list(dict.fromkeys(must_include))
        chosen.extend(i for i in available if i not in chosen)
        return chosen[: max(size, len(set(must_include)))]


def _preferred(
    devices: DeviceList,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    policy: ReplicaPolicy,
) -> list[str]:
    chosen_ids = list(dict.fromkeys(must_include))
    need = size - len(chosen_ids)
    if need <= 0:
        return chosen_ids
    chosen = [devices.by_id[i] for i in chosen_ids if i in devices.by_id]
    taken = set(chosen_ids)
    pool = [devices.by_id[i] for i in dict.fromkeys(available) if i in devices.by_id and i not in taken]
    picker = _pick_replicas if devices.shared else _pick_topology
    picked = picker(pool, chosen, need, policy)
    return chosen_ids + [d.id for d in picked]


def _pick_topology(
    pool: list[Device], chosen: list[Device], need: int, policy: ReplicaPolicy
) -> list[Device]:
    """Whole devices: stay on the boards, then the NUMA nodes, already in use by this request;
    when opening a new one, prefer the smallest that fits the rest (best fit) so big holes stay."""
    order = {d.id: n for n, d in enumerate(pool)}
    selection = list(chosen)
    remaining = list(pool)
    picked: list[Device] = []
    while len(picked) < need and remaining:
        scores = _topology_scores(remaining, selection, need - len(picked), order)
        best = min(remaining, key=lambda d: scores[d.id])
        remaining.remove(best)
        picked.append(best)
        selection.append(best)
    return picked


def _topology_scores(
    remaining: list[Device], selection: list[Device], left: int, order: dict[str, int]
) -> dict[str, tuple[int, int, tuple[int, int], int]]:
    boards = {d.physical.board_id for d in selection}
    numas = {d.physical.numa_node for d in selection}
    per_board = Counter(d.physical.board_id for d in remaining)
    per_numa = Counter(d.physical.numa_node for d in remaining)
    scores = {}
    for d in remaining:
        board, numa = d.physical.board_id, d.physical.numa_node
        same_board = 0 if board in boards else 1
        # Nothing chosen yet: prefer a NUMA node that can hold the whole request.
        fits_numa = numa in numas if selection else per_numa[numa] >= left
        fit = (0, per_board[board]) if per_board[board] >= left else (1, -per_board[board])
        scores[d.id] = (same_board, 0 if fits_numa else 1, fit, order[d.id])
    return scores


def _pick_replicas(
    pool: list[Device], chosen: list[Device], need: int, policy: ReplicaPolicy
) -> list[Device]:
    """Time-sliced replicas. ``spread``: one replica per physical GPU before doubling up, least
    used GPU first. ``pack``: the busiest GPU that still has a free replica first, keeping whole GPUs
    free."""
    order = {d.id: n for n, d in enumerate(pool)}
    in_request = Counter(d.physical.id for d in chosen)
    free = Counter(d.physical.id for d in pool)
    boards = {d.physical.board_id for d in chosen}
    remaining = list(pool)
    picked: list[Device] = []
    while len(picked) < need and remaining:

        def score(d: Device) -> tuple[int, ...]:
            parent = d.physical.id
            near = 0 if (not boards or d.physical.board_id in boards) else 1
            if policy is ReplicaPolicy.PACK:
                return (-in_request[parent], free[parent], near, order[d.id])
            return (in_request[parent], -free[parent], near, order[d.id])

        best = min(remaining, key=score)
        remaining.remove(best)
        picked.append(best)
        in_request[best.physical.id] += 1
        free[best.physical.id] -= 1
        boards.add(best.physical.board_id)
    return picked
