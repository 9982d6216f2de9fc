"""The webhook's namespace and claim caches at cluster scale: memory and time to ready after a restart.

    .venv/bin/python bench/namespace_scale.py [--namespaces 50000] [--claims 20000]
        [--annotation-bytes 2000] [--json]

A real etcd and kube-apiserver (the tier's oldest supported, ``tests/k8s/build.sh``; or
``--k8s-bin DIR``), filled with ``--namespaces`` Namespaces, each with the pod-security labels and
an annotation of ``--annotation-bytes`` (what ``kubectl apply``'s last-applied-configuration
costs), created by one field manager so each carries managedFields, and ``--claims`` ResourceClaims spread
over them, each with the same annotation, a CEL selector and an allocation written to its status
(a second field manager), as a cluster's allocated claims carry. Then the real ``ix-gpu webhook
--kubeconfig`` is started twice (a restart) and, each time, measured once ``/readyz`` says the
namespace cache is synced and its details say both claim caches are: seconds from start to that
point, RSS then (``VmRSS``) and the peak (``VmHWM``). Every 20th namespace is opted out by
annotation, and ``--checks`` reviews of GPU pods in random namespaces, and as many of DRA pods
naming random claims, are compared with what the namespace and the claim say (wrong answers: 0).

The chart's request is 128 MiB and its limit 256 MiB; the targets at 50,000 namespaces and 20,000
claims are RSS <= 128 MiB and ready <= 10 s after a restart.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.k8s.k8s_tier import K8sBinaries, build_oldest_apiserver, start_etcd, start_kube_apiserver  # noqa: E402
from tests.support.objects import container, pod, pod_claim, resource_claim, review  # noqa: E402
from tests.support.webhook_process import WebhookProcess, generate_certs  # noqa: E402


def rss_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def create_namespaces(api: object, count: int, annotation_bytes: int, workers: int = 16) -> float:
    """Create ``count`` namespaces; returns the seconds it took."""
    filler = "x" * annotation_bytes

    def one(i: int) -> None:
        annotations = {"kubectl.kubernetes.io/last-applied-configuration": filler}
        if i % 20 == 0:
            annotations["ix-gpu.io/inject"] = "disabled"
        body = {
            "metadata": {
                "name": f"ns-{i:06d}",
                "labels": {
                    "pod-security.kubernetes.io/enforce": ("privileged", "baseline", "restricted")[i % 3]
                },
                "annotations": annotations,
            }
        }
        for _ in range(5):
            status, reply = api.request("POST", "/api/v1/namespaces?fieldManager=bench", body)  # type: ignore[attr-defined]
            if status in (201, 409):
                return
            time.sleep(0.5)
        raise RuntimeError(f"namespace {i}: {status} {str(reply)[:200]}")

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(count)))
    return time.monotonic() - started


def claim_body(j: int, annotation_bytes: int) -> dict[str, object]:
    claim = resource_claim(f"claim-{j:06d}")
    claim["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": "x" * annotation_bytes
    }
    request = claim["spec"]["devices"]["requests"][0]  # type: ignore[index]
    request["exactly"]["selectors"] = [  # type: ignore[index]
        {"cel": {"expression": 'device.attributes["gpu.iluvatar.com"].productName == "BI-V150"'}}
    ]
    return claim


def allocation(j: int) -> dict[str, object]:
    node = f"node-{j % 1000:04d}"
    result = {"request": "gpu", "driver": "gpu.iluvatar.com", "pool": node, "device": f"gpu-{j % 8}"}
    selector = {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    }
    return {"status": {"allocation": {"devices": {"results": [result]}, "nodeSelector": selector}}}


def create_claims(
    api: object, count: int, namespaces: int, annotation_bytes: int, workers: int = 16
) -> float:
    """Create ``count`` allocated ResourceClaims, claim j in namespace j % ``namespaces``."""

    def call(method: str, path: str, body: object, content_type: str | None = None) -> None:
        for _ in range(5):
            extra = {} if content_type is None else {"content_type": content_type}
            status, reply = api.request(method, path, body, **extra)  # type: ignore[attr-defined]
            if status in (200, 201, 409):
                return
            time.sleep(0.5)
        raise RuntimeError(f"{method} {path}: {status} {str(reply)[:300]}")

    def one(j: int) -> None:
        base = f"/apis/resource.k8s.io/v1/namespaces/ns-{j % namespaces:06d}/resourceclaims"
        call("POST", f"{base}?fieldManager=bench", claim_body(j, annotation_bytes))
        status_path = f"{base}/claim-{j:06d}/status?fieldManager=scheduler"
        call("PATCH", status_path, allocation(j), "application/merge-patch+json")

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(count)))
    return time.monotonic() - started


def claims_synced(webhook: WebhookProcess) -> bool:
    with webhook.client() as client:
        details = client.get("/readyz").json().get("claims", {})
    return all(details.get(kind, {}).get("synced") for kind in ("ResourceClaim", "ResourceClaimTemplate"))


def measure(webhook: WebhookProcess) -> dict[str, float]:
    started = time.monotonic()
    webhook.start(timeout=300, ready=True)
    while not claims_synced(webhook):
        if time.monotonic() - started > 300:
            raise RuntimeError("the claim caches did not sync in 300 s")
        time.sleep(0.05)
    ready = time.monotonic() - started
    assert webhook.process is not None
    pid = webhook.process.pid
    return {
        "ready_s": round(ready, 2),
        "rss_mib": round(rss_mib(pid, "VmRSS"), 1),
        "peak_mib": round(rss_mib(pid, "VmHWM"), 1),
    }


def wrong_answers(webhook: WebhookProcess, namespaces: int, claims: int, checks: int) -> int:
    """Reviews answered against what the namespace (every 20th opted out) and the claim say: a GPU
    pod in a random namespace, and a DRA pod naming a random claim in that claim's namespace."""
    wrong = 0
    dra_container = container("main", claims=["gpu"])
    with webhook.client() as client:
        for check in range(checks * (2 if claims else 1)):
            if check % 2 == 0 or not claims:
                i = random.randrange(namespaces)
                obj = pod("gpu")
            else:
                j = random.randrange(claims)
                i = j % namespaces
                obj = pod("dra", [dra_container], resource_claims=[pod_claim("gpu", claim=f"claim-{j:06d}")])
            answer = client.post("/mutate", json=review(obj, namespace=f"ns-{i:06d}")).json()["response"]
            mutated = bool(answer.get("patch"))
            unknown = any("not known to the webhook" in w for w in answer.get("warnings") or ())
            wrong += mutated == (i % 20 == 0) or unknown  # every 20th is opted out
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespaces", type=int, default=50_000)
    parser.add_argument("--claims", type=int, default=20_000)
    parser.add_argument("--annotation-bytes", type=int, default=2000)
    parser.add_argument("--checks", type=int, default=2000)
    parser.add_argument("--k8s-bin", help="a bin directory with kube-apiserver (default: build.sh's cache)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    binaries = K8sBinaries(Path(args.k8s_bin)) if args.k8s_bin else build_oldest_apiserver()
    work = Path(tempfile.mkdtemp(prefix="ix-ns-scale-"))
    logs = work / "logs"
    logs.mkdir()
    etcd = start_etcd(binaries, logs)
    api = start_kube_apiserver(binaries, etcd, work / "apiserver", logs)
    result: dict[str, object] = {
        "namespaces": args.namespaces,
        "claims": args.claims,
        "annotation_bytes": args.annotation_bytes,
    }
    try:
        result["create_s"] = round(create_namespaces(api, args.namespaces, args.annotation_bytes), 1)
        result["create_claims_s"] = round(
            create_claims(api, args.claims, args.namespaces, args.annotation_bytes), 1
        )
        certs = generate_certs(work / "certs")
        runs = []
        for name in ("start", "restart"):
            webhook = WebhookProcess(work, certs, name=f"webhook-{name}", kubeconfig=api.kubeconfig)
            try:
                runs.append(measure(webhook))
                if name == "restart":
                    result["wrong_answers"] = wrong_answers(
                        webhook, args.namespaces, args.claims, args.checks
                    )
            finally:
                webhook.stop()
        result["start"], result["restart"] = runs
    finally:
        api.stop()
        etcd.stop()
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
