"""This node's devices as a ResourceSlice pool (``resource.k8s.io/v1``), written when they change.

The pool is named after the node and holds one slice of devices (a node has at most a few dozen
chips; a slice holds 64 devices once any is tainted or consumes counters), named
``<node>-<driver>``, plus, in the partitionable layout (:mod:`ix_gpu.dra.devices`), the boards'
counter sets in slices of their own (``<node>-<driver>-counters-<k>``, at most 8 sets each): from
Kubernetes 1.35 a slice lists either devices or shared counters. A restarted plugin finds its
slices by name instead of listing, from the devices slice's ``resourceSliceCount``, and never
leaves one behind. All slices of the pool carry one generation, which goes up with every change,
as consumers only trust the highest generation they see and a pool whose slices at it are not all
there is incomplete; on start it continues from the stored one. Counter slices are written before
the devices that consume them, and surplus ones deleted after.

What the apiserver stored is read back from each write's answer: an apiserver without a feature
drops its fields silently. Without DRAConsumableCapacity (off by default before 1.36) a shared
device loses ``allowMultipleAllocations`` and becomes exclusive: :attr:`SlicePublisher.shares_dropped`.
Without DRADeviceTaints (off by default before Kubernetes 1.36) device
taints vanish: :attr:`SlicePublisher.taints_dropped`, for the app to leave unhealthy devices out of
the slice instead. Without DRAPartitionableDevices (likewise) shared counters and the devices'
counter consumption vanish, and a board would be allocatable together with its own chips:
:attr:`SlicePublisher.counters_dropped`, for the app to publish the plain layout.

Every slice is owned by its Node, so deleting the Node deletes them (the kubelet also removes a
driver's slices some time after the plugin unregisters). Nothing is written while the devices
stay as they are: the health loop runs every few seconds on every GPU node.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.error import HTTPError
from urllib.parse import quote

from ix_gpu.dra.claims import RESOURCE_API
from ix_gpu.kube.apiserver import ApiServer

log = logging.getLogger(__name__)

RESOURCE_SLICES = f"{RESOURCE_API}/resourceslices"
MAX_COUNTER_SETS = 8
"""Counter sets one slice may hold (``ResourceSliceMaxCounterSets``)."""
MAX_COUNTER_SLICES = 16
"""Counter slices looked for, whatever a stored pool claims: 128 boards' sets, beyond any node. A
``resourceSliceCount`` someone else wrote must not cost a GET per slice it names."""


def slice_name(node: str, driver: str) -> str:
    return f"{node}-{driver}"


def counter_slice_name(node: str, driver: str, k: int) -> str:
    return f"{slice_name(node, driver)}-counters-{k}"


class SlicePublisher:
    """Blocking calls: the app runs :meth:`publish` in a worker thread."""

    def __init__(self, api: ApiServer, *, driver: str, node: str) -> None:
        self.api, self.driver, self.node = api, driver, node
        self.name = slice_name(node, driver)
        self.generation: int | None = None
        self.published: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None
        """Devices and counter sets last written or found stored."""
        self._owner: list[dict[str, Any]] | None = None
        self.taints_dropped = False
        """The last write sent device taints and the apiserver stored none of them."""
        self.counters_dropped = False
        """The last write sent shared counters and the apiserver stored none of them."""
        self.shares_dropped = False
        """The last write sent shared devices (``allowMultipleAllocations``) and the apiserver
        stored none."""
        self._counter_slices = 0
        """Counter slices that may exist beyond what the stored pool says (a delete that failed)."""

    def forget(self) -> None:
        """Compare with what is stored, and read the owning Node, on the next :meth:`publish`:
        the slices may be gone (their Node deleted and registered again, or another instance
        wrote them meanwhile)."""
        self.published = None
        self._owner = None

    def follow_node(self, uid: str) -> None:
        """The Node as last heard. Another object than the one the slices were written for (the
        Node deleted and registered again): they were deleted with the old one, so publish anew."""
        if uid and self._owner and self._owner[0]["uid"] != uid:
            log.warning("node %s was registered again (uid %s): publishing its slices anew", self.node, uid)
            self.forget()

    def _path(self, name: str) -> str:
        return f"{RESOURCE_SLICES}/{quote(name, safe='')}"

    def _get(self, path: str) -> dict[str, Any] | None:
        try:
            found = self.api.request("GET", path)
        except HTTPError as exc:
            if exc.code == 404:
                return None
            raise
        return found if isinstance(found, dict) else None

    def _owner_references(self) -> list[dict[str, Any]]:
        if self._owner is None:
            node = self._get(f"/api/v1/nodes/{quote(self.node, safe='')}") or {}
            uid = (node.get("metadata") or {}).get("uid")
            if not uid:
                log.warning("node %s not found: the ResourceSlice gets no owner", self.node)
                return []
            self._owner = [
                {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid, "controller": True}
            ]
        return self._owner

    def body(
        self,
        devices: list[dict[str, Any]],
        generation: int,
        *,
        count: int = 1,
        name: str | None = None,
        counters: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """One slice of the pool: ``devices``, or with ``counters`` a counter slice."""
        spec: dict[str, Any] = {
            "driver": self.driver,
            "nodeName": self.node,
            "pool": {"name": self.node, "generation": generation, "resourceSliceCount": count},
        }
        if counters is None:
            spec["devices"] = devices
        else:
            spec["sharedCounters"] = counters
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name or self.name, "ownerReferences": self._owner_references()},
            "spec": spec,
        }

    def publish(
        self,
        devices: list[dict[str, Any]],
        counters: list[dict[str, Any]] | None = None,
        *,
        create: bool = True,
    ) -> bool:
        """Make the pool list ``devices`` and the counter sets ``counters``; True when anything was
        written. ``create=False``: leave an absent pool absent. Raises ``OSError``."""
        counters = counters or []
        if (devices, counters) == self.published:
            return False
        chunks = [counters[i : i + MAX_COUNTER_SETS] for i in range(0, len(counters), MAX_COUNTER_SETS)]
        stored = self._get(self._path(self.name))
        if stored is None and not create:
            self.published = devices, counters
            return False
        if stored is None:
            self._owner = None  # the Node may be another by now (deleted and registered again)
        spec = (stored or {}).get("spec") or {}
        pool = spec.get("pool") or {}
        stored_generation = int(pool.get("generation") or 0)
        stored_count = _count(pool.get("resourceSliceCount")) if stored is not None else 1
        # Counter slices that may exist: those the pool needs, those the stored pool names, those
        # this process wrote before a delete failed, and on the first publish one more (a plugin
        # stopped between shrinking the pool and deleting the rest).
        reach = max(len(chunks), stored_count - 1, self._counter_slices, 1 if self.generation is None else 0)
        self._counter_slices = reach
        names = [counter_slice_name(self.node, self.driver, k) for k in range(reach)]
        stored_counters = [self._get(self._path(name)) for name in names]
        surplus = [
            name for name, found in list(zip(names, stored_counters, strict=True))[len(chunks) :] if found
        ]
        if (
            stored is not None
            and _same(spec.get("devices"), devices)
            and spec.get("nodeName") == self.node
            and stored_count == 1 + len(chunks)
            and all(
                found is not None
                and (found.get("spec") or {}).get("sharedCounters") == chunk
                and ((found.get("spec") or {}).get("pool") or {}).get("generation") == stored_generation
                for found, chunk in zip(stored_counters, chunks, strict=False)
            )
        ):
            self._delete(surplus, len(chunks))
            self.taints_dropped = self.counters_dropped = self.shares_dropped = False
            self.generation, self.published = stored_generation, (devices, counters)
            return False
        generation = max(stored_generation, self.generation or 0) + 1
        count = 1 + len(chunks)
        kept_counters = 0
        for name, found, chunk in zip(names, stored_counters, chunks, strict=False):
            answer = self._write(self.body([], generation, count=count, name=name, counters=chunk), found)
            kept_counters += len((answer.get("spec") or {}).get("sharedCounters") or [])
        answer = self._write(self.body(devices, generation, count=count), stored)
        self._delete(surplus, len(chunks))
        kept = (answer.get("spec") or {}).get("devices")
        kept = kept if isinstance(kept, list) else []
        sent = sum(len(d.get("taints") or []) for d in devices)
        self.taints_dropped = sent > 0 and not any(d.get("taints") for d in kept)
        shared = any(d.get("allowMultipleAllocations") for d in devices)
        self.shares_dropped = shared and not any(d.get("allowMultipleAllocations") for d in kept)
        consuming = any(d.get("consumesCounters") for d in devices)
        self.counters_dropped = bool(chunks) and (
            kept_counters == 0 or (consuming and not any(d.get("consumesCounters") for d in kept))
        )
        self.generation, self.published = generation, (devices, counters)
        log.info(
            "published ResourceSlice %s: %d devices%s, generation %d",
            self.name,
            len(devices),
            f" and {len(counters)} counter sets in {len(chunks)} more" if chunks else "",
            generation,
        )
        return True

    def _write(self, body: dict[str, Any], stored: dict[str, Any] | None) -> dict[str, Any]:
        """Create or replace one slice; the apiserver's answer (what it stored)."""
        if stored is None:
            answer = self.api.request("POST", RESOURCE_SLICES, body)
        else:
            body["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
            answer = self.api.request("PUT", self._path(body["metadata"]["name"]), body)
        return answer if isinstance(answer, dict) else {}

    def _delete(self, names: list[str], left: int) -> None:
        """Delete the counter slices ``names``, after which the pool has ``left`` of them."""
        for name in names:
            try:
                self.api.request("DELETE", self._path(name))
            except HTTPError as exc:
                if exc.code != 404:
                    raise
            log.info("deleted ResourceSlice %s: the pool has no counter sets for it", name)
        self._counter_slices = left


def _count(value: Any) -> int:
    """A stored pool's slice count, bounded (:data:`MAX_COUNTER_SLICES`); 1 when not a number."""
    return min(value, 1 + MAX_COUNTER_SLICES) if isinstance(value, int) and value >= 1 else 1


def _same(stored: Any, devices: list[dict[str, Any]]) -> bool:
    """Stored devices equal ours, ignoring what the apiserver adds (a taint's ``timeAdded``)."""
    if not isinstance(stored, list) or len(stored) != len(devices):
        return False
    for theirs, ours in zip(stored, devices, strict=True):
        taints = [{k: v for k, v in t.items() if k != "timeAdded"} for t in theirs.get("taints") or []]
        if {**theirs, "taints": taints} != {**ours, "taints": ours.get("taints", [])}:
            return False
    return True
