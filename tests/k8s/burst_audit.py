"""What a burst left behind: every created pod read back and checked against its namespace's
opt-out, and how the first tries of the pods in namespaces created during it were refused."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ix_gpu.devicemodel import labels
from tests.k8s.burst_fresh import PREFIX as FRESH
from tests.k8s.burst_fresh import FreshNamespaces
from tests.k8s.k8s_tier import KubeAPI

if TYPE_CHECKING:
    from tests.k8s.burst import Burst

OPT_OUT_EVERY = 20
"""Every 20th namespace opts out by annotation."""


REFUSALS = (
    ("namespace lookup denied", "policy.namespacelookupfailure"),
    ("claim lookup denied", "policy.claimlookupfailure"),
    ("webhook not reached", "failed calling webhook"),
    ("no ServiceAccount yet", "error looking up service account"),
)
"""How a first create's error is counted: the first of these whose text it contains (in lower
case); an error without an HTTP status is "no apiserver"; else "other"."""


def refusal_kind(error: str) -> str:
    if error.startswith("0 "):
        return "no apiserver"
    lowered = error.lower()
    return next((kind for kind, text in REFUSALS if text in lowered), "other")


def fresh_figures(fresh: FreshNamespaces, burst: Burst) -> dict[str, Any]:
    """What became of the namespaces created during the burst and of their pods."""
    keys = [k for k in burst.created if k.startswith(f"{FRESH}-")]
    refused = {k: e for k, e in burst.refused_first.items() if k.startswith(f"{FRESH}-")}
    kinds: dict[str, int] = {}
    for error in refused.values():
        kinds[refusal_kind(error)] = kinds.get(refusal_kind(error), 0) + 1
    return {
        "new_namespaces_created": len(fresh.created_at),
        "new_namespaces_failed": len(fresh.failed),
        "new_namespace_failure_examples": fresh.failed[:3],
        "new_namespace_pods_created": len(keys),
        "new_namespace_claim_pods_created": len(fresh.claim_pods & set(keys)),
        "new_namespace_pods_refused_first_try": len(refused),
        "new_namespace_refusals_by_kind": kinds,
        "new_namespace_refusal_examples": sorted(set(refused.values()))[:4],
    }


def audit(api: KubeAPI, created: set[str], claim_pods: set[str]) -> dict[str, Any]:
    """Every created pod read back: GPU pods stored without the webhook's mark in namespaces that
    did not opt out (must be 0), and pods with it in namespaces that did (must be 0), both also
    for the namespaces created during the burst alone and for the pods that ask through a claim;
    and how many are bound and in which phase, as stored (beside what the watch saw)."""
    unmutated, opted_out_mutated, opted_out = [], [], 0
    bound, phases = 0, dict[str, int]()
    token = ""
    while True:
        status, listed = api.request(
            "GET", "/api/v1/pods?limit=500" + (f"&continue={token}" if token else "")
        )
        if status != 200:
            raise RuntimeError(f"listing pods: {status}")
        for pod in listed["items"]:
            meta = pod["metadata"]
            key = f"{meta['namespace']}/{meta['name']}"
            if key not in created:
                continue
            bound += bool(pod["spec"].get("nodeName"))
            phase = pod.get("status", {}).get("phase", "")
            phases[phase] = phases.get(phase, 0) + 1
            injected = labels.INJECTED in (meta.get("annotations") or {})
            index = int(meta["namespace"].rsplit("-", 1)[1])
            if index % OPT_OUT_EVERY == 0:
                opted_out += 1
                if injected:
                    opted_out_mutated.append(key)
            elif not injected:
                unmutated.append(key)
        token = listed["metadata"].get("continue") or ""
        if not token:
            break
    fresh = [k for k in unmutated if k.startswith(f"{FRESH}-")]
    return {
        "gpu_pods_unmutated": len(unmutated),
        "gpu_pods_unmutated_old_namespaces": len(unmutated) - len(fresh),
        "gpu_pods_unmutated_new_namespaces": len(fresh),
        "claim_pods_unmutated": len(set(unmutated) & claim_pods),
        "opted_out_pods_new_namespaces": len(
            [
                k
                for k in created
                if k.startswith(f"{FRESH}-") and int(k.split("/")[0].rsplit("-", 1)[1]) % OPT_OUT_EVERY == 0
            ]
        ),
        "unmutated_examples": unmutated[:3],
        "opted_out_pods": opted_out,
        "opted_out_pods_mutated": len(opted_out_mutated),
        "stored_bound": bound,
        "stored_phases": phases,
    }
