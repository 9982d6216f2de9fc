"""This node's devices as one ResourceSlice (``resource.k8s.io/v1``), written when they change.

One slice holds the whole pool (a node has at most a few dozen chips; a slice holds 128 devices,
64 when any is tainted), so ``resourceSliceCount`` is 1. The pool is named after the node, and the
slice too (``<node>-<driver>``): a restarted plugin finds its slice by name instead of listing, and
never leaves a second one behind. The pool generation goes up with every change, as consumers
only trust the highest generation they see; on start it continues from the stored slice's.

What the apiserver stored is read back from the write's answer: an apiserver without the
DRADeviceTaints feature (off by default before Kubernetes 1.36) drops device taints silently, and
:attr:`SlicePublisher.taints_dropped` says so, for the app to fall back to leaving unhealthy devices
out of the slice.

The slice is owned by its Node, so deleting the Node deletes it (the kubelet also removes a
driver's slices some time after the plugin unregisters). Nothing is written while the devices
stay as they are: the health loop runs every few seconds on every GPU node.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.error import HTTPError
from urllib.parse import quote

from ix_gpu.dra.claims import RESOURCE_API
from ix_gpu.runtime.kube import ApiServer

log = logging.getLogger(__name__)

RESOURCE_SLICES = f"{RESOURCE_API}/resourceslices"


def slice_name(node: str, driver: str) -> str:
    return f"{node}-{driver}"


class SlicePublisher:
    """Blocking calls: the app runs :meth:`publish` in a worker thread."""

    def __init__(self, api: ApiServer, *, driver: str, node: str) -> None:
        self.api, self.driver, self.node = api, driver, node
        self.name = slice_name(node, driver)
        self.generation: int | None = None
        self.published: list[dict[str, Any]] | None = None
        self._owner: list[dict[str, Any]] | None = None
        self.taints_dropped = False
        """The last write sent device taints and the apiserver stored none of them."""

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

    def body(self, devices: list[dict[str, Any]], generation: int) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": self.name, "ownerReferences": self._owner_references()},
            "spec": {
                "driver": self.driver,
                "nodeName": self.node,
                "pool": {"name": self.node, "generation": generation, "resourceSliceCount": 1},
                "devices": devices,
            },
        }

    def publish(self, devices: list[dict[str, Any]], *, create: bool = True) -> bool:
        """Make the slice list ``devices``; True when it was written. ``create=False``: leave an
        absent slice absent. Raises ``OSError``."""
        if devices == self.published:
            return False
        path = f"{RESOURCE_SLICES}/{quote(self.name, safe='')}"
        stored = self._get(path)
        if stored is None and not create:
            self.published = devices
            return False
        spec = (stored or {}).get("spec") or {}
        stored_generation = int((spec.get("pool") or {}).get("generation") or 0)
        if stored is not None and _same(spec.get("devices"), devices) and spec.get("nodeName") == self.node:
            self.taints_dropped = False
            self.generation, self.published = stored_generation, devices
            return False
        generation = max(stored_generation, self.generation or 0) + 1
        body = self.body(devices, generation)
        if stored is None:
            answer = self.api.request("POST", RESOURCE_SLICES, body)
        else:
            body["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
            answer = self.api.request("PUT", path, body)
        sent = sum(len(d.get("taints") or []) for d in devices)
        kept = (answer.get("spec") or {}).get("devices") if isinstance(answer, dict) else None
        self.taints_dropped = sent > 0 and isinstance(kept, list) and not any(d.get("taints") for d in kept)
        self.generation, self.published = generation, devices
        log.info("published ResourceSlice %s: %d devices, generation %d", self.name, len(devices), generation)
        return True


def _same(stored: Any, devices: list[dict[str, Any]]) -> bool:
    """Stored devices equal ours, ignoring what the apiserver adds (a taint's ``timeAdded``)."""
    if not isinstance(stored, list) or len(stored) != len(devices):
        return False
    for theirs, ours in zip(stored, devices, strict=True):
        taints = [{k: v for k, v in t.items() if k != "timeAdded"} for t in theirs.get("taints") or []]
        if {**theirs, "taints": taints} != {**ours, "taints": ours.get("taints", [])}:
            return False
    return True
