"""A stand-in for the API server's resource.k8s.io/v1 endpoints the DRA plugin calls.

GET of a Node and of ResourceClaims; GET, POST and PUT of ResourceSlices with resourceVersion
checks (a stale PUT is a 409, as on the real server), and the server-side ``timeAdded`` the
apiserver fills into device taints; the list of ResourceSlices by ``spec.nodeName`` and
``spec.driver`` field selectors, which the device plugin's allocation check asks for; a merge-patch
of a Node's labels; the list of Pods by ``spec.nodeName`` (the device plugin's Volcano watch) and
a merge-patch of a Pod's annotations, with ``metadata.uid`` as a precondition. Nodes are listed by
``metadata.name``; the three lists can be watched (``?watch=1``): the stand-in compares what
matches every 20 ms and sends what changed since the list the watch continues, so tests may change
``nodes``, ``slices`` and ``pods`` directly. A path in
``denied`` answers 403, and ends the watches of that path (so does a fault); one in ``absent``
answers 404.
``faults`` maps a path to a transport fault its answers have: ``cut`` (the connection closes in
the middle of the body), ``junk`` (200 with a body that is not JSON), ``deep`` (200 with JSON
nested 100,000 levels deep, which no parser of ours may follow down) or ``500``. The real-cluster
tier replaces it with a kube-apiserver.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ix_gpu.kube.apiserver import ApiServer

RESOURCE = "/apis/resource.k8s.io/v1"


@dataclass
class FakeResourceApi:
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    claims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    """By ``namespace/name``."""
    patches: list[tuple[str, Any]] = field(default_factory=list)
    """Each PATCH of a pod: its ``namespace/name`` and the body."""
    calls: list[tuple[str, str]] = field(default_factory=list)
    version: int = 1
    denied: set[str] = field(default_factory=set)
    absent: set[str] = field(default_factory=set)
    """Paths that answer 404, as a collection whose API the cluster does not serve."""
    faults: dict[str, str] = field(default_factory=dict)
    listed: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """What each list answered, by its resourceVersion: the state a watch from it starts at."""
    drop_taints: bool = False
    """Store slices without their device taints, as an apiserver without DRADeviceTaints does."""
    drop_counters: bool = False
    """Drop shared counters and devices' counter consumption, as an apiserver without
    DRAPartitionableDevices does."""
    drop_shares: bool = False
    """Drop ``allowMultipleAllocations`` and capacity request policies, as an apiserver without
    DRAConsumableCapacity does."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_node(
        self, name: str, labels: dict[str, str] | None = None, allocatable: dict[str, str] | None = None
    ) -> None:
        self.nodes[name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "labels": dict(labels or {})},
            "status": {"allocatable": dict(allocatable or {})},
        }

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        annotations: dict[str, str] | None = None,
        phase: str = "Pending",
    ) -> dict[str, Any]:
        """A pod bound to ``node`` (tests change ``pods`` directly; the watch sends what changed)."""
        with self.lock:
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "namespace": namespace,
                    "name": name,
                    "uid": f"uid-{namespace}-{name}",
                    "annotations": dict(annotations or {}),
                },
                "spec": {"nodeName": node},
                "status": {"phase": phase},
            }
            self.pods[f"{namespace}/{name}"] = pod
            return pod

    def add_claim(
        self, namespace: str, name: str, uid: str, results: list[dict[str, Any]] | None
    ) -> dict[str, Any]:
        claim: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.iluvatar.com"}}]}
            },
            "status": {} if results is None else {"allocation": {"devices": {"results": results}}},
        }
        self.claims[(namespace, name)] = claim
        return claim

    def count(self, method: str, prefix: str = "") -> int:
        with self.lock:
            return sum(1 for m, p in self.calls if m == method and p.startswith(prefix))

    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        with self.lock:
            path, _, query = path.partition("?")
            self.calls.append((method, path))
            if path in self.denied:
                return 403, _status(403, "Forbidden")
            if path in self.absent:
                return 404, _status(404, "NotFound")
            parts = path.strip("/").split("/")
            if path in (f"{RESOURCE}/resourceslices", "/api/v1/nodes", "/api/v1/pods") and method == "GET":
                return 200, self._list(path, query)
            if len(parts) == 6 and parts[-2] == "pods" and method == "PATCH":
                return self._patch_pod(f"{parts[3]}/{parts[5]}", body)
            if path.startswith("/api/v1/nodes/") and method == "GET":
                node = self.nodes.get(parts[-1])
                return (200, node) if node else (404, _status(404, "NotFound"))
            if path.startswith("/api/v1/nodes/") and method == "PATCH":
                node = self.nodes.get(parts[-1])
                if node is None:
                    return 404, _status(404, "NotFound")
                for key, value in ((body.get("metadata") or {}).get("labels") or {}).items():
                    if value is None:
                        node["metadata"]["labels"].pop(key, None)
                    else:
                        node["metadata"]["labels"][key] = value
                return 200, node
            if (
                path.startswith(f"{RESOURCE}/namespaces/")
                and parts[-2] == "resourceclaims"
                and method == "GET"
            ):
                claim = self.claims.get((parts[-3], parts[-1]))
                return (200, claim) if claim else (404, _status(404, "NotFound"))
            if path == f"{RESOURCE}/resourceslices" and method == "POST":
                name = body["metadata"]["name"]
                if name in self.slices:
                    return 409, _status(409, "AlreadyExists")
                return 201, self._store(body)
            if path.startswith(f"{RESOURCE}/resourceslices/"):
                name = parts[-1]
                if method == "GET":
                    stored = self.slices.get(name)
                    return (200, stored) if stored else (404, _status(404, "NotFound"))
                if method == "PUT":
                    stored = self.slices.get(name)
                    if stored is None:
                        return 404, _status(404, "NotFound")
                    if body["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]:
                        return 409, _status(409, "Conflict")
                    return 200, self._store(body)
                if method == "DELETE":
                    gone = self.slices.pop(name, None)
                    return (200, gone) if gone else (404, _status(404, "NotFound"))
            return 404, _status(404, "NotFound")

    def matching(self, path: str, query: str) -> dict[str, dict[str, Any]]:
        """Copies of the nodes or slices ``query``'s field selector matches, by name (lock held)."""
        wanted: dict[str, str] = {}
        for selector in urllib.parse.parse_qs(query).get("fieldSelector", []):
            for term in selector.split(","):
                key, _, value = term.partition("=")
                wanted[key] = value
        found = {"/api/v1/nodes": self.nodes, "/api/v1/pods": self.pods}.get(path, self.slices)
        return {
            name: copy.deepcopy(obj)
            for name, obj in found.items()
            if all(_field(obj, key) == value for key, value in wanted.items())
        }

    def _list(self, path: str, query: str) -> dict[str, Any]:
        items = self.matching(path, query)
        self.version += 1
        self.listed[str(self.version)] = items
        kind = {"/api/v1/nodes": "NodeList", "/api/v1/pods": "PodList"}.get(path, "ResourceSliceList")
        return {
            "kind": kind,
            "apiVersion": "v1" if path.startswith("/api/v1/") else "resource.k8s.io/v1",
            "metadata": {"resourceVersion": str(self.version)},
            "items": list(copy.deepcopy(items).values()),
        }

    def changes(self, path: str, query: str, seen: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        """Watch events for what changed since ``seen`` (updated in place)."""
        with self.lock:
            now = self.matching(path, query)
            events = []
            for name, obj in now.items():
                if seen.get(name) != obj:
                    self.version += 1
                    sent = copy.deepcopy(obj)
                    sent["metadata"]["resourceVersion"] = str(self.version)
                    events.append({"type": "MODIFIED" if name in seen else "ADDED", "object": sent})
            for name in set(seen) - set(now):
                self.version += 1
                gone = copy.deepcopy(seen[name])
                gone["metadata"]["resourceVersion"] = str(self.version)
                events.append({"type": "DELETED", "object": gone})
            seen.clear()
            seen.update(now)
            return events

    def _patch_pod(self, key: str, body: Any) -> tuple[int, Any]:
        """A merge patch of the pod's annotations (lock held), refused when ``metadata.uid`` names
        another pod (the apiserver's uid precondition)."""
        pod = self.pods.get(key)
        if pod is None:
            return 404, _status(404, "NotFound")
        metadata = (body or {}).get("metadata") or {}
        if metadata.get("uid", pod["metadata"]["uid"]) != pod["metadata"]["uid"]:
            return 409, _status(409, "Conflict")
        self.patches.append((key, copy.deepcopy(body)))
        for name, value in (metadata.get("annotations") or {}).items():
            if value is None:
                pod["metadata"]["annotations"].pop(name, None)
            else:
                pod["metadata"]["annotations"][name] = value
        return 200, pod

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.version)
        if self.drop_counters:  # an apiserver without DRAPartitionableDevices
            stored["spec"].pop("sharedCounters", None)
        for device in stored["spec"].get("devices", []):
            if self.drop_counters:
                device.pop("consumesCounters", None)
            if self.drop_shares:
                device.pop("allowMultipleAllocations", None)
                for capacity in (device.get("capacity") or {}).values():
                    capacity.pop("requestPolicy", None)
            if self.drop_taints:
                device.pop("taints", None)
            for taint in device.get("taints", []):
                taint.setdefault("timeAdded", "2026-01-01T00:00:00Z")
        self.slices[stored["metadata"]["name"]] = stored
        return stored


def _field(obj: dict[str, Any], key: str) -> Any:
    """``metadata.name`` or ``spec.nodeName`` of ``obj``."""
    section, _, name = key.partition(".")
    return (obj.get(section) or {}).get(name)


def _status(code: int, reason: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason}


@contextmanager
def serving(api: FakeResourceApi) -> Iterator[ApiServer]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Buffered, so that a response leaves in one write, as from the Go apiserver: written in
        # two (headers, body) on a kept-alive connection, Nagle's algorithm held the body back
        # until the client's delayed ACK, 40 ms later.
        wbufsize = -1

        def log_message(self, *args: Any) -> None:
            pass

        def _watch(self, path: str, query: str) -> None:
            params = urllib.parse.parse_qs(query)
            with api.lock:
                api.calls.append(("WATCH", path))
                fault = api.faults.get(path)
                if path in api.denied:
                    code, raw = 403, json.dumps(_status(403, "Forbidden")).encode()
                elif fault == "500":
                    code, raw = 500, json.dumps(_status(500, "InternalError")).encode()
                else:
                    code, raw = 200, b""
                listed = api.listed.get(params.get("resourceVersion", [""])[0])
                seen = copy.deepcopy(listed) if listed is not None else api.matching(path, query)
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            if code != 200:
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
                return
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            if fault in ("junk", "cut"):  # a proxy's error page, or an event cut off mid-line
                self.wfile.write(b"<html>502 Bad Gateway</html>\n" if fault == "junk" else b'{"type": "MOD')
                return
            self.wfile.flush()
            deadline = time.monotonic() + float(params.get("timeoutSeconds", ["300"])[0])
            while (
                time.monotonic() < deadline
                and path not in api.denied
                and path not in api.faults
                and not stopping.is_set()
            ):
                for event in api.changes(path, query, seen):
                    self.wfile.write(json.dumps(event).encode() + b"\n")
                self.wfile.flush()
                time.sleep(0.02)

        def _answer(self, method: str) -> None:
            path, _, query = self.path.partition("?")
            if method == "GET" and "watch=1" in query.split("&"):
                with contextlib.suppress(OSError):  # the client went away
                    self._watch(path, query)
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            code, answer = api.handle(method, self.path, body)
            raw = json.dumps(answer).encode()
            fault = api.faults.get(self.path.partition("?")[0])
            if fault == "500":
                code, raw = 500, json.dumps(_status(500, "InternalError")).encode()
            elif fault == "junk":
                code, raw = 200, b"<html>502 Bad Gateway</html>"
            elif fault == "deep":
                code, raw = 200, b'{"a":' * 100_000 + b"1" + b"}" * 100_000
            elif fault == "cut":
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw) + 100))
                self.end_headers()
                self.wfile.write(raw[: len(raw) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

        def do_DELETE(self) -> None:
            self._answer("DELETE")

        def do_PUT(self) -> None:
            self._answer("PUT")

        def do_PATCH(self) -> None:
            self._answer("PATCH")

    stopping = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield ApiServer(f"http://127.0.0.1:{server.server_port}", "t0ken", None)
    finally:
        stopping.set()
        server.shutdown()
        server.server_close()
