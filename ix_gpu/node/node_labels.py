"""Node labels (product, count, memory, replicas) under the keys the webhook's GPU-type selection reads.

Published with one JSON merge-patch to the API server using the pod's service account, through
:class:`ix_gpu.kube.apiserver.ApiServer` (the standard library): importing the kubernetes client would
cost the plugin more memory than the rest of it together, for one PATCH call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ix_gpu.devicemodel import labels
from ix_gpu.node.devices.device_list import DeviceList
from ix_gpu.process.backoff import Backoff

if TYPE_CHECKING:
    # urllib.request and ssl: only a plugin with labels.enabled, in a cluster, reaches the code
    # that needs them (through the ApiServer the CLI makes), so importing them here is deferred.
    from ix_gpu.kube.apiserver import ApiServer

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


def patch_node_labels(
    api: ApiServer, node: str, values: Mapping[str, str | None], timeout: float = 10
) -> None:
    """Merge ``values`` into the node's labels (``None`` removes one); raises OSError
    (URLError/HTTPError) on failure."""
    api.request(
        "PATCH",
        f"/api/v1/nodes/{node}",
        {"metadata": {"labels": values}},
        content_type="application/merge-patch+json",
        timeout=timeout,
    )


class NodeLabeler:
    """Publishes labels when they change; a failed write is retried with backoff and logged once
    per distinct error.

    Every publish names every key of :data:`labels.PUBLISHED`, those without a value as ``null``
    (removed): a merge-patch only merges, so a node whose devices all disappeared would otherwise
    keep its old product label, and gpu-type affinity would keep sending pods there. Nothing is
    known to be published at start, so the first set is always sent, an empty one included: the
    labels may be a previous run's.

    A write that fails waits 1 s, then twice as long each time up to a minute, with jitter
    (:class:`~ix_gpu.process.backoff.Backoff`): a policy or RBAC that refuses every node's writes
    costs the apiserver at most one PATCH a minute per node, not one per health interval.
    """

    def __init__(
        self, api: ApiServer | None, node: str | None, *, on_error: Callable[[str], None] | None = None
    ) -> None:
        self.api = api
        self.node = node
        self.on_error = on_error
        self.published: dict[str, str] | None = None
        """What the node carries since the last successful publish; None before the first."""
        self.error: str | None = None
        """The last write's error while writes fail; None once one succeeds."""
        self.retry = Backoff(first=1.0, cap=60.0)

    def forget(self) -> None:
        """Write the labels again on the next publish, changed or not: the Node may be a new object
        (deleted, then registered again by its kubelet) that has none of them."""
        self.published = None

    @property
    def usable(self) -> bool:
        return self.api is not None and bool(self.node)

    def pending(self, values: dict[str, str]) -> bool:
        """Labels to write now: they differ from the node's, and no failed write is backing off."""
        return self.usable and values != self.published and self.retry.ready()

    def publish(self, values: dict[str, str]) -> bool:
        assert self.api is not None and self.node
        try:
            patch_node_labels(self.api, self.node, {key: values.get(key) for key in labels.PUBLISHED})
        except OSError as exc:  # every error of the API client is an OSError
            message = str(exc)
            delay = self.retry.failed()
            if message != self.error:
                log.error("cannot label node %s (retrying in %.0fs): %s", self.node, delay, message)
            self.error = message
            if self.on_error is not None:
                self.on_error(message)
            return False
        self.retry.succeeded()
        self.published, self.error = dict(values), None
        log.info("labelled node %s: %s", self.node, values)
        return True


def _nodes(api: ApiServer, page_size: int = 500) -> Iterator[dict[str, Any]]:
    """Every Node, a page at a time (a large cluster's list is not one answer)."""
    token = ""
    while True:
        query = f"?limit={page_size}" + (f"&continue={token}" if token else "")
        answer = api.request("GET", f"/api/v1/nodes{query}")
        yield from answer.get("items") or []
        token = (answer.get("metadata") or {}).get("continue") or ""
        if not token:
            return


def prune_node_labels(api: ApiServer, *, dry_run: bool = False, page_size: int = 500) -> dict[str, list[str]]:
    """Remove the labels the plugin publishes (:data:`labels.PUBLISHED`) from every Node: the chart
    runs this after ``helm uninstall``, so nothing of the release stays on the Nodes. Labels the
    operator set (``ix-gpu.io/device-plugin.config``) are kept. Returns node -> removed keys;
    raises OSError when the API server cannot be reached or refuses."""
    removed: dict[str, list[str]] = {}
    for node in _nodes(api, page_size):
        metadata = node.get("metadata") or {}
        ours = sorted(key for key in metadata.get("labels") or {} if key in labels.PUBLISHED)
        if not ours:
            continue
        if not dry_run:
            patch_node_labels(api, str(metadata["name"]), dict.fromkeys(ours))
        removed[str(metadata["name"])] = ours
    return removed
