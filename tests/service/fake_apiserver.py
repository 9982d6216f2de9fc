"""A small local stand-in for the kube-apiserver's Namespace endpoints, and the list and watch of
resource.k8s.io/v1 ResourceClaims and ResourceClaimTemplates (DRA), for unit-level tests.

It speaks the wire protocol the kubernetes client uses — list with ``metadata.resourceVersion``,
chunked watch streams of ``{"type", "object"}`` lines, bookmarks, ``ERROR`` events with a 410
Status when the requested resourceVersion is compacted, GET by name with a 404 Status — and lets a
test inject what a real apiserver does on a bad day: errors, compaction, held-back events, slowness.

The real-Kubernetes tier (tests/k8s) replaces this with a real kube-apiserver; the cache under test
is the same code, pointed at a different kubeconfig.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

NAMESPACES = "/api/v1/namespaces"
CLAIM_PATHS = {
    "ResourceClaim": "/apis/resource.k8s.io/v1/resourceclaims",
    "ResourceClaimTemplate": "/apis/resource.k8s.io/v1/resourceclaimtemplates",
}


@dataclass
class _Event:
    version: int
    type: str
    obj: dict[str, Any]
    path: str = NAMESPACES


@dataclass
class FakeApiServer:
    namespaces: dict[str, dict[str, Any]] = field(default_factory=dict)
    version: int = 100
    compacted_below: int = 0
    events: list[_Event] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=lambda: {"list": 0, "watch": 0, "get": 0})
    fail_next: int = 0
    """Answer this many coming requests with HTTP ``fail_status``."""
    fail_status: int = 500
    """500 (InternalError, worth another try), or 403 (Forbidden: the same answer again)."""
    hold_events: bool = False
    """Record changes without telling watchers (as if the watch lagged behind)."""
    get_delay: float = 0.0
    watch_gone_http: bool = False
    """Answer the next watch with HTTP 410 instead of an ERROR event."""
    always_gone: bool = False
    """Answer every list and watch with HTTP 410 (a storm: an apiserver or proxy gone wrong)."""
    silent_watches: bool = False
    """Accept watches, then send nothing and keep them open (not even the end at timeoutSeconds)
    until this is cleared: a connection that a proxy or a wedged apiserver left hanging."""
    claims: dict[str, dict[tuple[str, str], dict[str, Any]]] = field(
        default_factory=lambda: {path: {} for path in CLAIM_PATHS.values()}
    )
    """Collection path → (namespace, name) → ResourceClaim or ResourceClaimTemplate."""
    serves_dra: bool = True
    """False: resource.k8s.io/v1 answers 404, as on a cluster without DRA."""

    def __post_init__(self) -> None:
        self._cond = threading.Condition()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._closing = False

    # ------------------------------------------------------------------ test controls

    def put(
        self, name: str, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
    ) -> None:
        with self._cond:
            self.version += 1
            kind = "MODIFIED" if name in self.namespaces else "ADDED"
            obj = {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": name,
                    "uid": f"uid-{name}",
                    "resourceVersion": str(self.version),
                    "labels": {"kubernetes.io/metadata.name": name, **(labels or {})},
                    "annotations": dict(annotations or {}),
                },
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            }
            self.namespaces[name] = obj
            self.events.append(_Event(self.version, kind, obj))
            self._cond.notify_all()

    def put_claim(self, obj: dict[str, Any]) -> None:
        """Create or replace a ResourceClaim or ResourceClaimTemplate (``metadata.namespace`` set)."""
        with self._cond:
            self.version += 1
            path = CLAIM_PATHS[obj["kind"]]
            key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            kind = "MODIFIED" if key in self.claims[path] else "ADDED"
            stored = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
            self.claims[path][key] = stored
            self.events.append(_Event(self.version, kind, stored, path))
            self._cond.notify_all()

    def delete_claim(self, kind: str, namespace: str, name: str) -> None:
        with self._cond:
            self.version += 1
            path = CLAIM_PATHS[kind]
            obj = self.claims[path].pop((namespace, name))
            obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
            self.events.append(_Event(self.version, "DELETED", obj, path))
            self._cond.notify_all()

    def delete(self, name: str) -> None:
        with self._cond:
            self.version += 1
            obj = self.namespaces.pop(name)
            obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
            self.events.append(_Event(self.version, "DELETED", obj))
            self._cond.notify_all()

    def compact(self) -> None:
        """Forget history: watches from an older resourceVersion get 410 Gone."""
        with self._cond:
            self.compacted_below = self.version
            self.events.clear()
            self._cond.notify_all()

    def release_events(self) -> None:
        with self._cond:
            self.hold_events = False
            self._cond.notify_all()

    def count(self, call: str) -> int:
        with self._cond:
            return self.calls.get(call, 0)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        """Stop answering: open watches end, new connections are refused."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                    "current-context": "fake",
                }
            )
        )
        return path

    # ------------------------------------------------------------------ protocol

    def _take_failure(self) -> bool:
        with self._cond:
            if self.fail_next > 0:
                self.fail_next -= 1
                return True
            return False

    def _list_body(self, path: str = NAMESPACES) -> bytes:
        with self._cond:
            key = "list" if path == NAMESPACES else f"list {path}"
            self.calls[key] = self.calls.get(key, 0) + 1
            items = list(self.namespaces.values()) if path == NAMESPACES else list(self.claims[path].values())
            return json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "List",
                    "metadata": {"resourceVersion": str(self.version)},
                    "items": items,
                }
            ).encode()

    def _watch(
        self, handler: BaseHTTPRequestHandler, since: int, timeout: float, path: str = NAMESPACES
    ) -> None:
        with self._cond:
            key = "watch" if path == NAMESPACES else f"watch {path}"
            self.calls[key] = self.calls.get(key, 0) + 1
            gone_http, self.watch_gone_http = self.watch_gone_http or self.always_gone, False
        if gone_http:
            _send_status(handler, 410, "Expired", "too old resource version")
            return
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        # The handler closes the connection after a watch; say so, or the client pools it and
        # its next request fails with "Remote end closed connection without response".
        handler.send_header("Connection", "close")
        handler.end_headers()
        deadline = time.monotonic() + timeout
        sent = since
        try:
            with self._cond:
                while self.silent_watches and not self._closing:
                    self._cond.wait(0.1)
                    deadline = time.monotonic() + timeout
            while True:
                final = False
                with self._cond:
                    if self._closing:
                        break
                    if sent < self.compacted_below:
                        # Events this watcher has not seen were compacted away.
                        status: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "status": "Failure"}
                        status.update(code=410, reason="Expired", message=f"too old resource version: {sent}")
                        pending = [{"type": "ERROR", "object": status}]
                        final = True
                    elif self.hold_events:
                        pending = []
                    else:
                        pending = [
                            {"type": e.type, "object": e.obj}
                            for e in self.events
                            if e.version > sent and e.path == path
                        ]
                        if self.events:
                            sent = max(sent, self.events[-1].version)
                    if not pending:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._cond.wait(min(remaining, 0.5))
                        continue
                for event in pending:
                    _write_chunk(handler, json.dumps(event).encode() + b"\n")
                if final:
                    break
            _write_chunk(handler, b"")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _get(self, handler: BaseHTTPRequestHandler, name: str) -> None:
        with self._cond:
            self.calls["get"] += 1
            obj = self.namespaces.get(name)
            delay = self.get_delay
        if delay:
            time.sleep(delay)
        if obj is None:
            _send_status(handler, 404, "NotFound", f'namespaces "{name}" not found')
        else:
            _send_json(handler, 200, json.dumps(obj).encode())


