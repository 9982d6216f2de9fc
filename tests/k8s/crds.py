"""The TFJob CustomResourceDefinitions the webhook suites install: kubeflow.org/v1 (tfjob-crd.yaml,
a trimmed copy of the training operator's schema shape) and the seed's legacy ``mlkube.io/v1beta1``
TfJob (no schema of its own, as in 2017), and a helper that waits until one is served."""

from __future__ import annotations

from typing import Any

import yaml

from tests.k8s.k8s_tier import HERE, KubeAPI
from tests.support.waiting import wait_until

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"

LEGACY_TFJOB_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "tfjobs.mlkube.io"},
    "spec": {
        "group": "mlkube.io",
        "scope": "Namespaced",
        "names": {"plural": "tfjobs", "singular": "tfjob", "kind": "TfJob", "listKind": "TfJobList"},
        "versions": [
            {
                "name": "v1beta1",
                "served": True,
                "storage": True,
                # No schema of its own: the CEL conditions must cope with any shape.
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


def kubeflow_tfjob_crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load((HERE / "tfjob-crd.yaml").read_text())
    return crd


def install_crd(api: KubeAPI, crd: dict[str, Any]) -> str:
    """Create ``crd`` (an existing one is fine) and wait until it is Established and its group
    version is served; returns the group version's path, e.g. ``/apis/mlkube.io/v1beta1``."""
    status, body = api.request("POST", CRDS, crd)
    assert status in (201, 409), body
    name = crd["metadata"]["name"]
    version = next(v["name"] for v in crd["spec"]["versions"] if v.get("storage"))
    group_version = f"/apis/{crd['spec']['group']}/{version}"

    def established() -> bool:
        status, current = api.request("GET", f"{CRDS}/{name}")
        conditions = ((current.get("status") or {}).get("conditions") or []) if status == 200 else []
        ok = any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
        return ok and api.request("GET", group_version)[0] == 200

    wait_until(established, f"the CRD {name} established", 60, interval=0.2)
    return group_version
