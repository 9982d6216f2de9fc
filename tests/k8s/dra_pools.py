"""DRA pools as ``ix-gpu dra`` publishes them, on Nodes that are API objects only (no kubelet), for
the real scheduler to allocate from: the scheduler property test and ``bench/dra_scheduler_bench.py``.

The slices come from the driver's own code (:func:`ix_gpu.dra.devices.dra_devices`,
:class:`ix_gpu.dra.slices.SlicePublisher`), the DeviceClasses from the chart.
"""

from __future__ import annotations

from typing import Any

from ix_gpu.devicemodel.vendors import ILUVATAR
from ix_gpu.dra.devices import counter_sets, dra_devices, slice_devices
from ix_gpu.dra.slices import SlicePublisher
from ix_gpu.kube.kubeconfig import read_kubeconfig
from ix_gpu.node.backends.base import Chip
from tests.chart.rendering import render
from tests.k8s.k8s_tier import KubeAPI
from tests.k8s.pods import request_ok

DRIVER = "gpu.iluvatar.com"
RESOURCE_API = "/apis/resource.k8s.io/v1"
NOT_READY = {"key": "node.kubernetes.io/not-ready", "operator": "Exists"}
"""What a pod for these nodes tolerates: the apiserver's TaintNodesByCondition taints a new Node
not-ready, and no kubelet will ever make it Ready."""


def chips(node: str, product: str, per_board: int, boards: int = 2, memory_mib: int = 32768) -> list[Chip]:
    return [
        Chip(f"GPU-{node}-{i}", i, i, f"{node}-b{i // per_board}", i % per_board, product, memory_mib, 0)
        for i in range(boards * per_board)
    ]


def create_device_classes(api: KubeAPI) -> list[str]:
    """The chart's DeviceClasses (``dra.enabled``), created; their names."""
    classes = [o for o in render({"dra": {"enabled": True}}) if o["kind"] == "DeviceClass"]
    for device_class in classes:
        request_ok(api, "POST", f"{RESOURCE_API}/deviceclasses", device_class)
    return [c["metadata"]["name"] for c in classes]


def create_node(api: KubeAPI, name: str, labels: dict[str, str]) -> None:
    """A Node object with room for pods (status written through its subresource)."""
    request_ok(
        api,
        "POST",
        "/api/v1/nodes",
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}},
    )
    resources = {"cpu": "64", "memory": "256Gi", "pods": "250"}
    status, reply = api.request(
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        {"status": {"capacity": resources, "allocatable": resources}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, reply


def publish_pool(
    api: KubeAPI,
    node: str,
    node_chips: list[Chip],
    *,
    splitboard: bool,
    partitionable: bool = False,
    shares: int = 1,
) -> dict[str, dict[str, Any]]:
    """Publish ``node``'s pool in that layout as the driver does; its devices by name."""
    devices = dra_devices(node_chips, splitboard=splitboard, partitionable=partitionable, shares=shares)
    entries = slice_devices(devices, ILUVATAR, DRIVER)
    publisher = SlicePublisher(read_kubeconfig(api.kubeconfig), driver=DRIVER, node=node)
    publisher.publish(entries, counter_sets(devices))
    assert not publisher.counters_dropped and not publisher.shares_dropped, "the apiserver dropped fields"
    return {e["name"]: e for e in entries}


def delete_pool(api: KubeAPI, node: str) -> None:
    api.request("DELETE", f"/api/v1/nodes/{node}")
    for suffix in ("", "-counters-0"):
        api.request("DELETE", f"{RESOURCE_API}/resourceslices/{node}-{DRIVER}{suffix}")


def claim_pod(name: str, node_selector: dict[str, str]) -> dict[str, Any]:
    """A pod using the ResourceClaim ``name`` (created apart), for these nodes; it never runs."""
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": node_selector,
            "tolerations": [NOT_READY],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [{"name": "c", "image": "pause", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }
