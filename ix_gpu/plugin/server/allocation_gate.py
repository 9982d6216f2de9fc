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
import time
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.error import HTTPError

from ix_gpu.config.text import one_line
from ix_gpu.devicemodel.allocation import Verdict, device_plugin_verdict
from ix_gpu.runtime.backoff import Backoff

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
        self.on_error = on_error
        self._listed_at: float | None = None
        self._slice_devices: int | None = None
        first = min(1.0, reader.interval)
        self._retry = Backoff(first=first, cap=max(first, reader.interval / 2))
        self.error: str | None = None
        """The last list's error while lists fail; None once one succeeds."""
        self.failing_since: float | None = None

    def _dra_devices(self) -> int | None:
        if self.dra_driver is None:
            return 0
        now = time.monotonic()
        if self.error is not None:
            if not self._retry.ready():
                return self._slice_devices
        elif self._listed_at is not None and now - self._listed_at < self.reader.interval:
            return self._slice_devices
        self._listed_at = now
        try:
            count = count_slice_devices(self.reader.api, self.reader.node, self.dra_driver)
        except (OSError, ValueError) as exc:
            message = one_line(exc, 300)
            delay = self._retry.failed()
            if message != self.error:
                log.error(
                    "cannot list the ResourceSlices of %s "
                    "(keeping the last answer, %s; retrying in %.0fs): %s",
                    self.dra_driver,
                    "none yet" if self._slice_devices is None else f"{self._slice_devices} devices",
                    delay,
                    message,
                )
            if self.error is None:
                self.failing_since = now
            self.error = message
            if self.on_error is not None:
                self.on_error(message)
            return self._slice_devices  # the last answer; None (offer nothing) before the first
        if self.error is not None:
            log.info("listed the ResourceSlices of %s again", self.dra_driver)
        self._retry.succeeded()
        self.error, self.failing_since = None, None
        self._slice_devices = count
        return count

    def verdict(self) -> Verdict:
        return device_plugin_verdict(self.reader.facts(), self.dra_driver, self._dra_devices())

    def problems(self) -> list[str]:
        """The reads that are failing now, for ``/healthz``'s detail (they do not fail it: a
        plugin restarted for an apiserver outage would drop its kubelet registration for nothing)."""
        now = time.monotonic()
        out = []
        for what, error, since in (
            (f"node {self.reader.node}", self.reader.error, self.reader.failing_since),
            (f"the ResourceSlices of {self.dra_driver}", self.error, self.failing_since),
        ):
            if error is not None:
                out.append(f"cannot read {what} for {now - (since or now):.0f}s: {error}")
        return out
