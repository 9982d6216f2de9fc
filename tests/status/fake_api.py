"""A fake API server on loopback for ``ix-gpu status``'s reader: the lists it makes (paged a few
objects at a time, whatever ``limit`` asks, as an apiserver may; label selectors on every list)
and the device plugins' /metrics through the pod proxy, with the failures a real cluster gives: a
continue token that expired (410 Gone), an answer that never comes, a page that is not Prometheus
text. It serves the release's DaemonSet and ClusterRoleBinding too, which say whose pods to
believe. Over real HTTP, so the reader's query strings and socket timeouts are the ones it sends
and sets."""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from ix_gpu.kube.apiserver import ApiServer

PLUGIN_LABELS = {
    "app.kubernetes.io/name": "ix-gpu",
    "app.kubernetes.io/instance": "ixd",
    "app.kubernetes.io/component": "device-plugin",
}
"""What the chart's DaemonSet puts on its device-plugin pods (release ``ixd``)."""

PLUGIN = "ixd-ix-gpu-plugin"
"""The chart's name for the plugin's DaemonSet, ServiceAccount and ClusterRoleBinding (release ``ixd``)."""
PLUGIN_UID = "5f0c7a52-0000-4000-8000-00000000d5e7"
"""The release's DaemonSet's UID."""

PROXY = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/:]+):(\d+)/proxy/metrics$")
NAMESPACED_PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")
NAMESPACED_DAEMONSETS = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/daemonsets$")
BINDINGS = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"


def controller(kind: str = "DaemonSet", name: str = PLUGIN, uid: str = PLUGIN_UID) -> dict[str, Any]:
    """An ownerReference with ``controller: true``, as the DaemonSet controller sets it."""
    api_version = "apps/v1" if kind in ("DaemonSet", "ReplicaSet") else "v1"
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}


def plugin_pod(
    name: str,
    node: str,
    namespace: str = "ix-gpu-system",
    labels: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
    account: str = PLUGIN,
) -> dict[str, Any]:
    """A device-plugin pod as the chart's DaemonSet makes it, running on ``node``: owned by
    ``owners`` (the release's DaemonSet by default), as ServiceAccount ``account``."""
    return {
        "metadata": {
            "namespace": namespace,
            "name": name,
            "labels": dict(PLUGIN_LABELS if labels is None else labels),
            "ownerReferences": [controller()] if owners is None else owners,
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": account,
            "containers": [{"name": "device-plugin", "ports": [{"name": "metrics", "containerPort": 9400}]}],
        },
        "status": {"phase": "Running"},
    }


def daemonset(
    namespace: str = "ix-gpu-system", name: str = PLUGIN, uid: str = PLUGIN_UID, account: str = PLUGIN
) -> dict[str, Any]:
    """The chart's device-plugin DaemonSet, whose pods run as ``account``."""
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": uid, "labels": dict(PLUGIN_LABELS)},
        "spec": {
            "template": {"metadata": {"labels": dict(PLUGIN_LABELS)}, "spec": {"serviceAccountName": account}}
        },
    }


