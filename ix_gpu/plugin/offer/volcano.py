"""Volcano's choice (``flags.usevolcano``): which pod an Allocate is for, what it may bind, and
which chips this node's pods hold. Pure: the pods, the kubelet's PodResources and the device list
come in as arguments (:mod:`ix_gpu.plugin.server.volcano` reads them).

With Iluvatar's ix-volcano-plugin, Volcano's scheduler chooses the devices and writes them in the
pod's ``iluvatar.com/DevVolcano`` annotation, with ``predicate-time``; the kubelet's AllocateRequest
names only the devices the kubelet chose, not the pod. As Iluvatar's plugin 4.4 does, the pod is
the candidate with the smallest predicate-time among this node's pods that wait for their devices
and whose DevVolcano names as many devices as the kubelet asked for.

What 4.4 does not do, and this does: Volcano's devices are bound only when every one is
advertised here, Healthy, and held by no other pod; otherwise the kubelet's choice is bound,
unless one of its chips is held (then the allocation is refused: binding it would give one chip
to two pods). "Held" is what is physically bound, which on such a node differs from what the
kubelet believes: this process's bindings, else a pod's ``iluvatar.com/DevRealAlloc`` (written
back after each binding, so a restarted plugin still knows it) where the kubelet's PodResources
backs it, else what PodResources lists for the pod (:func:`holdings`).

Pods' annotations are their owners' to write. A tenant's pod can name devices in its own
DevVolcano and an early predicate-time, and so steer which free device another waiting pod of the
same size gets (as with 4.4). Its DevRealAlloc counts only where its DevKubelet names the devices
the kubelet really gave it (and the chart's policy lets nobody but the plugin write either).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ix_gpu.node.devices.device_list import REPLICA_SEPARATOR, DeviceList
from ix_gpu.plugin.offer.allocation import echo

DEV_VOLCANO = "iluvatar.com/DevVolcano"
"""Written by the scheduler: the devices it chose, comma-separated IDs of this plugin."""
DEV_KUBELET = "iluvatar.com/DevKubelet"
"""Written here after a binding: the devices the kubelet chose (and believes the pod holds)."""
DEV_REAL_ALLOC = "iluvatar.com/DevRealAlloc"
"""Written here after a binding: the devices really bound."""
PREDICATE_TIME = "predicate-time"
"""Written by the scheduler (decimal); set to :data:`CONSUMED` here once the pod is bound."""
CONSUMED = str(2**64 - 1)
"""4.4's "already bound" mark: Go's ``math.MaxUint64``."""
ANNOTATIONS = (PREDICATE_TIME, DEV_KUBELET, DEV_REAL_ALLOC)
"""The annotations this plugin writes, and the only ones the chart's policy lets it change."""

UNTIMED = 2**64
"""Where a pod without a readable predicate-time sorts: after every timed one (4.4: MaxUint64)."""
MAX_ANNOTATION = 16 << 10
"""The longest device list read: a node has at most a few hundred device IDs of ~45 characters,
and a pod on this node must not make the plugin keep a 256 KiB annotation per pod."""
WAITING_PHASES = ("Pending", "")

VOLCANO = "volcano"
"""Volcano's devices bound."""
FALLBACK = "fallback"
"""A pod matched, but its devices could not be bound: the kubelet's choice instead."""
UNMATCHED = "unmatched"
"""No pod waits with a DevVolcano of this size: the kubelet's choice."""
REFUSED = "refused"
"""The kubelet's choice names a chip another pod holds: the allocation is refused."""
UNAVAILABLE = "unavailable"
"""usevolcano is on but this node's pods cannot be watched (no NODE_NAME or cluster access)."""
RESULTS = (VOLCANO, FALLBACK, UNMATCHED, REFUSED, UNAVAILABLE)


@dataclass(frozen=True)
class PodFacts:
    """What the plugin keeps of one pod of this node."""

    uid: str
    namespace: str
    name: str
    phase: str
    deleting: bool
    volcano: tuple[str, ...] | None
    """DevVolcano's entries, whitespace trimmed (None: no annotation, or one too long)."""
    predicate_time: str | None
    kubelet: tuple[str, ...] | None
    real_alloc: tuple[str, ...] | None

    @property
    def key(self) -> str:
        """``namespace/name``, how PodResources names a pod."""
        return f"{self.namespace}/{self.name}"

    @property
    def terminal(self) -> bool:
        """Its containers are gone, and so is its hold on any chip."""
        return self.phase in ("Succeeded", "Failed")

    @property
    def consumed(self) -> bool:
        return self.predicate_time == CONSUMED or self.real_alloc is not None

    @property
    def waiting(self) -> bool:
        """Not being deleted and not started: the kubelet allocates before a pod leaves Pending, so
        a pod already running is never the one asking (after a restart that lost a binding whose
        write failed, it would otherwise be matched again)."""
        return not self.deleting and self.phase in WAITING_PHASES