def _write_chunk(handler: BaseHTTPRequestHandler, data: bytes) -> None:
    handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    handler.wfile.flush()


def _send_json(handler: BaseHTTPRequestHandler, code: int, body: bytes) -> None:
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _send_status(handler: BaseHTTPRequestHandler, code: int, reason: str, message: str) -> None:
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": message}
    _send_json(handler, code, json.dumps({**status, "code": code}).encode())


def _make_handler(api: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            url = urlparse(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            if api._take_failure():
                reason = "Forbidden" if api.fail_status == 403 else "InternalError"
                _send_status(self, api.fail_status, reason, "injected failure")
                return
            if url.path in CLAIM_PATHS.values() and not api.serves_dra:
                _send_status(self, 404, "NotFound", "the server could not find the requested resource")
                return
            if url.path == NAMESPACES or url.path in CLAIM_PATHS.values():
                if query.get("watch") in ("true", "1", "True"):
                    since = int(query.get("resourceVersion") or 0)
                    timeout = float(query.get("timeoutSeconds") or 30)
                    api._watch(self, since, timeout, url.path)
                    self.close_connection = True
                elif api.always_gone:
                    api._list_body(url.path)  # counted as a list
                    _send_status(self, 410, "Expired", "The provided continue parameter is too old")
                else:
                    _send_json(self, 200, api._list_body(url.path))
                return
            prefix = "/api/v1/namespaces/"
            if url.path.startswith(prefix) and "/" not in url.path[len(prefix) :]:
                api._get(self, url.path[len(prefix) :])
                return
            _send_status(self, 404, "NotFound", "no such path in the stand-in")

    return Handler
