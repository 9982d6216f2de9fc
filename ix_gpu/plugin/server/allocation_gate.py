"""Whether the device plugin may advertise this node's GPUs now (:mod:`ix_gpu.devicemodel.allocation`).

Blocking (urllib): the app calls :meth:`DevicePluginGate.verdict` in a worker thread. The node is
read through the same :class:`NodeLabelReader` as the per-node config, so one GET a minute serves
both; the DRA driver's ResourceSlices are listed no more often than that.

**Fail safe, both ways.** Only an answer changes what the node offers: a list that fails keeps the
count of the last one that did not (the node keeps offering what it offered), and is retried sooner
than the interval (from 1 s up to half of it). An apiserver restart, or a rolling upgrade that lands
on the list, must not empty every GPU node of a cluster at once. Before the first answer the count
is unknown and the node offers nothing: with a DRA driver in the cluster, offering chips the DRA
plugin may already be publishing would let both hand out the same chip, while offering nothing
at start takes away nothing a pod holds.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.error import HTTPError

from ix_gpu.devicemodel.allocation import Verdict, device_plugin_verdict
from ix_gpu.runtime.periodic_read import PeriodicRead

if TYPE_CHECKING:
    from ix_gpu.plugin.server.node_config import NodeLabelReader
    from ix_gpu.runtime.kube import ApiServer

log = logging.getLogger(__name__)

RESOURCE_SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def count_slice_devices(api: ApiServer, node: str, driver: str) -> int:
    """Devices the ResourceSlices of ``driver`` for ``node`` list. 0 when resource.k8s.io/v1 is not
    served (no DRA driver can run then). Raises ``OSError`` (the client's errors) or ``ValueError``
    (an answer that is no ResourceSlice list) otherwise."""
    selector = urllib.parse.quote(f"spec.nodeName={node},spec.driver={driver}", safe="")
    try:
        answer = api.request("GET", f"{RESOURCE_SLICES}?fieldSelector={selector}", timeout=10)
    except HTTPError as exc:
        if exc.code == 404:
            return 0
        raise
    items = answer.get("items") if isinstance(answer, dict) else None
    if not isinstance(items, list) or answer.get("kind") not in (None, "ResourceSliceList"):
        raise ValueError("the answer is no ResourceSlice list")
    total = 0
    for item in items:
        devices = ((item or {}).get("spec") or {}).get("devices") if isinstance(item, dict) else None
        total += len(devices) if isinstance(devices, list) else 0
    return total


class DevicePluginGate:
    def __init__(
        self,
        reader: NodeLabelReader,
        dra_driver: str | None = None,
        *,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        """``on_error``: called with the message of each failed list (a metric)."""
        self.reader = reader
        self.dra_driver = dra_driver
        self.slices: PeriodicRead[int] | None = None
        if dra_driver is not None:
            self.slices = PeriodicRead(
                f"the ResourceSlices of {dra_driver}",
                lambda: count_slice_devices(reader.api, reader.node, dra_driver),
                reader.interval,
                logger=log,
                on_error=on_error,
            )

    def verdict(self) -> Verdict:
        """The last answers decide: None (offer nothing) only before the first list."""
        devices = 0 if self.slices is None else self.slices.get()
        return device_plugin_verdict(self.reader.facts(), self.dra_driver, devices)

    def problems(self) -> list[str]:
        """The reads that are failing now, for ``/healthz``'s detail (they do not fail it: a
        plugin restarted for an apiserver outage would drop its kubelet registration for nothing)."""
        problems = [self.reader.read.problem(), None if self.slices is None else self.slices.problem()]
        return [problem for problem in problems if problem is not None]
