"""What a ResourceClaim allocated to this driver on this node, read from the API server.

The kubelet's NodePrepareResources carries only references (namespace, name, uid): the plugin
reads ``status.allocation.devices.results`` itself. The uid is compared, because a claim deleted
and created again under the same name is another claim, whose allocation the kubelet did not ask
about. Results for other drivers are someone else's; a result of ours from another pool is an
error, since this node's plugin can only prepare devices of this node's pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ix_gpu.runtime.kube import ApiServer

RESOURCE_API = "/apis/resource.k8s.io/v1"


class ClaimError(Exception):
    """The claim cannot be prepared; the message is what the kubelet shows in the pod's events."""


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True)
class Allocated:
    """One allocation result of ours: ``request`` may be ``<request>/<subrequest>``."""

    request: str
    device: str
    share_id: str | None = None


def claim_path(ref: ClaimRef) -> str:
    namespace, name = quote(ref.namespace, safe=""), quote(ref.name, safe="")
    return f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}"


def read_claim(api: ApiServer, ref: ClaimRef) -> dict[str, Any]:
    """GET the claim; ``OSError`` when the API server cannot be asked."""
    claim = api.request("GET", claim_path(ref))
    if not isinstance(claim, dict):
        raise ClaimError(f"claim {ref}: the API server answered no object")
    return claim


def allocated(claim: dict[str, Any], ref: ClaimRef, driver: str, pool: str) -> list[Allocated]:
    """The results of ``claim`` that this driver prepares on this node, in the claim's order."""
    uid = (claim.get("metadata") or {}).get("uid")
    if uid != ref.uid:
        raise ClaimError(f"claim {ref}: the API server has uid {uid!r}, the kubelet asked for another claim")
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, dict):
        raise ClaimError(f"claim {ref} is not allocated")
    results = (allocation.get("devices") or {}).get("results") or []
    found = []
    for result in results:
        if not isinstance(result, dict) or result.get("driver") != driver:
            continue
        device, result_pool = str(result.get("device", "")), str(result.get("pool", ""))
        if result_pool != pool:
            raise ClaimError(
                f"claim {ref}: device {device} is in pool {result_pool!r}, not this node's {pool!r}"
            )
        share = result.get("shareID")
        found.append(Allocated(str(result.get("request", "")), device, str(share) if share else None))
    return found