def _ids(value: Any) -> tuple[str, ...] | None:
    if not isinstance(value, str) or len(value) > MAX_ANNOTATION:
        return None
    return tuple(part.strip() for part in value.split(","))


def pod_facts(obj: Any) -> PodFacts | None:
    """A pod of the API (a list item or a watch event's object) as :class:`PodFacts`; None for
    anything that is not one."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(metadata, dict):
        return None
    uid, namespace, name = metadata.get("uid"), metadata.get("namespace"), metadata.get("name")
    if not (isinstance(uid, str) and isinstance(namespace, str) and isinstance(name, str) and uid):
        return None
    annotations = metadata.get("annotations")
    notes = annotations if isinstance(annotations, dict) else {}
    status = obj.get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    when = notes.get(PREDICATE_TIME)
    return PodFacts(
        uid=uid,
        namespace=namespace,
        name=name,
        phase=phase if isinstance(phase, str) else "",
        deleting=metadata.get("deletionTimestamp") is not None,
        volcano=_ids(notes.get(DEV_VOLCANO)),
        predicate_time=when if isinstance(when, str) and len(when) <= 40 else None,
        kubelet=_ids(notes.get(DEV_KUBELET)),
        real_alloc=_ids(notes.get(DEV_REAL_ALLOC)),
    )


def predicate_order(pod: PodFacts) -> int:
    """The pod's predicate-time as a number; :data:`UNTIMED` when missing or not a decimal."""
    text = pod.predicate_time
    if text is None or not text.isascii() or not text.isdigit():
        return UNTIMED
    return min(int(text), UNTIMED)


def match(
    pods: Iterable[PodFacts], count: int, *, taken: Collection[str] = (), busy: Collection[str] = ()
) -> PodFacts | None:
    """The pod an Allocate of ``count`` devices is for: waiting, not consumed (nor ``taken``: bound
    by this process, by uid), not ``busy`` (PodResources lists devices of ours for it already, by
    key), with a DevVolcano of ``count`` entries; the smallest predicate-time, then the key."""
    candidates = [
        pod
        for pod in pods
        if pod.volcano is not None
        and len(pod.volcano) == count
        and pod.waiting
        and not pod.consumed
        and pod.uid not in taken
        and pod.key not in busy
    ]
    return min(candidates, key=lambda pod: (predicate_order(pod), pod.key), default=None)


Resolved = tuple[frozenset[str], bool]
"""A device ID's chip UUIDs, and whether it is a time-slicing replica (its chips are shared)."""


def resolver(devices: DeviceList) -> Callable[[str], Resolved | None]:
    """How a device ID becomes chips: an advertised ID by the list; another (written under an
    earlier config) by its part before ``::``, a board's or a chip's UUID; None for a device not
    on this node, which can hold nothing that could be bound here."""
    by_base: dict[str, frozenset[str]] = {}
    for physical in devices.physical:
        by_base.update((chip.uuid, frozenset({chip.uuid})) for chip in physical.chips)
    for physical in devices.physical:
        by_base[physical.id] = frozenset(chip.uuid for chip in physical.chips)

    def resolve(device_id: str) -> Resolved | None:
        device = devices.by_id.get(device_id)
        if device is not None:
            return frozenset(chip.uuid for chip in device.physical.chips), device.replica is not None
        base, separator, _ = device_id.partition(REPLICA_SEPARATOR)
        chips = by_base.get(base)
        return None if chips is None else (chips, bool(separator))

    return resolve


@dataclass(frozen=True)
class Held:
    """One device one pod holds."""

    holder: str
    """``namespace/name``."""
    device_id: str
    chips: frozenset[str]
    shared: bool


