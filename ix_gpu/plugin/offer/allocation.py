"""Allocate and GetPreferredAllocation as pure functions of the current device list.

Kept free of gRPC so the rules can be tested directly and so the servicer stays a thin adapter.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from ix_gpu.config.plugin_runtime import (
    DeviceIdStrategy,
    DeviceListStrategy,
    ReplicaPolicy,
    RuntimeConfig,
)
from ix_gpu.devicemodel.vendors import Vendor
from ix_gpu.node.devices.cdi import qualified_name
from ix_gpu.node.devices.device_list import Device, DeviceList, PhysicalDevice

log = logging.getLogger(__name__)

REPLICA_DEVICES_ENV = "IX_REPLICA_DEVICES"
"""Lists the replica IDs a container got, so a time-slicing-aware runtime can tell sharing apart."""
DEVICE_PERMISSIONS = "rw"


ECHO_CHARS = 64
"""How much of a caller-supplied ID a message repeats: enough to recognise a real device ID (a UUID
is 40 characters), never enough to let the caller choose the size of our answers or log lines."""


class AllocationError(ValueError):
    """The request cannot be honoured; the message goes back to the kubelet (INVALID_ARGUMENT).

    Build messages with :func:`echo` for anything the caller sent: the message travels back as gRPC
    status details, inside HTTP/2 headers that clients cap (16 KiB in gRPC C-core), and a message
    echoing a 1 MB ID made the client see RESOURCE_EXHAUSTED instead of INVALID_ARGUMENT.
    """


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out, so a reader can tell
    a cut message from a whole one."""
    if len(text) <= limit:
        return text
    left = len(text) - limit
    return f"{text[:limit]}... ({left} more character{'' if left == 1 else 's'})"


def echo(value: str, limit: int = ECHO_CHARS) -> str:
    """``value`` quoted for a message: :func:`repr` (so control characters cannot forge log lines
    or break the kubelet's event text) of at most ``limit`` characters, then how many were cut."""
    if len(value) <= limit:
        return repr(value)
    left = len(value) - limit
    return f"{value[:limit]!r}... ({left} more character{'' if left == 1 else 's'})"


@dataclass(frozen=True)
class DeviceNode:
    host_path: str
    container_path: str
    permissions: str = DEVICE_PERMISSIONS


@dataclass(frozen=True)
class ContainerAllocation:
    envs: dict[str, str]
    device_nodes: tuple[DeviceNode, ...]
    cdi_devices: tuple[str, ...] = ()
    """Fully qualified CDI names (``deviceListStrategy: cdi``); the device nodes are then in the
    CDI spec, not in ``device_nodes``."""


def check_container_count(containers: int, devices: DeviceList) -> None:
    """Reject a request naming more containers than this plugin advertises devices.

    Each container is answered in tens of microseconds, but a 4 MB request can name hundreds of
    thousands of containers, which kept the plugin busy for many seconds per call. No real request
    comes near the bound: the kubelet sends one container per call, and containers of one pod never
    share a device, so a request can hold at most one container per advertised device.
    """
    if containers > max(len(devices.devices), 1):
        raise AllocationError(
            f"{containers} containers in one request, but this plugin advertises {len(devices.devices)} "
            "devices and each container needs one of its own (the kubelet sends one container per call)"
        )


