"""Read what ``ix-gpu status`` shows from the API server, with the user's kubeconfig: nodes, the pods
bound to nodes and not finished, ResourceSlices and ResourceClaims (``resource.k8s.io/v1``; none on
a cluster without it), and each device plugin's /metrics through the API server's pod proxy (the
metrics port is not reachable from outside the cluster; the proxy needs ``get pods/proxy`` in the
plugin's namespace). Lists are paged; the plugins' pages are read side by side, each with a short
timeout, so a node that does not answer costs one timeout, not the whole view."""

from __future__ import annotations

import concurrent.futures
import logging
import urllib.error
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from ix_gpu.runtime.kube import ApiServer
from ix_gpu.runtime.list_watch import ApiListWatch
from ix_gpu.status.view import ChipStatus, chips_from_metrics

log = logging.getLogger(__name__)

PLUGIN_COMPONENT = ("app.kubernetes.io/component", "device-plugin")
"""The label of the chart's device-plugin pods (its DaemonSet's template)."""
METRICS_PORT_NAME = "metrics"


def list_all(
    api: ApiServer,
    path: str,
    what: str,
    field_selector: str | None = None,
    slim: Callable[[Any], Any] | None = None,
) -> list[Any]:
    items, _ = ApiListWatch(api, path, what, list_timeout=60, field_selector=field_selector, slim=slim).list()
    return items


def slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """What the view and the plugin lookup read of a pod, kept as each page is parsed: a cluster's
    pods whole would cost the CLI gigabytes (150,000 pods at several KB each)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}

    def container(c: dict[str, Any]) -> dict[str, Any]:
        return {"resources": c.get("resources") or {}, "ports": c.get("ports") or []}

    return {
        "metadata": {k: meta.get(k) for k in ("namespace", "name", "labels")},
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": [container(c) for c in spec.get("containers") or []],
            "initContainers": [container(c) for c in spec.get("initContainers") or []],
        },
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }


def list_if_served(api: ApiServer, path: str, what: str) -> list[Any]:
    """``list_all``, or nothing where the API server does not serve the resource (404)."""
    try:
        return list_all(api, path, what)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise


def plugin_chips(
    api: ApiServer, pods: list[Mapping[str, Any]], workers: int = 16
) -> dict[str, list[ChipStatus] | None]:
    """Each device-plugin pod's chips by node name, from its /metrics, parsed as it is read (None:
    it could not be read)."""

    def read(pod: Mapping[str, Any]) -> tuple[str, list[ChipStatus] | None]:
        meta, spec = pod["metadata"], pod["spec"]
        node = spec.get("nodeName", "")
        port = next(
            (
                p["containerPort"]
                for c in spec.get("containers") or []
                for p in c.get("ports") or []
                if p.get("name") == METRICS_PORT_NAME
            ),
            None,
        )
        if port is None or (pod.get("status") or {}).get("phase") != "Running":
            return node, None
        path = (
            f"/api/v1/namespaces/{quote(meta['namespace'])}/pods/{quote(meta['name'])}:{port}/proxy/metrics"
        )
        try:
            text = api.request(
                "GET", path, accept="text/plain", timeout=10, max_bytes=32 << 20, parse=bytes.decode
            )
        except OSError as exc:
            log.warning("cannot read %s/%s's /metrics: %s", meta["namespace"], meta["name"], exc)
            return node, None
        return node, chips_from_metrics(str(text), node)

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return dict(pool.map(read, pods))


def read_cluster(api: ApiServer, *, chips: bool = True) -> dict[str, Any]:
    """Everything :func:`ix_gpu.status.view.cluster_status` takes, as keyword arguments."""
    nodes = list_all(api, "/api/v1/nodes", "nodes")
    pods = list_all(
        api,
        "/api/v1/pods",
        "pods",
        field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
        slim=slim_pod,
    )
    slices = list_if_served(api, "/apis/resource.k8s.io/v1/resourceslices", "ResourceSlices")
    claims = (
        list_if_served(api, "/apis/resource.k8s.io/v1/resourceclaims", "ResourceClaims") if slices else []
    )
    found: dict[str, list[ChipStatus] | None] = {}
    if chips:
        key, value = PLUGIN_COMPONENT
        plugins = [p for p in pods if (p["metadata"].get("labels") or {}).get(key) == value]
        found = plugin_chips(api, plugins)
    return {"nodes": nodes, "pods": pods, "slices": slices, "claims": claims, "chips": found}
