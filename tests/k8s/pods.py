"""Pods and events through the API, for the mini-cluster suites: create and wait, read what fake-cri
gave a container, and find the scheduler's verdict."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.k8s.cluster import RESOURCE
from tests.k8s.k8s_tier import KubeAPI
from tests.support.waiting import wait_until

COREX_SCRIPT = """echo "IX_VISIBLE_DEVICES=${IX_VISIBLE_DEVICES:-}"
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
echo "device nodes: $(ls /dev/iluvatar* | tr '\\n' ' ')"
echo "driver root: $(ls /usr/local/corex | tr '\\n' ' ')"
echo "corex-example done"
exec sleep 3600
"""
"""What the seed's ``ixsmi -l`` would show, then hold the GPU: the corex-example pod's command."""


def request_ok(api: KubeAPI, method: str, path: str, body: Any = None) -> Any:
    status, reply = api.request(method, path, body)
    assert status in (200, 201), f"{method} {path}: {status} {reply}"
    return reply


def get_pod(api: KubeAPI, namespace: str, name: str) -> dict[str, Any] | None:
    status, pod = api.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    return pod if status == 200 and isinstance(pod, dict) else None


def wait_pod(
    api: KubeAPI,
    namespace: str,
    name: str,
    what: str,
    probe: Callable[[dict[str, Any]], dict[str, Any] | None],
    timeout: float,
) -> dict[str, Any]:
    """Poll pod ``name`` until ``probe`` of it gives something, and return that; on timeout the
    failure says ``what`` was awaited and shows the pod."""

    def probed() -> dict[str, Any] | None:
        pod = get_pod(api, namespace, name)
        return probe(pod) if pod is not None else None

    result: dict[str, Any] = wait_until(
        probed,
        f"{what} of pod {namespace}/{name}",
        timeout,
        interval=0.25,
        details=lambda: json.dumps(get_pod(api, namespace, name), indent=1)[-3000:],
    )
    return result


def wait_running(api: KubeAPI, namespace: str, name: str, timeout: float = 90) -> dict[str, Any]:
    def running(pod: dict[str, Any]) -> dict[str, Any] | None:
        return pod if pod.get("status", {}).get("phase") == "Running" else None

    return wait_pod(api, namespace, name, "phase Running", running, timeout)


def wait_ended(api: KubeAPI, namespace: str, name: str, timeout: float = 90) -> dict[str, Any]:
    """Pod ``name`` once it is Succeeded or Failed."""

    def ended(pod: dict[str, Any]) -> dict[str, Any] | None:
        return pod if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    return wait_pod(api, namespace, name, "Succeeded or Failed", ended, timeout)


def wait_failed(api: KubeAPI, namespace: str, name: str, timeout: float = 120) -> dict[str, Any]:
    """Pod ``name`` once it is Failed (the kubelet refused it at admission, say)."""

    def failed(pod: dict[str, Any]) -> dict[str, Any] | None:
        return pod if pod.get("status", {}).get("phase") == "Failed" else None

    return wait_pod(api, namespace, name, "phase Failed", failed, timeout)


def new_namespace(api: KubeAPI, name: str) -> str:
    """Create namespace ``name`` and wait for its default ServiceAccount (ServiceAccount admission
    refuses pods until the controller made it); returns its API path."""
    request_ok(api, "POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    path = f"/api/v1/namespaces/{name}"
    wait_until(
        lambda: api.request("GET", f"{path}/serviceaccounts/default")[0] == 200,
        f"the default ServiceAccount of {name}",
        60,
        interval=0.25,
    )
    return path


def gpu_pod(
    name: str, node: str | None, command: list[str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A one-GPU pod (``RESOURCE``), pinned to ``node`` unless None."""
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "busybox", "command": command, "resources": {"limits": {RESOURCE: "1"}}}
        ],
        "terminationGracePeriodSeconds": 1,
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    metadata: dict[str, Any] = {"name": name}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def iluvatar_paths(record: dict[str, Any]) -> tuple[str, ...]:
    """The /dev/iluvatar* device nodes fake-cri gave a container (what the plugin's Allocate returned)."""
    return tuple(
        sorted(d["container_path"] for d in record["devices"] if "/dev/iluvatar" in d["container_path"])
    )


def scheduling_failure(api: KubeAPI, namespace: str, pod: str, timeout: float = 60) -> dict[str, Any]:
    """The scheduler's FailedScheduling event for ``pod`` (waits for it)."""

    def event() -> dict[str, Any] | None:
        status, events = api.request(
            "GET",
            f"/api/v1/namespaces/{namespace}/events"
            f"?fieldSelector=involvedObject.kind%3DPod,involvedObject.name%3D{pod}",
        )
        assert status == 200, events
        for item in events.get("items", []):
            if item.get("reason") == "FailedScheduling":
                return dict(item)
        return None

    found: dict[str, Any] = wait_until(
        event, f"the scheduler's FailedScheduling event for {pod}", timeout, interval=0.5
    )
    reporters = (found.get("reportingComponent"), found.get("source", {}).get("component"))
    assert "default-scheduler" in reporters, found
    return found


def pod_condition(api: KubeAPI, namespace: str, name: str, kind: str, timeout: float = 30) -> dict[str, Any]:
    """Condition ``kind`` of pod ``name`` (waits for it). The scheduler sends its event and patches
    the pod's status separately, so a condition may show up after the event that told of it."""

    def condition(pod: dict[str, Any]) -> dict[str, Any] | None:
        found = [c for c in pod.get("status", {}).get("conditions", []) if c.get("type") == kind]
        return dict(found[0]) if found else None

    return wait_pod(api, namespace, name, f"condition {kind}", condition, timeout)
