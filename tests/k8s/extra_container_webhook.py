"""A tiny second mutating webhook for the reinvocation test: it appends a container that requests a
GPU, so that the real apiserver has to call ix-gpu's webhook again (``reinvocationPolicy: IfNeeded``).

HTTPS on loopback in a thread of the test process; it records every AdmissionReview it receives so the
test can tell in which order the apiserver called the webhooks.
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SIDECAR_NAME = "gpu-sidecar"
SIDECAR_RESOURCE = "iluvatar.com/gpu"


def sidecar_patch(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch that appends the sidecar, or nothing when it is already there."""
    containers = (pod.get("spec") or {}).get("containers") or []
    if any(c.get("name") == SIDECAR_NAME for c in containers):
        return []
    sidecar = {
        "name": SIDECAR_NAME,
        "image": "registry.invalid/sidecar:1",
        "resources": {"limits": {SIDECAR_RESOURCE: "1"}},
    }
    return [{"op": "add", "path": "/spec/containers/-", "value": sidecar}]


class ExtraContainerWebhook:
    """``start()`` serves POST /mutate on 127.0.0.1:<port>; ``seen`` holds the objects it was sent."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.seen: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                review = json.loads(self.rfile.read(length))
                request = review["request"]
                obj = request.get("object") or {}
                outer.seen.append(obj)
                response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
                patch = sidecar_patch(obj)
                if patch:
                    response["patchType"] = "JSONPatch"
                    response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
                body = json.dumps(
                    {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="extra-webhook", daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}/mutate"

    def start(self) -> ExtraContainerWebhook:
        self._thread.start()
        return self

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
