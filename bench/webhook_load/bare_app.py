"""The framework floor: FastAPI + orjson and a hand-written injection, nothing else.

It parses the review, adds what ix-gpu's built-in ``iluvatar`` profile adds (the driver volume,
its mount, ``LD_LIBRARY_PATH`` prepended, the GPU toleration, the ``injected`` annotation) with a
few lines of code that know only that profile, and answers. No config, no bounds, no record, no
metrics, no logs, no namespace facts: the same uvicorn settings and TLS as the real service, so
the gap between the two is what ix-gpu's generality and safety cost.

    python bench/webhook_load/bare_app.py --cert-dir certs --port 9443 [--digest 91a2b21207]
"""

from __future__ import annotations

import argparse
import base64
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

RESOURCE = "iluvatar.com/gpu"
VOLUME = {"name": "ix-gpu-iluvatar-driver", "hostPath": {"path": "/usr/local/corex", "type": "Directory"}}
MOUNT = {"name": "ix-gpu-iluvatar-driver", "mountPath": "/usr/local/corex", "readOnly": True}
ENV_NAME, ENV_VALUE = "LD_LIBRARY_PATH", "/usr/local/corex/lib64"
TOLERATION = {"key": RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
DIGEST = ["0000000000"]

app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)


def _add(ops: list[dict[str, Any]], path: str, existing: Any, item: Any) -> None:
    if isinstance(existing, list):
        ops.append({"op": "add", "path": path + "/-", "value": item})
    else:
        ops.append({"op": "add", "path": path, "value": [item]})


def _containers(ops: list[dict[str, Any]], spec: dict[str, Any], list_name: str) -> bool:
    found = False
    for index, container in enumerate(spec.get(list_name) or []):
        limit = ((container.get("resources") or {}).get("limits") or {}).get(RESOURCE)
        if limit is None or int(limit) <= 0:
            continue
        found = True
        ptr = f"/spec/{list_name}/{index}"
        mounts = container.get("volumeMounts")
        if not any(m.get("mountPath") == MOUNT["mountPath"] for m in mounts or []):
            _add(ops, ptr + "/volumeMounts", mounts, MOUNT)
        env = container.get("env")
        at = next((i for i in range(len(env or []) - 1, -1, -1) if env[i].get("name") == ENV_NAME), -1)
        if at < 0:
            _add(ops, ptr + "/env", env, {"name": ENV_NAME, "value": ENV_VALUE})
        elif "valueFrom" not in env[at]:
            current = env[at].get("value") or ""
            if ENV_VALUE not in current.split(":"):
                merged = f"{ENV_VALUE}:{current}" if current else ENV_VALUE
                kind = "replace" if "value" in env[at] else "add"
                ops.append({"op": kind, "path": f"{ptr}/env/{at}/value", "value": merged})
    return found


def inject(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod.get("spec") or {}
    ops: list[dict[str, Any]] = []
    if not (_containers(ops, spec, "initContainers") | _containers(ops, spec, "containers")):
        return []
    volumes = spec.get("volumes")
    head: list[dict[str, Any]] = []
    if not any(v.get("name") == VOLUME["name"] for v in volumes or []):
        _add(head, "/spec/volumes", volumes, VOLUME)
    ops = head + ops
    tolerations = spec.get("tolerations")
    if TOLERATION not in (tolerations or []):
        _add(ops, "/spec/tolerations", tolerations, TOLERATION)
    value = f"iluvatar@{DIGEST[0]}"
    annotations = (pod.get("metadata") or {}).get("annotations")
    if annotations is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {"ix-gpu.io/injected": value}})
    elif annotations.get("ix-gpu.io/injected") != value:
        ops.append({"op": "add", "path": "/metadata/annotations/ix-gpu.io~1injected", "value": value})
    return ops


@app.post("/mutate")
async def mutate(request: Request) -> Response:
    review = orjson.loads(await request.body())
    req = review["request"]
    response: dict[str, Any] = {"uid": req["uid"], "allowed": True}
    pod = req.get("object")
    if req.get("operation") == "CREATE" and isinstance(pod, dict) and pod.get("kind") == "Pod":
        ops = inject(pod)
        if ops:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(orjson.dumps(ops)).decode()
    answer = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
    return Response(orjson.dumps(answer), media_type="application/json")


@app.get("/healthz")
async def healthz() -> Response:
    return Response(b'{"status":"ok"}', media_type="application/json")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cert-dir", default="certs")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9443)
    parser.add_argument("--digest", default=DIGEST[0], help="written into the injected annotation")
    args = parser.parse_args()
    DIGEST[0] = args.digest
    cert_dir = Path(args.cert_dir)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        server_header=False,
        timeout_keep_alive=30,
        log_level="warning",
        ssl_certfile=str(cert_dir / "tls.crt"),
        ssl_keyfile=str(cert_dir / "tls.key"),
    )


if __name__ == "__main__":
    main()
