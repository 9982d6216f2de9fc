"""Whether the device plugin may advertise this node's GPUs now (:mod:`ix_gpu.node.allocator`).

The node is read through the same :class:`NodeLabelReader` watch as the per-node config; the DRA
driver's ResourceSlices of this node are watched too (:class:`SliceDevices`), so a quiet cluster
costs no request. The app calls :meth:`DevicePluginGate.verdict` on each health interval; it only
reads memory.

**Fail safe, both ways.** Only an answer changes what the node offers: a list or watch that fails
keeps the slices last heard (the node keeps offering what it offered), and is retried with
backoff. An apiserver restart, or a rolling upgrade that lands on the watch, must not empty every
GPU node of a cluster at once. Before the first answer the count is unknown and the node offers
nothing: with a DRA driver in the cluster, offering chips the DRA plugin may already be publishing
would let both hand out the same chip, while offering nothing at start takes away nothing a pod
holds. A cluster that does not serve resource.k8s.io/v1 has no slices (no DRA driver can run),
and is asked again every :data:`NO_DRA_RECHECK` seconds.
"""

from __future__ import annotations

import logging
import threading
import urllib.error
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ix_gpu.kube.list_watch import ApiGone, ApiListWatch
from ix_gpu.kube.watched_cache import WatchedCache
from ix_gpu.node.allocator import Verdict, device_plugin_verdict

if TYPE_CHECKING:
    from ix_gpu.kube.apiserver import ApiServer
    from ix_gpu.node.node_config import NodeLabelReader

log = logging.getLogger(__name__)

RESOURCE_SLICES = "/apis/resource.k8s.io/v1/resourceslices"
NO_DRA_RECHECK = 300.0
"""Seconds between asks of a cluster that did not serve resource.k8s.io/v1."""
_NOT_SERVED = "not-served"


class _AbsentIsEmpty:
    """A list and watch where a 404 for the collection (resource.k8s.io/v1 not served) is an
    empty answer, asked again every ``recheck`` seconds: once the API is served, a 410 makes the
    cache list it."""

    def __init__(self, inner: ApiListWatch, recheck: float) -> None:
        self.inner, self.recheck = inner, recheck
        self._closed = threading.Event()

    def list(self) -> tuple[list[Any], str]:
        try:
            return self.inner.list()
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
            return [], _NOT_SERVED

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        if resource_version != _NOT_SERVED:
            return self.inner.watch(resource_version, timeout_seconds)
        if self._closed.wait(self.recheck):
            return iter(())
        if self.list()[1] != _NOT_SERVED:
            raise ApiGone("resource.k8s.io/v1 is served now")
        return iter(())

    def close(self) -> None:
        self._closed.set()
        self.inner.close()


class SliceDevices(WatchedCache):
    """The devices ``driver``'s ResourceSlices list for ``node``, from a watch of them."""

    log = log

    def __init__(
        self,
        api: ApiServer,
        node: str,
        driver: str,
        *,
        on_error: Callable[[str], None] | None = None,
        backoff: tuple[float, float] = (1.0, 30.0),
        recheck: float = NO_DRA_RECHECK,
    ) -> None:
        self.what = f"the ResourceSlices of {driver}"
        selector = f"spec.nodeName={node},spec.driver={driver}"
        inner = ApiListWatch(api, RESOURCE_SLICES, self.what, field_selector=selector)
        super().__init__(_AbsentIsEmpty(inner, recheck), backoff=backoff)
        self.node, self.driver, self.on_error = node, driver, on_error

    def _entry(self, obj: Any) -> tuple[str, int] | None:
        metadata = obj.get("metadata") if isinstance(obj, dict) else None
        spec = obj.get("spec") if isinstance(obj, dict) else None
        if not isinstance(metadata, dict) or not isinstance(spec, dict):
            return None
        if spec.get("nodeName") != self.node or spec.get("driver") != self.driver:
            return None  # the field selector's business; never counted for this node
        devices = spec.get("devices")
        return str(metadata.get("name")), len(devices) if isinstance(devices, list) else 0

    def _watch_failed(self) -> None:
        if self.on_error is not None and self._last_error is not None:
            self.on_error(self._last_error)

    def count(self) -> int | None:
        """Devices listed (None before the first answer)."""
        return sum(self._items.values()) if self.ready() else None


class DevicePluginGate:
    def __init__(
        self,
        reader: NodeLabelReader,
        dra_driver: str | None = None,
        *,
        on_error: Callable[[str], None] | None = None,
        backoff: tuple[float, float] = (1.0, 30.0),
    ) -> None:
        """``on_error``: called with the message of each failed list or watch of the slices (a
        metric); ``backoff``: their retries' first and longest pause."""
        self.reader = reader
        self.dra_driver = dra_driver
        self.slices: SliceDevices | None = None
        if dra_driver is not None:
            node, api = reader.node, reader.api
            self.slices = SliceDevices(api, node, dra_driver, on_error=on_error, backoff=backoff)

    def start(self) -> None:
        """Start the watches (the node's may be running already, for the per-node config)."""
        self.reader.start()
        if self.slices is not None:
            self.slices.start()

    def wait_synced(self, timeout: float) -> bool:
        """Whether both watches have answered within ``timeout`` seconds (each)."""
        synced = self.reader.wait_synced(timeout)
        return (self.slices is None or self.slices.wait_synced(timeout)) and synced

    def stop(self) -> None:
        self.reader.stop()
        if self.slices is not None:
            self.slices.stop()

    def verdict(self) -> Verdict:
        """The last answers decide: None (offer nothing) only before the first list."""
        devices = 0 if self.slices is None else self.slices.count()
        return device_plugin_verdict(self.reader.facts(), self.dra_driver, devices)

    def problems(self) -> list[str]:
        """The reads that are failing now, for ``/healthz``'s detail (they do not fail it: a
        plugin restarted for an apiserver outage would drop its kubelet registration for nothing)."""
        problems = [self.reader.problem(), None if self.slices is None else self.slices.problem()]
        return [problem for problem in problems if problem is not None]