def allocate_container(
    device_ids: Sequence[str],
    devices: DeviceList,
    *,
    vendor: Vendor,
    control_nodes: Sequence[str],
    config: RuntimeConfig,
) -> ContainerAllocation:
    """What one container needs for ``device_ids``: its chips' device nodes, the control nodes,
    and the visible-devices variable.

    A repeated ID is the same device and counts once (the kubelet never repeats one): otherwise a
    request repeating one ID 100,000 times would be answered with a replica list that long. Every
    step is linear in the request, and messages echo at most :data:`ECHO_CHARS` of any ID.
    """
    if not device_ids:
        raise AllocationError("no device IDs in the container request")
    device_ids = list(dict.fromkeys(device_ids))
    unknown = [i for i in device_ids if i not in devices.by_id]
    if unknown:
        raise AllocationError(
            f"unknown device ID {echo(unknown[0])}"
            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
            + f": not among the {len(devices.devices)} devices this plugin advertises"
        )
    # As NVIDIA's plugin decides it: the request fails when it holds a replica at all, so a list
    # that shares only some devices still hands out its whole devices in any number.
    replicas = sum(1 for i in device_ids if devices.by_id[i].replica is not None)
    if replicas and len(device_ids) > 1 and config.fail_requests_greater_than_one:
        raise AllocationError(
            f"request for {len(device_ids)} devices refused: the maximum request size for shared "
            "resources is 1 (sharing.timeSlicing.failRequestsGreaterThanOne); a time-sliced replica "
            "is not a whole GPU, request 1"
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
    if replicas:
        envs[REPLICA_DEVICES_ENV] = ",".join(device_ids)
    if config.device_list_strategy is DeviceListStrategy.CDI:
        names = tuple(qualified_name(vendor, device_id) for device_id in device_ids)
        return ContainerAllocation(envs=envs, device_nodes=(), cdi_devices=names)
    return ContainerAllocation(envs=envs, device_nodes=tuple(nodes))


def preferred_allocation(
    devices: DeviceList,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    policy: ReplicaPolicy,
) -> list[str]:
    """Choose ``size`` IDs from ``available`` for a container, ``must_include`` first.

    Whatever the request holds, the answer

    * holds only IDs that are both in ``available`` and in ``devices`` (the advertised list), each
      once: the kubelet can allocate nothing else, and an ID it did not offer is a wrong answer;
    * holds exactly ``size`` IDs when that many are usable, all of them when fewer are, and none
      when ``size`` is zero or negative;
    * starts with the ``must_include`` IDs that are usable, in request order. Those that are not
      (unknown, or no longer available) are dropped rather than returned. When more than ``size``
      of them are usable (the kubelet never sends that) the answer is the first ``size`` of them.

    The rest is chosen by topology (whole devices) or replica policy (time-sliced devices).

    Never raises: the kubelet treats a failed call as a failed pod admission, while a merely
    unhelpful answer costs nothing. A bug in the choice falls back to the first usable IDs, under
    the same rules; should even that fail, the answer is empty and the kubelet chooses itself.

    The work is linear in the request and bounded by the advertised list, not by ``size``: both
    lists are filtered against ``devices`` before anything else, so an ``allocation_size`` of 10^9
    or a million unknown IDs costs no more than the devices this node has.
    """
    try:
        return _preferred(devices, available, must_include, size, policy)
    except Exception:  # a bug here must not fail admission; log it loudly instead
        log.exception("GetPreferredAllocation failed; answering with the first available devices")
    try:
        return _first_available(devices, available, must_include, size)
    except Exception:
        log.exception("GetPreferredAllocation fallback failed; answering with no preference")
        return []


def _usable(
    devices: DeviceList, available: Sequence[str], must_include: Sequence[str], size: int
) -> tuple[list[str], list[str]]:
    """The available advertised IDs, deduplicated in request order, and the ``must_include`` IDs
    among them, cut to ``size``: the two inputs every answer is built from."""
    # Filter before deduplicating: the filtered lists are at most the advertised size, so a request
    # padded with junk IDs costs one membership test per ID and no large dict.
    usable = list(dict.fromkeys(i for i in available if i in devices.by_id))
    offered = set(usable)
    first = list(dict.fromkeys(i for i in must_include if i in offered))[: max(size, 0)]
    return usable, first


def _first_available(
    devices: DeviceList, available: Sequence[str], must_include: Sequence[str], size: int
) -> list[str]:
    """The fallback answer: the usable ``must_include`` IDs, then the other usable IDs in order."""
    if size <= 0:
        return []
    usable, first = _usable(devices, available, must_include, size)
    chosen = dict.fromkeys(first)
    for device_id in usable:
        if len(chosen) >= size:
            break
        chosen.setdefault(device_id)
    return list(chosen)


def _preferred(
    devices: DeviceList,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    policy: ReplicaPolicy,
) -> list[str]:
    if size <= 0:
        return []
    usable, chosen_ids = _usable(devices, available, must_include, size)
    taken = set(chosen_ids)
    pool = [devices.by_id[i] for i in usable if i not in taken]
    need = size - len(chosen_ids)
    if need <= 0 or not pool:
        return chosen_ids
    # ``need`` may exceed the pool (a hostile size of 10^9): the pickers stop when the pool is
    # empty, and ``_pick_topology`` still reads the true shortfall for its best-fit choice.
    chosen = [devices.by_id[i] for i in chosen_ids]
    picker = _pick_replicas if devices.shared else _pick_topology
    picked = picker(pool, chosen, need, policy)
    return chosen_ids + [d.id for d in picked]


def _pick_topology(
    pool: list[Device], chosen: list[Device], need: int, policy: ReplicaPolicy
) -> list[Device]:
    """Whole devices: stay on the boards, then the NUMA nodes, already in use by this request;
    when opening a new one, prefer the smallest that fits the rest (best fit) so big holes stay.

    Quadratic in the pool, which is fine only because whole devices are physical ones (boards or
    chips, a few dozen per node at most); time-sliced replicas go to :func:`_pick_replicas`."""
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
    free. Ties go to the board already in use, then to the earlier place in ``pool``.

    All replicas of one GPU score alike but for their place in ``pool``, so each step compares GPUs,
    each offering its earliest free replica: (need x GPUs) work rather than (need x replicas). The
    size is the pod's request, and a pod asking for thousands of replicas of a node advertising
    tens of thousands took minutes when every replica was scored at every step.
    """
    queues: dict[str, deque[tuple[int, Device]]] = {}
    for n, d in enumerate(pool):
        queues.setdefault(d.physical.id, deque()).append((n, d))
    in_request = Counter(d.physical.id for d in chosen)
    free = Counter({parent: len(queue) for parent, queue in queues.items()})
    boards = {d.physical.board_id for d in chosen}
    picked: list[Device] = []
    while len(picked) < need and queues:

        def score(parent: str) -> tuple[int, ...]:
            n, d = queues[parent][0]
            near = 0 if (not boards or d.physical.board_id in boards) else 1
            if policy is ReplicaPolicy.PACK:
                return (-in_request[parent], free[parent], near, n)
            return (in_request[parent], -free[parent], near, n)

        parent = min(queues, key=score)
        _, best = queues[parent].popleft()
        if not queues[parent]:
            del queues[parent]
        picked.append(best)
        in_request[parent] += 1
        free[parent] -= 1
        boards.add(best.physical.board_id)
    return picked
