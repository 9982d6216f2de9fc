"""The objects ``ix-gpu status`` reads, shaped as the API server and the device plugin's /metrics
give them, for the view's tests and the reader's (over a fake API server)."""

from __future__ import annotations

from typing import Any

from ix_gpu.serving.text_metrics import Gauge, labels_text

RESOURCE, DRIVER = "iluvatar.com/gpu", "gpu.iluvatar.com"
CHIP_LABELS = ("node", "uuid", "index", "board", "product")


def node(name: str, gpus: int = 0, dra: bool = False, product: str = "BI-V100") -> dict[str, Any]:
    labels = {"ix-gpu.io/gpu.product": product}
    if dra:
        labels["ix-gpu.io/gpu.allocation"] = "dra"
    allocatable = {"cpu": "8", **({RESOURCE: str(gpus)} if gpus else {})}
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}


def pod(namespace: str, name: str, node_name: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    container = {"name": "main", "resources": {"limits": {RESOURCE: str(gpus)}}}
    return {
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"nodeName": node_name, "containers": [container]},
        "status": {"phase": phase},
    }


def metrics(
    node_name: str, chips: int, held: dict[int, list[tuple[str, str, str]]], sick: dict[int, str]
) -> str:
    """A device plugin's /metrics for ``chips`` chips: holders (namespace, pod, claim) and problems."""
    lines = ["# TYPE ix_gpu_chip_telemetry_stale gauge"]
    for index in range(chips):
        values = (node_name, f"GPU-{node_name}-{index}", str(index), f"board{index // 2}", "Iluvatar BI-V100")
        lines.append(f"ix_gpu_chip_telemetry_stale{labels_text(CHIP_LABELS, values)} 0.0")
    lines.append("# TYPE ix_gpu_chip_health_problem gauge")
    for index in range(chips):
        values = (node_name, f"GPU-{node_name}-{index}", str(index), f"board{index // 2}", "Iluvatar BI-V100")
        for problem in ("over temperature", "ECC error"):
            bad = 1.0 if sick.get(index) == problem else 0.0
            series = labels_text((*CHIP_LABELS, "problem"), (*values, problem))
            lines.append(f"ix_gpu_chip_health_problem{series} {bad}")
    lines.append("# TYPE ix_gpu_chip_allocation gauge")
    names = (*CHIP_LABELS, "namespace", "pod", "container", "claim")
    for index, holders in held.items():
        values = (node_name, f"GPU-{node_name}-{index}", str(index), f"board{index // 2}", "Iluvatar BI-V100")
        for namespace, pod_name, claim in holders:
            series = labels_text(names, (*values, namespace, pod_name, "main", claim))
            lines.append(f"ix_gpu_chip_allocation{series} 1.0")
    # Another family's series are ignored, whatever their labels.
    other = Gauge("ix_gpu_plugin_registered", "registered")
    other.set(1)
    return "\n".join([*lines, *other.render()]) + "\n"


def slice_(node_name: str, devices: int, tainted: tuple[int, ...] = ()) -> dict[str, Any]:
    return {
        "spec": {
            "driver": DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name},
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {"uuid": {"string": f"GPU-{node_name}-{i}"}},
                    **(
                        {"taints": [{"key": "gpu.iluvatar.com/unhealthy", "effect": "NoSchedule"}]}
                        if i in tainted
                        else {}
                    ),
                }
                for i in range(devices)
            ],
        }
    }


def claim(namespace: str, name: str, node_name: str, device: str, pods: list[str]) -> dict[str, Any]:
    result = {"request": "gpu", "driver": DRIVER, "pool": node_name, "device": device}
    return {
        "metadata": {"namespace": namespace, "name": name},
        "status": {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"resource": "pods", "name": p, "uid": "x"} for p in pods],
        },
    }
