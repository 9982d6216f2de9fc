"""``ix-gpu status -o json`` at cluster scale: its peak memory with each listed object cut down to
what the view reads as its page is parsed (as shipped), and with nodes, slices and claims kept whole
(the reader's cut-down functions swapped for the identity: how it read them before).

    .venv/bin/python bench/status_memory.py [--nodes 1000,5000] [--k8s-bin DIR] [--etcd-bin DIR] [--json]

A real etcd and kube-apiserver (the tier's oldest supported, ``tests/k8s/build.sh``; or
``--k8s-bin DIR``), on ports and in directories of their own (``tests/k8s/k8s_tier.py``), so a tier
run at the same time is not disturbed. They are filled with ``--nodes`` Nodes as a kubelet and the
device plugin leave them: the chart's node labels, ``iluvatar.com/gpu: 8`` allocatable, conditions,
addresses, node info and 50 images in the status (a kubelet's default ``nodeStatusMaxImages``),
written by two field managers (so each carries managedFields); and one ResourceSlice per node as
``ix-gpu dra`` publishes it (8 chips, the driver's own attributes), owned by its Node. The command
is then run as an operator would, once in each mode, each a fresh process, at each size of
``--nodes`` (the cluster grows from one to the next): its peak RSS (``ru_maxrss``), wall time, and
a check that both gave the same view of every node.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ix_gpu.devicemodel.vendors import ILUVATAR  # noqa: E402
from ix_gpu.dra.devices import dra_devices, slice_devices  # noqa: E402
from ix_gpu.dra.slices import slice_name  # noqa: E402
from ix_gpu.node.backends.base import Chip  # noqa: E402
from tests.k8s.k8s_tier import K8sBinaries, KubeAPI, build_oldest_apiserver, start_etcd, start_kube_apiserver  # noqa: E402

RESOURCE, DRIVER = "iluvatar.com/gpu", "gpu.iluvatar.com"

RUN = """
import sys
if sys.argv[1] == "whole":
    import ix_gpu.status.read as read
    read.slim_node = lambda resource: (lambda obj: obj)
    read.slim_slice = lambda driver: (lambda obj: obj)
    read.slim_claim = lambda obj: obj
