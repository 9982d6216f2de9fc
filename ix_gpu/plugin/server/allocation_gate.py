"""Whether the device plugin may advertise this node's GPUs now (:mod:`ix_gpu.devicemodel.allocation`).

Blocking (urllib): the app calls :meth:`DevicePluginGate.verdict` in a worker thread. The node is
read through the same :class:`NodeLabelReader` as the per-node config, so one GET a minute serves
both; the DRA driver's ResourceSlices are listed no more often than that.
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from typing import TYPE_CHECKING
from urllib.error import HTTPError

from ix_gpu.config.text import one_line
from ix_gpu.devicemodel.allocation import Verdict, device_plugin_verdict

if TYPE_CHECKING:
    from ix_gpu.plugin.server.node_config import NodeLabelReader
    from ix_gpu.runtime.kube import ApiServer

log = logging.getLogger(__name__)

RESOURCE_SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def count_slice_devices(api: ApiServer, node: str, driver: str) -> int:
    """Devices the ResourceSlices of ``driver`` for ``node`` list. 0 when resource.k8s.io/v1 is not
    served (no DRA driver can run then). Raises ``OSError``/``ValueError`` otherwise."""
    selector = urllib.parse.quote(f"spec.nodeName={node},spec.driver={driver}", safe="")
    try:
        answer = api.request("GET", f"{RESOURCE_SLICES}?fieldSelector={selector}", timeout=10)
    except HTTPError as exc:
        if exc.code == 404:
            return 0
        raise
    items = answer.get("items") if isinstance(answer, dict) else None
    if not isinstance(items, list):
        raise ValueError("the ResourceSlice list has no items")
    total = 0
    for item in items:
        devices = ((item or {}).get("spec") or {}).get("devices") if isinstance(item, dict) else None
        total += len(devices) if isinstance(devices, list) else 0
    return total


class DevicePluginGate:
    def __init__(self, reader: NodeLabelReader, dra_driver: str | None = None) -> None:
        self.reader = reader
        self.dra_driver = dra_driver
        self._listed_at: float | None = None
        self._slice_devices: int | None = None
        self._last_error: str | None = None

    def _dra_devices(self) -> int | None:
        if self.dra_driver is None:
            return 0
        now = time.monotonic()
        if self._listed_at is not None and now - self._listed_at < self.reader.interval:
            return self._slice_devices
        self._listed_at = now
        try:
            self._slice_devices = count_slice_devices(self.reader.api, self.reader.node, self.dra_driver)
        except (OSError, ValueError) as exc:
            message = one_line(exc, 300)
            if message != self._last_error:
                log.error("cannot list the ResourceSlices of %s: %s", self.dra_driver, message)
            self._last_error = message
            self._slice_devices = None  # unknown: the DRA plugin may be publishing
        else:
            self._last_error = None
        return self._slice_devices

    def verdict(self) -> Verdict:
        return device_plugin_verdict(self.reader.facts(), self.dra_driver, self._dra_devices())