def holdings(
    pods: Iterable[PodFacts],
    kubelet_held: Mapping[str, Sequence[str]],
    bound: Mapping[str, Sequence[str]],
    resolve: Callable[[str], Resolved | None],
    *,
    verified: bool,
) -> list[Held]:
    """What this node's pods hold. ``kubelet_held``: pod key → the device IDs PodResources lists for
    it (the kubelet's own, which a Volcano binding replaced); ``bound``: pod uid → the IDs this
    process bound; ``verified``: PodResources answered.

    A pod that is over holds nothing. What this process bound, it holds. Otherwise a pod holds
    what the kubelet gave it: its DevRealAlloc where the write-back's record backs it (its
    DevKubelet names exactly the devices the kubelet lists, and DevRealAlloc as many), else the
    kubelet's IDs. A pod's annotations are its owner's to write: a DevRealAlloc alone, forged at
    creation, would hide the chip the pod really got (another pod could then be bound to it) or
    block chips the pod never got. A pod PodResources lists that the watch does not show (new, or
    deleted with its containers still stopping) holds what the kubelet says. Without PodResources
    (not ``verified``) every DevRealAlloc is believed, for refusals only (Volcano's devices are not
    bound then): they err on the side of never binding a chip twice."""
    out: list[Held] = []
    shown: set[str] = set()

    def add(holder: str, ids: Sequence[str]) -> None:
        for device_id in ids:
            resolved = resolve(device_id)
            if resolved is not None:
                out.append(Held(holder, device_id, *resolved))

    for pod in pods:
        shown.add(pod.key)
        if pod.terminal:
            continue
        mine, listed, real = bound.get(pod.uid), kubelet_held.get(pod.key), pod.real_alloc
        if mine:
            add(pod.key, mine)
        elif not verified:
            add(pod.key, real or ())
        elif listed:
            backed = real is not None and len(real) == len(listed) and set(pod.kubelet or ()) == set(listed)
            add(pod.key, real if backed and real is not None else listed)
    for key, ids in kubelet_held.items():
        if key not in shown:
            add(key, ids)
    return out


def clash(
    ids: Sequence[str], held: Sequence[Held], resolve: Callable[[str], Resolved | None], exclude: str = ""
) -> tuple[str, Held] | None:
    """The first of ``ids`` a pod other than ``exclude`` holds, with the holding: a chip in common,
    unless both are time-slicing replicas and not the same one."""
    for device_id in ids:
        resolved = resolve(device_id)
        if resolved is None:
            continue
        chips, shared = resolved
        for holding in held:
            if holding.holder == exclude or not chips & holding.chips:
                continue
            if not (shared and holding.shared) or holding.device_id == device_id:
                return device_id, holding
    return None


@dataclass(frozen=True)
class Decision:
    outcome: str
    """One of :data:`RESULTS` but ``unavailable``."""
    ids: tuple[str, ...]
    """What to bind (empty when refused)."""
    pod: PodFacts | None
    reason: str
    """Why not Volcano's devices (empty when they are bound), or why refused."""


def volcano_problem(
    pod: PodFacts,
    health: Mapping[str, bool],
    held: Sequence[Held],
    resolve: Callable[[str], Resolved | None],
    verified: bool,
) -> str | None:
    """Why ``pod``'s DevVolcano cannot be bound (``health``: each advertised ID → Healthy);
    ``verified``: PodResources answered, so what non-Volcano pods hold is known."""
    ids = pod.volcano or ()
    if "" in ids or len(set(ids)) != len(ids):
        return f"{DEV_VOLCANO} {echo(','.join(ids))} has an empty or a repeated entry"
    absent = [device_id for device_id in ids if device_id not in health]
    if absent:
        return f"{DEV_VOLCANO} names {echo(absent[0])}, not among this node's advertised devices"
    unhealthy = [device_id for device_id in ids if not health[device_id]]
    if unhealthy:
        return f"{DEV_VOLCANO} names {echo(unhealthy[0])}, which is Unhealthy"
    if not verified:
        return "the kubelet's PodResources API did not answer, so what other pods hold is unknown"
    found = clash(ids, held, resolve, exclude=pod.key)
    if found is not None:
        return f"{DEV_VOLCANO} names {echo(found[0])}, which pod {found[1].holder} holds"
    return None


def decide(
    requested: Sequence[str],
    pod: PodFacts | None,
    health: Mapping[str, bool],
    held: Sequence[Held],
    resolve: Callable[[str], Resolved | None],
    verified: bool,
) -> Decision:
    """What one container request of the kubelet's (``requested``) binds, ``pod`` being the one
    :func:`match` found for it."""
    if pod is not None:
        problem = volcano_problem(pod, health, held, resolve, verified)
        if problem is None:
            return Decision(VOLCANO, tuple(pod.volcano or ()), pod, "")
        outcome, reason = FALLBACK, problem
    else:
        outcome = UNMATCHED
        count = len(requested)
        reason = (
            f"no pod on this node waits with an {DEV_VOLCANO} of {count} device{'' if count == 1 else 's'}"
        )
    found = clash(requested, held, resolve, exclude=pod.key if pod is not None else "")
    if found is not None:
        device_id, holding = found
        return Decision(
            REFUSED,
            (),
            pod,
            f"flags.usevolcano: the kubelet chose {echo(device_id)}, which pod {holding.holder} holds "
            f"({reason}); refused rather than bind it twice: on this node every GPU pod must come "
            "through Volcano",
        )
    return Decision(outcome, tuple(requested), pod, reason)