from ix_gpu.cli import main
sys.exit(main(sys.argv[2:]))
"""
"""The command in a fresh interpreter: ``slim`` as shipped, ``whole`` with nothing cut down."""


def node_body(i: int) -> dict[str, Any]:
    name = f"gpu-{i:05d}"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "gpu.8x",
                "topology.kubernetes.io/zone": f"zone-{i % 3}",
                "ix-gpu.io/gpu.product": "BI-V150",
                "ix-gpu.io/gpu.vendor": "iluvatar",
                "ix-gpu.io/gpu.count": "8",
                "ix-gpu.io/gpu.memory": "32768",
                "ix-gpu.io/gpu.replicas": "1",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {"podCIDR": f"10.{i // 250}.{i % 250}.0/24", "providerID": f"bench://{name}"},
    }


def node_status(i: int) -> dict[str, Any]:
    resources = {"cpu": "96", "memory": "1056Gi", "pods": "110", "ephemeral-storage": "3500Gi", RESOURCE: "8"}
    heartbeat = "2026-01-01T00:00:00Z"
    conditions = [
        {
            "type": kind,
            "status": status,
            "reason": f"Kubelet{kind}",
            "message": f"kubelet reports {kind} {status}",
            "lastHeartbeatTime": heartbeat,
            "lastTransitionTime": heartbeat,
        }
        for kind, status in (
            ("MemoryPressure", "False"),
            ("DiskPressure", "False"),
            ("PIDPressure", "False"),
            ("Ready", "True"),
        )
    ]
    images = [
        {
            "names": [
                f"registry.example.com/team-{j % 7}/model-server-{j}@sha256:{(str(i * 50 + j) * 64)[:64]}",
                f"registry.example.com/team-{j % 7}/model-server-{j}:v1.{j}.0",
            ],
            "sizeBytes": 1_000_000_000 + j,
        }
        for j in range(50)
    ]
    return {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": f"10.255.{i // 250}.{i % 250}"},
                {"type": "Hostname", "address": f"gpu-{i:05d}"},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": f"{i:032x}",
                "systemUUID": f"{i:032x}",
                "bootID": f"{i:032x}",
                "kernelVersion": "6.1.0-bench",
                "osImage": "Debian GNU/Linux 13",
                "containerRuntimeVersion": "containerd://1.7.24",
                "kubeletVersion": "v1.35.4",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": images,
        }
    }


def slice_body(node: str, uid: str) -> dict[str, Any]:
    chips = [
        Chip(f"GPU-{node}-{k}", k, k, f"{node}-b{k // 2}", k % 2, "Iluvatar BI-V150", 32768, 0)
        for k in range(8)
    ]
    devices = slice_devices(dra_devices(chips, splitboard=False, partitionable=False), ILUVATAR, DRIVER)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(node, DRIVER),
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid, "controller": True}
            ],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def call(api: KubeAPI, method: str, path: str, body: object, content_type: str = "application/json") -> Any:
    for _ in range(5):
        status, reply = api.request(method, path, body, content_type=content_type)
        if status in (200, 201):
            return reply
        time.sleep(0.5)
    raise RuntimeError(f"{method} {path}: {status} {str(reply)[:300]}")


def fill(api: KubeAPI, first: int, end: int, workers: int) -> float:
    """Nodes ``first`` to ``end`` (excluded) with their status and ResourceSlice; the seconds it took."""

    def one(i: int) -> None:
        created = call(api, "POST", "/api/v1/nodes?fieldManager=bench-node", node_body(i))
        name, uid = created["metadata"]["name"], created["metadata"]["uid"]
        merge = "application/merge-patch+json"
        call(api, "PATCH", f"/api/v1/nodes/{name}/status?fieldManager=kubelet", node_status(i), merge)
        call(
            api,
            "POST",
            "/apis/resource.k8s.io/v1/resourceslices?fieldManager=ix-gpu-dra",
            slice_body(name, uid),
        )

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(first, end)))
    return time.monotonic() - started


def run_status(mode: str, kubeconfig: Path, out: Path) -> dict[str, Any]:
    """``ix-gpu status -o json`` in a fresh interpreter: peak RSS, wall time, and its view."""
    argv = [
        sys.executable,
        "-c",
        RUN,
        mode,
        "status",
        "-o",
        "json",
        "--kubeconfig",
        str(kubeconfig),
        "--timeout",
        "300",
    ]
    started = time.monotonic()
    with out.open("wb") as stdout:
        child = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE, cwd=REPO)
        _, status, usage = os.wait4(child.pid, 0)
    took = time.monotonic() - started
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"ix-gpu status ({mode}) exited {code}: {child.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
    view = json.loads(out.read_text())
    return {"peak_mib": round(usage.ru_maxrss / 1024, 1), "wall_s": round(took, 2), "view": view}


def baseline_mib() -> float:
    """The interpreter with the command's modules loaded, nothing read: what is not the data."""
    code = (
        "import resource, ix_gpu.cli, ix_gpu.status.read, ix_gpu.status.view, ix_gpu.kube.apiserver, "
        "kubernetes.config; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    return round(int(found.stdout) / 1024, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1000,5000", help="the sizes measured, comma-separated")
    parser.add_argument("--workers", type=int, default=8, help="parallel writes while filling")
    parser.add_argument("--k8s-bin", help="a bin directory with kube-apiserver (default: build.sh's cache)")
    parser.add_argument("--etcd-bin", help="a directory with etcd (default: build-go-command.sh's cache)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.etcd_bin:
        os.environ["IX_GPU_ETCD_BIN"] = args.etcd_bin
    binaries = K8sBinaries(Path(args.k8s_bin)) if args.k8s_bin else build_oldest_apiserver()
    work = Path(tempfile.mkdtemp(prefix="ix-status-memory-"))
    logs = work / "logs"
    logs.mkdir()
    etcd = start_etcd(binaries, logs)
    sizes = sorted(int(n) for n in args.nodes.split(","))
    results: list[dict[str, Any]] = []
    try:
        api = start_kube_apiserver(binaries, etcd, work / "apiserver", logs)
        try:
            baseline = baseline_mib()
            for first, end in zip([0, *sizes], sizes, strict=False):
                results.append(measure(api, first, end, args.workers, work) | {"baseline_mib": baseline})
        finally:
            api.stop()
    finally:
        etcd.stop()
    if args.json:
        print(json.dumps(results))
    for result in results:
        print(", ".join(f"{k}: {v}" for k, v in result.items()))
    return 0 if all(r["same_view"] and r["gpu_nodes"] == r["nodes"] for r in results) else 1


def measure(api: KubeAPI, first: int, end: int, workers: int, work: Path) -> dict[str, Any]:
    """Grow the cluster to ``end`` nodes, then run the command in each mode."""
    result: dict[str, Any] = {"nodes": end, "fill_s": round(fill(api, first, end, workers), 1)}
    runs = {mode: run_status(mode, api.kubeconfig, work / f"{mode}.json") for mode in ("whole", "slim")}
    views = {mode: run.pop("view") for mode, run in runs.items()}
    for mode, run in runs.items():
        result[f"{mode}_peak_mib"], result[f"{mode}_wall_s"] = run["peak_mib"], run["wall_s"]
    result["same_view"] = views["slim"] == views["whole"]
    result["gpu_nodes"], result["gpus"] = len(views["slim"]["nodes"]), views["slim"]["totals"]["total"]
    return result


if __name__ == "__main__":
    sys.exit(main())
