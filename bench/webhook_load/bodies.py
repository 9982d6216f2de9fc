"""The two AdmissionReview bodies the load benchmark posts.

* ``pod-14k``: a 10-container Pod, 3 containers asking for ``iluvatar.com/gpu``, 13 env vars and
  2 volume mounts each — about 14 KB as a review. The webhook injects into 3 containers.
* ``pod-2k``: a one-container GPU Pod with ordinary metadata — about 2 KB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _container(index: int, gpu: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": f"worker-{index}",
        "image": "registry.example.com/ml/trainer:2024.11.3",
        "command": ["/bin/sh", "-c", "exec python /app/train.py --epochs 10"],
        "env": [{"name": f"SETTING_{j}", "value": f"value-{index}-{j}-" + "x" * 32} for j in range(13)],
        "volumeMounts": [
            {"name": "data", "mountPath": f"/data/{index}"},
            {"name": "cache", "mountPath": f"/cache/{index}"},
        ],
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
    }
    if gpu:
        body["resources"]["limits"]["iluvatar.com/gpu"] = "1"
    return body


def _review(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": obj["metadata"]["name"],
            "namespace": "ml-team",
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "a1b2c3d4-0000-4000-8000-000000000001",
                "groups": [
                    "system:serviceaccounts",
                    "system:serviceaccounts:kube-system",
                    "system:authenticated",
                ],
            },
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def _pod(name: str, containers: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml-team",
            "generateName": name.rsplit("-", 1)[0] + "-",
            "labels": {"app": "trainer", "pod-template-hash": "7d9f8c6b5", "tier": "gpu"},
            "annotations": {"team": "ml", "owner": "alice"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "trainer-7d9f8c6b5",
                    "uid": "0f3c2b1a-1111-4222-8333-444455556666",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": containers,
            "volumes": [{"name": "data", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}],
            "restartPolicy": "Always",
            "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 30,
        },
    }


def big_review() -> dict[str, Any]:
    return _review(_pod("trainer-7d9f8c6b5-x2v4q", [_container(i, gpu=i < 3) for i in range(10)]))


def small_review() -> dict[str, Any]:
    container = _container(0, gpu=True)
    container["env"] = container["env"][:6]
    return _review(_pod("trainer-7d9f8c6b5-k8s2p", [container]))


def write_bodies(out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, doc in (("pod-14k", big_review()), ("pod-2k", small_review())):
        path = out / f"{name}.json"
        path.write_bytes(json.dumps(doc, separators=(",", ":")).encode())
        paths[name] = path
    return paths


if __name__ == "__main__":
    import sys

    for name, path in write_bodies(Path(sys.argv[1] if len(sys.argv) > 1 else "bench-bodies")).items():
        print(f"{name}: {path} ({path.stat().st_size} bytes)")
