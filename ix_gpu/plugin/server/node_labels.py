"""Node labels (product, count, memory, replicas) under the keys the webhook's GPU-type selection reads.

Published with one JSON merge-patch to the API server using the pod's service account, through
:class:`ix_gpu.runtime.kube.ApiServer` (the standard library): importing the kubernetes client would
cost the plugin more memory than the rest of it together, for one PATCH call.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ix_gpu.devicemodel import labels
from ix_gpu.plugin.devices.device_list import DeviceList

if TYPE_CHECKING:
    # urllib.request and ssl: only a plugin with labels.enabled, in a cluster, reaches the code
    # that needs them (through the ApiServer the CLI makes), so importing them here is deferred.
    from ix_gpu.runtime.kube import ApiServer

log = logging.getLogger(__name__)


def node_labels(devices: DeviceList) -> dict[str, str]:
    """Labels for the advertised set; empty when there is nothing to advertise.

    The product label is the bare model (``BI-V150`` for libixml's ``Iluvatar BI-V150``), spelled
    by the same function the webhook applies to the ``gpu-type`` annotation, so the model name a
    user writes there matches; the vendor goes into a label of its own when the name starts with it.
    """
    if not devices.physical:
        return {}
    first = devices.physical[0]
    vendor, _ = labels.split_vendor(first.product)
    values = {labels.GPU_PRODUCT: labels.gpu_product_value(first.product)}
    if vendor is not None:
        values[labels.GPU_VENDOR] = vendor
    values.update(
        {
            labels.GPU_COUNT: str(len(devices.devices)),
            labels.GPU_MEMORY: str(first.memory_mib),
            labels.GPU_REPLICAS: str(devices.replicas),
        }
    )
    return values


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
        except OSError as exc:  # urllib's URLError and HTTPError are OSErrors
            message = str(exc)
            if message != self._last_error:
                log.error("cannot label node %s (will retry): %s", self.node, message)
                self._last_error = message
            return False
        self.published, self._last_error = dict(values), ""
        log.info("labelled node %s: %s", self.node, values)
        return True
