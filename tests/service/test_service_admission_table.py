"""AdmissionReviews in, AdmissionReviews out, over real HTTPS against ``ix-gpu webhook``.

Namespace opt-outs need namespace facts, so the table runs against the server whose kubeconfig
points at the namespace stand-in (team-a plain; optout-ann / optout-label opted out by annotation /
label; restricted enforcing Pod Security "restricted"). Every returned patch is applied with
jsonpatch and the result validated against the Kubernetes schema (TFJob templates as PodTemplates).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.support.k8s_schema import validate, validate_pod_template
from tests.support.objects import apply_response, container, gpu_tfjob, pod, review
from tests.support.webhook_process import WebhookProcess

INJECTED = "ix-gpu.io/injected"


@dataclass(frozen=True)
class Case:
    id: str
    obj: dict[str, Any] | None
    namespace: str = "team-a"
    operation: str = "CREATE"
    dry_run: bool = False
    old: dict[str, Any] | None = None
    allowed: bool = True
    patched: bool = False
    decision: str = "skipped"
    reason_has: str = ""
    warning_has: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


OPTED_OUT_POD = pod(annotations={"ix-gpu.io/inject": "disabled"})

CASES = [
    Case("pod-gpu", pod(), patched=True, decision="mutated", reason_has="injected iluvatar@"),
    Case("pod-gpu-dry-run", pod(), dry_run=True, patched=True, decision="mutated", reason_has="injected"),
    Case(
        "pod-nvidia-gpu",
        pod(containers=[container("cuda", "2", "nvidia.com/gpu")]),
        patched=True,
        decision="mutated",
    ),
    Case("pod-no-gpu", pod(containers=[container("web")]), reason_has="no container requests"),
    Case("pod-zero-gpu", pod(containers=[container("web", 0)]), reason_has="no container requests"),
    Case(
        "pod-ns-annotation-opt-out",
        pod(namespace="optout-ann"),
        namespace="optout-ann",
        reason_has="opted out",
    ),
    Case(
        "pod-ns-label-opt-out",
        pod(namespace="optout-label"),
        namespace="optout-label",
        reason_has="opted out",
    ),
    Case("pod-annotation-opt-out", OPTED_OUT_POD, reason_has="object opted out"),
    Case(
        "pod-excluded-namespace", pod(namespace="kube-system"), namespace="kube-system", reason_has="excluded"
    ),
    Case(
        "pod-psa-restricted",
        pod(namespace="restricted"),
        namespace="restricted",
        patched=True,
        decision="mutated",
        warning_has="hostPath",
    ),
    Case(
        "pod-invalid-quantity",
        pod(containers=[container("main", "1.5")]),
        allowed=False,
        decision="denied",
        reason_has='container "main"',
    ),
    Case("pod-not-a-number", pod(containers=[container("main", "lots")]), allowed=False, decision="denied"),
    Case("pod-update", pod(), operation="UPDATE", old=pod(), reason_has="operation UPDATE"),
    Case("pod-delete", None, operation="DELETE", old=pod(), reason_has="operation DELETE"),
    Case("tfjob-gpu", gpu_tfjob(), patched=True, decision="mutated", reason_has="injected nvidia@"),
    Case("tfjob-gpu-dry-run", gpu_tfjob(), dry_run=True, patched=True, decision="mutated"),
    Case("tfjob-no-gpu", gpu_tfjob(gpus=None), reason_has="no container requests"),
    Case(
        "tfjob-ns-annotation-opt-out",
        gpu_tfjob(namespace="optout-ann"),
        namespace="optout-ann",
        reason_has="opted out",
    ),
    Case(
        "tfjob-ns-label-opt-out",
        gpu_tfjob(namespace="optout-label"),
        namespace="optout-label",
        reason_has="opted out",
    ),
    Case(
        "tfjob-excluded-namespace",
        gpu_tfjob(namespace="kube-public"),
        namespace="kube-public",
        reason_has="excluded",
    ),
    Case(
        "tfjob-invalid-quantity",
        gpu_tfjob(gpus="-1"),
        allowed=False,
        decision="denied",
        reason_has="tensorflow",
    ),
    Case(
        "configmap-not-a-workload",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}},
        reason_has="not a configured workload",
    ),
]


def _post(client: httpx.Client, body: dict[str, Any]) -> httpx.Response:
    return client.post("/mutate", content=json.dumps(body), headers={"content-type": "application/json"})


def _check_schema(obj: dict[str, Any]) -> None:
    if obj["kind"] == "Pod":
        validate(obj)
    elif obj["kind"] == "TFJob":
        for spec in obj["spec"]["tfReplicaSpecs"].values():
            validate_pod_template(spec["template"])


def _injected_annotations(obj: dict[str, Any]) -> list[dict[str, str]]:
    if obj["kind"] == "Pod":
        return [obj["metadata"]["annotations"]]
    return [spec["template"]["metadata"]["annotations"] for spec in obj["spec"]["tfReplicaSpecs"].values()]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_admission_review_table(case: Case, cluster_client: httpx.Client) -> None:
    request = review(
        case.obj, namespace=case.namespace, operation=case.operation, dry_run=case.dry_run, old=case.old
    )
    answer = _post(cluster_client, request)

    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["kind"] == "AdmissionReview"
    response = body["response"]
    assert response["uid"] == request["request"]["uid"]
    assert response["allowed"] is case.allowed
    assert response["auditAnnotations"]["decision"] == case.decision
    assert case.reason_has in response["auditAnnotations"].get("reason", "")
    if case.warning_has:
        assert any(case.warning_has in w for w in response.get("warnings", [])), response
    if case.patched:
        assert response["patchType"] == "JSONPatch"
        assert case.obj is not None
        mutated = apply_response(case.obj, response)
        _check_schema(mutated)
        assert all(a[INJECTED].startswith(("iluvatar@", "nvidia@")) for a in _injected_annotations(mutated))
    else:
        assert "patch" not in response and "patchType" not in response
    if case.allowed:
        assert "status" not in response
    else:
        assert response["status"]["code"] == 403
        assert case.reason_has in response["status"]["message"]


def test_reinvocation_yields_no_patch(cluster_client: httpx.Client) -> None:
    """``reinvocationPolicy: IfNeeded`` sends the mutated object again: nothing more to add."""
    first = _post(cluster_client, review(pod())).json()["response"]
    mutated = apply_response(pod(), first)
    second = _post(cluster_client, review(mutated)).json()["response"]
    assert second["allowed"] is True
    assert "patch" not in second
    assert second["auditAnnotations"]["decision"] == "unchanged"


def test_dry_run_answers_exactly_like_the_real_request(cluster_client: httpx.Client) -> None:
    real = _post(cluster_client, review(pod(), uid="same")).json()
    dry = _post(cluster_client, review(pod(), uid="same", dry_run=True)).json()
    assert dry == real


def test_patch_is_base64_of_a_json_array(cluster_client: httpx.Client) -> None:
    response = _post(cluster_client, review(pod())).json()["response"]
    ops = json.loads(base64.b64decode(response["patch"], validate=True))
    assert all({"op", "path"} <= set(op) for op in ops)


def test_local_mode_has_no_namespace_facts(local_client: httpx.Client, local_webhook: WebhookProcess) -> None:
    """Without a kubeconfig the service says so at startup and cannot see namespace opt-outs."""
    warnings = [e["msg"] for e in local_webhook.logs() if e.get("level") == "warning"]
    assert any("namespace facts are unknown" in w for w in warnings), warnings
    response = _post(local_client, review(pod(namespace="optout-ann"), namespace="optout-ann")).json()[
        "response"
    ]
    assert response["auditAnnotations"]["decision"] == "mutated"
    ready = local_client.get("/readyz").json()
    assert ready["ready"] is True and ready["namespaces"]["mode"] == "unknown"


def test_admission_is_logged_as_one_json_line(
    cluster_client: httpx.Client, cluster_webhook: WebhookProcess
) -> None:
    request = review(pod(name="logged"), uid="uid-logged-1")
    _post(cluster_client, request)
    entries = [e for e in cluster_webhook.logs() if e.get("uid") == "uid-logged-1"]
    assert len(entries) == 1
    entry = entries[0]
    assert entry["msg"] == "admission"
    assert {k: entry[k] for k in ("kind", "namespace", "name", "result", "ops")} == {
        "kind": "Pod",
        "namespace": "team-a",
        "name": "logged",
        "result": "mutated",
        "ops": 5,
    }
    assert entry["durationMs"] > 0


def test_metrics_count_results_by_kind(cluster_client: httpx.Client, cluster_webhook: WebhookProcess) -> None:
    before = cluster_webhook.metric(
        "ix_gpu_admission_requests_total", cluster_client, kind="TFJob", operation="CREATE", result="denied"
    )
    _post(cluster_client, review(gpu_tfjob(gpus="x")))
    after = cluster_webhook.metric(
        "ix_gpu_admission_requests_total", cluster_client, kind="TFJob", operation="CREATE", result="denied"
    )
    assert after == before + 1
    samples = cluster_webhook.metrics(cluster_client)
    assert samples[("ix_gpu_admission_duration_seconds_count", ())] > 0
    assert ("ix_gpu_namespace_cache_size", ()) in samples
    assert samples[("ix_gpu_admission_internal_errors_total", ())] == 0


def test_health_and_readiness(cluster_client: httpx.Client) -> None:
    assert cluster_client.get("/healthz").json() == {"status": "ok"}
    ready = cluster_client.get("/readyz")
    assert ready.status_code == 200
    details = ready.json()
    assert details["namespaces"]["synced"] is True
    assert details["namespaces"]["size"] >= 4
    assert details["config"]["lastError"] is None and details["certs"]["lastError"] is None