def binding(namespace: str = "ix-gpu-system", account: str = PLUGIN) -> dict[str, Any]:
    """The chart's ClusterRoleBinding of the plugin's ServiceAccount ``namespace/account``."""
    return {
        "metadata": {"name": PLUGIN, "labels": dict(PLUGIN_LABELS)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": PLUGIN},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }


@dataclass
class FakeCluster:
    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    slices: list[dict[str, Any]] | None = field(default_factory=list)
    """None: ``resource.k8s.io/v1`` is not served (404)."""
    claims: list[dict[str, Any]] = field(default_factory=list)
    daemonsets: list[dict[str, Any]] = field(default_factory=lambda: [daemonset()])
    bindings: list[dict[str, Any]] = field(default_factory=lambda: [binding()])
    """ClusterRoleBindings."""
    metrics: dict[str, str | bytes] = field(default_factory=dict)
    """Each pod's /metrics by ``namespace/name``; a pod without one answers 503."""
    page_size: int = 2
    gone: dict[str, int] = field(default_factory=dict)
    """Path → how many more continue requests to answer 410 Gone."""
    hang: set[str] = field(default_factory=set)
    """Paths (or ``namespace/name`` of a pod's /metrics) whose answer never comes."""
    status: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    """Path → an answer of this status and body instead of the list."""
    seen: list[str] = field(default_factory=list)
    """Every request's path and query, in order."""
    released: threading.Event = field(default_factory=threading.Event)
    """Set at the end of a test, to let hanging answers go."""

    def lists(self, path: str) -> list[dict[str, Any]] | None:
        if path == "/api/v1/nodes":
            return self.nodes
        if path == "/api/v1/pods":
            return self.pods
        if path == "/apis/resource.k8s.io/v1/resourceslices":
            return self.slices
        if path == "/apis/resource.k8s.io/v1/resourceclaims":
            return None if self.slices is None else self.claims
        if path == BINDINGS:
            return self.bindings
        for pattern, items in ((NAMESPACED_PODS, self.pods), (NAMESPACED_DAEMONSETS, self.daemonsets)):
            if found := pattern.match(path):
                return [o for o in items if o["metadata"]["namespace"] == unquote(found[1])]
        return None

    def answer(self, target: str) -> tuple[int, bytes, str]:
        """The status, body and content type of a GET of ``target``."""
        self.seen.append(target)
        split = urlsplit(target)
        path, query = split.path, {k: v[0] for k, v in parse_qs(split.query).items()}
        proxied = PROXY.match(path)
        key = f"{proxied[1]}/{proxied[2]}" if proxied else path
        if key in self.hang:
            self.released.wait(30)
            return 503, b"released", "text/plain"
        if path in self.status:
            code, body = self.status[path]
            return code, body, "application/json"
        if proxied:
            found = self.metrics.get(key)
            if found is None:
                return 503, b"no endpoint", "text/plain"
            return 200, found if isinstance(found, bytes) else found.encode(), "text/plain"
        items = self.lists(path)
        if items is not None and "labelSelector" in query:
            wanted = dict(term.split("=", 1) for term in query["labelSelector"].split(",") if term)
            items = [
                o
                for o in items
                if all((o["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())
            ]
        if items is None:
            return 404, b'{"kind": "Status", "code": 404}', "application/json"
        start = int(query.get("continue", "0"))
        if start and self.gone.get(path, 0) > 0:
            self.gone[path] -= 1
            return 410, b'{"kind": "Status", "code": 410, "reason": "Expired"}', "application/json"
        end = start + self.page_size
        more = str(end) if end < len(items) else ""
        page = {"metadata": {"resourceVersion": "7", "continue": more}, "items": items[start:end]}
        return 200, json.dumps(page).encode(), "application/json"

    def lists_of(self, path: str) -> list[str]:
        """The requests made for ``path``, with their queries."""
        return [s for s in self.seen if urlsplit(s).path == path]


def handler_for(cluster: FakeCluster) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code, body, content_type = cluster.answer(self.path)
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(OSError):  # the client gave up (a deadline)
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def serve(cluster: FakeCluster) -> Iterator[str]:
    """Serve ``cluster`` until the generator is closed; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(cluster))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        cluster.released.set()
        server.shutdown()
        server.server_close()


def api_of(url: str) -> ApiServer:
    return ApiServer(url, "t0ken", None)


def write_kubeconfig(path: Path, url: str) -> Path:
    """A kubeconfig with a token user, as ``ix-gpu status --kubeconfig`` reads one."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "alice", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "alice"}}],
        "current-context": "fake",
    }
    path.write_text(json.dumps(config))
    return path


Run = Callable[..., tuple[int, str, str]]
"""``ix-gpu status ARGS...`` run in this process: (exit code, stdout, stderr)."""
