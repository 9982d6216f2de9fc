"""What ``ix-gpu status`` shows, computed from objects already read: a pure function, so every case
(device-plugin, DRA and mixed nodes; a plugin whose /metrics could not be read) is a unit test.

Where each fact comes from, and why there:

- **The nodes** and which allocator serves each: the ``ix-gpu.io/gpu.allocation`` label (``dra``)
  and the extended resource in ``status.allocatable`` (the device plugin's count).
- **In use on a device-plugin node:** the GPUs the node's pods ask for (pods not finished), as the
  scheduler counts them. Which chip each pod got is the kubelet's secret; the device plugin reads
  it from the kubelet's PodResources API and publishes it on its /metrics
  (``ix_gpu_chip_allocation``), which is where the chips and their holders come from.
- **A DRA node:** the devices of its ResourceSlices (a NoSchedule or NoExecute taint makes one
  unhealthy) and the ResourceClaims allocated on them, with the pods each claim is reserved for:
  all of it in the API, so it is exact even where the plugin's /metrics cannot be read.
- **Chips and their health:** the device plugin's /metrics (``ix_gpu_chip_telemetry_stale`` lists
  every chip; ``ix_gpu_chip_health_problem`` its decoded health bits). Without them (telemetry off,
  the metrics port not reachable, a page that is not Prometheus text, two plugin pods on the node)
  a node shows its counts only, and its note says why: one node's trouble is that node's alone.
- **Pods not believed as device plugins** (:mod:`ix_gpu.status.trust`): listed with why, and the
  note of a node that has no other says so; their /metrics were never read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ix_gpu.devicemodel import labels

UNSCHEDULABLE_TAINTS = ("NoSchedule", "NoExecute")
NODE_LABELS = (labels.GPU_ALLOCATION, labels.GPU_PRODUCT)
"""The node labels the view reads (``ix_gpu.status.read`` keeps these and drops the rest)."""


@dataclass
class ChipStatus:
    uuid: str
    index: int
    board: str
    product: str
    problems: list[str] = field(default_factory=list)
    holders: list[str] = field(default_factory=list)
    """``namespace/pod`` (the device plugin's), or ``namespace/pod (claim namespace/name)``."""

    @property
    def health(self) -> str:
        return "Unhealthy" if self.problems else "Healthy"


@dataclass
class DeviceStatus:
    """One device of a node's ResourceSlice."""

    name: str
    uuid: str
    healthy: bool
    claims: list[str] = field(default_factory=list)
    """``namespace/name`` of each claim allocated this device."""
    pods: list[str] = field(default_factory=list)
    """``namespace/pod`` of each pod those claims are reserved for."""
    default_form: bool = True
    """The default DeviceClass selects it (partitionable boards: the form splitboard picks)."""
    counters: frozenset[tuple[str, str]] = frozenset()
    """The shared counters it consumes: a device that shares one with a claimed device is taken."""


@dataclass
class NodeStatus:
    name: str
    allocator: str
    """``device-plugin``, ``dra`` or ``none``."""
    product: str
    total: int
    """GPUs the scheduler can see here: the device plugin's allocatable count (healthy devices),
    or the DRA devices of the node's slices that the default DeviceClass selects."""
    in_use: int
    free: int
    """What a new pod could get now: not in use, and healthy."""
    chips: list[ChipStatus] = field(default_factory=list)
    devices: list[DeviceStatus] = field(default_factory=list)
    note: str = ""
    """Why chips are missing, when they are: the plugin's /metrics could not be read or parsed,
    there is no plugin pod here, or two."""


NodeChips = list[ChipStatus] | str
"""A node's chips as its device plugin's /metrics lists them, or why they are unknown."""


@dataclass
class ClusterStatus:
    resource: str
    driver: str
    nodes: list[NodeStatus]
    untrusted: list[dict[str, str]] = field(default_factory=list)
    """Each pod listed as a device plugin and not believed: ``pod``, ``node`` and ``reason``."""

    def as_json(self) -> dict[str, Any]:
        nodes = []
        for node in self.nodes:
            entry = asdict(node)
            for chip, data in zip(node.chips, entry["chips"], strict=True):
                data["health"] = chip.health
            for device in entry["devices"]:
                del device["counters"]  # how in_use is counted, not a fact of its own
            nodes.append(entry)
        totals = {
            "total": sum(n.total for n in self.nodes),
            "inUse": sum(n.in_use for n in self.nodes),
            "free": sum(n.free for n in self.nodes),
        }
        return {
            "resource": self.resource,
            "driver": self.driver,
            "totals": totals,
            "nodes": nodes,
            "untrustedPlugins": self.untrusted,
        }


def _quantity(value: Any) -> int:
    """An extended resource's count (whole numbers only: ``"8"``, ``8``)."""
    try:
        return int(str(value))
    except ValueError:
        return 0


def _pod_gpus(pod: Mapping[str, Any], resource: str) -> int:
    """GPUs a pod holds as the scheduler counts them: the sum over its containers, or its largest
    init container's, whichever is more (extended resources: requests equal limits)."""
    spec = pod.get("spec") or {}

    def asked(container: Mapping[str, Any]) -> int:
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        return _quantity(limits.get(resource, requests.get(resource, 0)))

    regular = sum(asked(c) for c in spec.get("containers") or [])
    init = max((asked(c) for c in spec.get("initContainers") or []), default=0)
    return max(regular, init)


def chips_from_metrics(text: str, node: str) -> list[ChipStatus]:
    """The chips of ``node`` in a device plugin's /metrics, with their problems and holders."""
    chips: dict[str, ChipStatus] = {}
    problems: list[tuple[str, str]] = []
    holders: list[tuple[str, str]] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found = sample.labels
            if found.get("node") != node or "uuid" not in found:
                continue
            if sample.name == "ix_gpu_chip_telemetry_stale":
                chips[found["uuid"]] = ChipStatus(
                    uuid=found["uuid"],
                    index=_quantity(found.get("index", "0")),
                    board=found.get("board", ""),
                    product=found.get("product", ""),
                )
            elif sample.name == "ix_gpu_chip_health_problem" and sample.value == 1:
                problems.append((found["uuid"], found.get("problem", "")))
            elif sample.name == "ix_gpu_chip_allocation":
                who = f"{found.get('namespace')}/{found.get('pod')}"
                if found.get("claim"):
                    who += f" (claim {found['claim']})"
                holders.append((found["uuid"], who))
    for uuid, problem in problems:
        if uuid in chips:
            chips[uuid].problems.append(problem)
    for uuid, who in holders:
        if uuid in chips and who not in chips[uuid].holders:
            chips[uuid].holders.append(who)
    return sorted(chips.values(), key=lambda c: c.index)


def _results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results: list[Mapping[str, Any]] = (allocation.get("devices") or {}).get("results") or []
    return results


def _claims_by_pool(claims: Sequence[Mapping[str, Any]], driver: str) -> dict[str, list[int]]:
    """The claims (their indexes) with a device of ``driver`` allocated in each pool: read once, so
    that each DRA node looks at its own claims and not at every claim of the cluster (5,000 DRA
    nodes and as many claims took the view 30 s that way)."""
    by_pool: dict[str, list[int]] = {}
    for index, claim in enumerate(claims):
        for pool in {str(r.get("pool")) for r in _results(claim) if r.get("driver") == driver}:
            by_pool.setdefault(pool, []).append(index)
    return by_pool


def _devices(
    node: str,
    driver: str,
    slices: Iterable[Mapping[str, Any]],
    claims: Sequence[Mapping[str, Any]],
    by_pool: Mapping[str, list[int]],
) -> list[DeviceStatus]:
    """The devices of ``node``'s ``slices`` (the driver's, on that node), with the claims of
    ``claims`` allocated each (``by_pool``: :func:`_claims_by_pool`)."""
    devices: dict[str, DeviceStatus] = {}
    pools: set[str] = set()
    for slice_ in slices:
        spec = slice_.get("spec") or {}
        pool = (spec.get("pool") or {}).get("name", node)
        pools.add(str(pool))
        for device in spec.get("devices") or []:
            attributes = device.get("attributes") or {}
            uuid = (attributes.get("uuid") or {}).get("string", "")
            taints = device.get("taints") or []
            healthy = not any(t.get("effect") in UNSCHEDULABLE_TAINTS for t in taints)
            default = (attributes.get("defaultForm") or {}).get("bool", True) is not False
            counters = frozenset(
                (str(use.get("counterSet")), str(counter))
                for use in device.get("consumesCounters") or []
                for counter in use.get("counters") or {}
            )
            devices[f"{pool}/{device['name']}"] = DeviceStatus(
                device["name"], uuid, healthy, [], [], default, counters
            )
    for index in sorted({i for pool in pools for i in by_pool.get(pool, ())}):
        claim = claims[index]
        meta, status, results = claim.get("metadata") or {}, claim.get("status") or {}, _results(claim)
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        pods = [
            f"{meta.get('namespace')}/{r.get('name')}"
            for r in status.get("reservedFor") or []
            if r.get("resource") == "pods"
        ]
        for result in results:
            if result.get("driver") != driver:
                continue
            device = devices.get(f"{result.get('pool')}/{result.get('device')}")
            if device is not None and name not in device.claims:
                device.claims.append(name)
                device.pods.extend(p for p in pods if p not in device.pods)
    return sorted(devices.values(), key=lambda d: d.name)


def cluster_status(
    *,
    resource: str,
    driver: str,
    nodes: Sequence[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    slices: Sequence[Mapping[str, Any]],
    claims: Sequence[Mapping[str, Any]],
    chips: Mapping[str, NodeChips],
    no_plugin: str = "",
    untrusted: Sequence[Mapping[str, str]] = (),
) -> ClusterStatus:
    """The GPU nodes among ``nodes`` (those with ``resource``, the DRA allocation label or a slice
    of ``driver``), each with what is in use and free. ``chips``: each node's chips as its device
    plugin's /metrics lists them (:func:`chips_from_metrics`), or the note saying why they are
    unknown; ``no_plugin``: the note of a GPU node absent from ``chips`` (empty: none, as when
    the chips were not asked for); ``untrusted``: the pods listed as device plugins and not
    believed (``pod``, ``node``, ``reason``), named in the note of a node absent from ``chips``."""
    doubted: dict[str, list[str]] = {}
    for entry in untrusted:
        doubted.setdefault(entry["node"], []).append(f"{entry['pod']} ({entry['reason']})")
    asked: dict[str, int] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if node and phase not in ("Succeeded", "Failed"):
            asked[node] = asked.get(node, 0) + _pod_gpus(pod, resource)
    slices_by_node: dict[Any, list[Mapping[str, Any]]] = {}
    for slice_ in slices:
        spec = slice_.get("spec") or {}
        if spec.get("driver") == driver:
            slices_by_node.setdefault(spec.get("nodeName"), []).append(slice_)
    claims_by_pool = _claims_by_pool(claims, driver)
    out = []
    for node in nodes:
        meta = node.get("metadata") or {}
        name, node_labels = meta.get("name", ""), meta.get("labels") or {}
        allocatable = _quantity(((node.get("status") or {}).get("allocatable") or {}).get(resource, 0))
        dra = node_labels.get(labels.GPU_ALLOCATION) == "dra" or (name in slices_by_node and not allocatable)
        if not dra and not allocatable and name not in chips:
            continue
        status = NodeStatus(
            name=name,
            allocator="dra" if dra else ("device-plugin" if allocatable else "none"),
            product=node_labels.get(labels.GPU_PRODUCT, ""),
            total=0,
            in_use=0,
            free=0,
        )
        if dra:
            status.devices = _devices(name, driver, slices_by_node.get(name, []), claims, claims_by_pool)
            # Counted in the form the default DeviceClass selects: with partitionable boards a
            # board and its chips are all listed, and a chip is taken when its board is.
            claimed = [d.counters for d in status.devices if d.claims]
            counted = [d for d in status.devices if d.default_form]
            taken = [bool(d.claims) or any(d.counters & used for used in claimed) for d in counted]
            status.total = len(counted)
            status.in_use = sum(taken)
            status.free = sum(d.healthy and not busy for d, busy in zip(counted, taken, strict=True))
        else:
            status.total, status.in_use = allocatable, asked.get(name, 0)
            status.free = max(allocatable - status.in_use, 0)
        found = chips.get(name)
        if isinstance(found, str):
            status.note = found
        elif found is not None:
            status.chips = found
        elif name in doubted:
            status.note = f"chips unknown: its device-plugin pod is not believed: {'; '.join(doubted[name])}"
        else:
            status.note = no_plugin
        out.append(status)
    nodes_out = sorted(out, key=lambda n: n.name)
    return ClusterStatus(
        resource=resource, driver=driver, nodes=nodes_out, untrusted=[dict(u) for u in untrusted]
    )


def render_text(status: ClusterStatus) -> str:
    """A table of nodes, then each node's chips (or DRA devices) and who holds them."""
    rows = [("NODE", "ALLOCATOR", "PRODUCT", "GPUS", "IN USE", "FREE")]
    rows += [
        (n.name, n.allocator, n.product or "-", str(n.total), str(n.in_use), str(n.free))
        for n in status.nodes
    ]
    lines = _table(rows)
    total, used, free = (sum(getattr(n, k) for n in status.nodes) for k in ("total", "in_use", "free"))
    lines.append(f"{len(status.nodes)} GPU nodes: {total} GPUs, {used} in use, {free} free")
    if status.untrusted:
        lines.append("Not believed as device plugins (their /metrics were not read):")
        lines.extend(f"  {u['pod']} on {u['node'] or '-'}: {u['reason']}" for u in status.untrusted)
    for node in status.nodes:
        lines.append("")
        lines.append(f"{node.name} ({node.allocator})" + (f": {node.note}" if node.note else ""))
        if node.chips:
            chip_rows = [("  INDEX", "UUID", "BOARD", "PRODUCT", "HEALTH", "HELD BY")]
            for chip in node.chips:
                health = chip.health + (f" ({', '.join(chip.problems)})" if chip.problems else "")
                chip_rows.append(
                    (
                        f"  {chip.index}",
                        chip.uuid,
                        chip.board,
                        chip.product,
                        health,
                        ", ".join(chip.holders) or "-",
                    )
                )
            lines.extend(_table(chip_rows))
        if node.devices:
            device_rows = [("  DEVICE", "UUID", "HEALTH", "CLAIMS", "PODS")]
            for device in node.devices:
                device_rows.append(
                    (
                        f"  {device.name}",
                        device.uuid or "-",
                        "Healthy" if device.healthy else "Unhealthy",
                        ", ".join(device.claims) or "-",
                        ", ".join(device.pods) or "-",
                    )
                )
            lines.extend(_table(device_rows))
    return "\n".join(lines) + "\n"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
