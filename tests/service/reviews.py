"""AdmissionReview requests and the objects inside them, as the apiserver would send them."""

from __future__ import annotations

import base64
import copy
import json
import uuid
from typing import Any

import jsonpatch

GROUP_VERSION_KIND = {
    "Pod": {"group": "", "version": "v1", "kind": "Pod"},
    "TFJob": {"group": "kubeflow.org", "version": "v1", "kind": "TFJob"},
}
RESOURCE = {
    "Pod": {"group": "", "version": "v1", "resource": "pods"},
    "TFJob": {"group": "kubeflow.org", "version": "v1", "resource": "tfjobs"},
}


def review(
    obj: dict[str, Any] | None,
    *,
    namespace: str = "team-a",
    operation: str = "CREATE",
    dry_run: bool = False,
    uid: str | None = None,
    old: dict[str, Any] | None = None,
) -> dict[str, Any]:
    source = obj or old or {}
    kind = source.get("kind") if isinstance(source.get("kind"), str) else "Pod"
    metadata = source.get("metadata") if isinstance(source.get("metadata"), dict) else {}
    name = metadata.get("name") if isinstance(metadata.get("name"), str) else ""
    # Deep-copied: callers (the fuzz test) damage reviews in place; the tables must stay intact.
    return copy.deepcopy(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid or str(uuid.uuid4()),
                "kind": GROUP_VERSION_KIND.get(kind, {"group": "example.com", "version": "v1", "kind": kind}),
                "resource": RESOURCE.get(
                    kind, {"group": "example.com", "version": "v1", "resource": "things"}
                ),
                "requestKind": GROUP_VERSION_KIND.get(kind),
                "name": name,
                "namespace": namespace,
                "operation": operation,
                "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
                "object": obj,
                "oldObject": old,
                "dryRun": dry_run,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
            },
        }
    )


def container(
    name: str, gpus: Any = None, resource: str = "iluvatar.com/gpu", **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "image": "corex:4.0.0", **extra}
    if gpus is not None:
        body["resources"] = {"limits": {resource: gpus}}
    return body


def pod(
    name: str = "p",
    containers: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    namespace: str = "team-a",
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": containers if containers is not None else [container("main", 1)]},
    }


def tfjob(gpus: Any = 1, resource: str = "nvidia.com/gpu", namespace: str = "team-a") -> dict[str, Any]:
    def replica(replicas: int, with_gpu: bool) -> dict[str, Any]:
        tf = {"name": "tensorflow", "image": "tensorflow/tensorflow:2.15.0-gpu"}
        if with_gpu:
            tf["resources"] = {"limits": {resource: gpus}}
        return {
            "replicas": replicas,
            "restartPolicy": "OnFailure",
            "template": {"spec": {"containers": [tf]}},
        }

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "mnist", "namespace": namespace},
        "spec": {
            "tfReplicaSpecs": {"Chief": replica(1, gpus is not None), "Worker": replica(2, gpus is not None)},
            "runPolicy": {"cleanPodPolicy": "None"},
        },
    }


def ten_container_gpu_pod() -> dict[str, Any]:
    """The benchmark's big review (~14 KB): 10 containers, 3 asking for GPUs, 13 env vars and 2
    mounts each."""
    containers = []
    for i in range(10):
        body = container(f"c{i}", 1 if i < 3 else None)
        body["env"] = [{"name": f"SETTING_{j}", "value": f"value-{i}-{j}-" + "x" * 40} for j in range(13)]
        body["volumeMounts"] = [
            {"name": "data", "mountPath": f"/data/{i}"},
            {"name": "cache", "mountPath": f"/cache/{i}"},
        ]
        body["command"] = ["/bin/sh", "-c", "exec python /app/train.py --epochs 10"]
        if i >= 3:
            body["resources"] = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
        containers.append(body)
    obj = pod("trainer-7d9f", containers, annotations={"team": "ml", "owner": "alice"})
    obj["metadata"]["labels"] = {"app": "trainer", "tier": "gpu"}
    obj["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}]
    obj["spec"]["restartPolicy"] = "Never"
    return obj


def apply_response(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """The object after the response's patch (a copy; unchanged when there is no patch)."""
    if "patch" not in response:
        return copy.deepcopy(obj)
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert isinstance(ops, list) and ops
    return jsonpatch.apply_patch(obj, ops)  # type: ignore[no-any-return]
