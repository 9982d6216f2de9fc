"""Node labels (product, count, memory, replicas) under the keys the webhook's GPU-type selection reads.

Published with one JSON merge-patch to the API server using the pod's service account, through
:class:`ix_gpu.runtime.kube.ApiServer` (the standard library): importing the kubernetes client would
cost the plugin more memory than the rest of it together, for one PATCH call.
"""

from __future__ import annotations

import logging
import urllib.error

from ix_gpu.devicemodel import labels
from ix_gpu.plugin.devices.device_list import DeviceList
from ix_gpu.runtime.kube import ApiServer

log = logging.getLogger(__name__)

def node_labels(devices: DeviceList) -> dict[str, str]:
    """Labels for the advertised set; empty when there is nothing to advertise."""
    if not devices.physical:
        return {}
    first = devices.physical[0]
    return {
        labels.GPU_PRODUCT: labels.label_value(first.product),
        labels.GPU_COUNT: str(len(devices.devices)),
        labels.GPU_MEMORY: str(first.memory_mib),
        labels.GPU_REPLICAS: str(devices.replicas),
    }


def patch_node_labels(api: ApiServer, node: str, values: dict[str, str], timeout: float = 10) -> None:
    """Merge ``values`` into the node's labels; raises OSError (URLError/HTTPError) on failure."""
    api.request(
        "PATCH",
        f"/api/v1/nodes/{node}",
        {"metadata": {"labels": values}},
        content_type="application/merge-patch+json",
        timeout=timeout,
    )


class NodeLabeler:
    """Publishes labels when they change; remembers failures so they are retried, logged once each."""

    def __init__(self, api: ApiServer | None, node: str | None) -> None:
        self.api = api
        self.node = node
        self.published: dict[str, str] = {}
        self._last_error = ""

    @property
    def usable(self) -> bool:
        return self.api is not None and bool(self.node)

    def pending(self, values: dict[str, str]) -> bool:
        return self.usable and bool(values) and values != self.published

    def publish(self, values: dict[str, str]) -> bool:
        assert self.api is not None and self.node
        try:
            patch_node_labels(self.api, self.node, values)
        except (OSError, urllib.error.URLError) as exc:
            message = str(exc)
            if message != self._last_error:
                log.error("cannot label node %s (will retry): %s", self.node, message)
                self._last_error = message
            return False
        self.published, self._last_error = dict(values), ""
        log.info("labelled node %s: %s", self.node, values)
        return True
