"""Install the chart onto the real kube-apiserver of the test tier (IX_GPU_K8S=1).

How: the chart is rendered with Helm's SDK and every object is applied with **server-side apply**
(``PATCH application/apply-patch+yaml``, one field manager, as ``helm`` 4 and GitOps tools do).
The webhook Service is ``ExternalName: localhost``, and the real ``ix-gpu webhook`` process runs
here with the chart's own container args, its ConfigMap content and a token of the chart's
ServiceAccount — so the ``self`` certificate mode creates its Secret and patches the caBundle with
exactly the chart's RBAC. A second install expresses the seed's config in the ``config`` value: a
custom resource listed in its workloads reaches the webhook through the webhook registration the
chart derives from them, and the objectSelector keeps opted-out pods away from it.

The node agents' ValidatingAdmissionPolicies are enforced here too, the cheapest real apiserver
there is: what a token of the device plugin or of the DRA plugin, bound to a pod on one node as
the kubelet projects it, may write of Nodes and ResourceSlices.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import secrets
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ix_gpu.devicemodel import labels as node_labels
from ix_gpu.kube import apiserver
from ix_gpu.node.node_labels import NodeLabeler
from tests.chart.rendering import find, render
from tests.k8s.crds import LEGACY_TFJOB_CRD, install_crd
from tests.k8s.k8s_tier import (
    KubeAPI,
    build_oldest_apiserver,
    start_etcd,
    start_kube_apiserver,
    write_kubeconfig,
)
from tests.support.cli import ix_gpu_process
from tests.support.net import free_port
from tests.support.objects import pod
from tests.support.paths import EXAMPLES, load_yaml
from tests.support.processes import Process
from tests.support.waiting import wait_until

GOLDEN = Path(__file__).resolve().parent.parent / "webhook" / "golden"

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.skipif(
        os.environ.get("IX_GPU_K8S", "").lower() not in ("1", "true", "yes"),
        reason="real-Kubernetes tier: set IX_GPU_K8S=1",
    ),
]

NS = "ix-gpu-system"
RELEASE = "ixg"
WEBHOOK = f"{RELEASE}-ix-gpu-webhook"
MWC = f"{RELEASE}-ix-gpu"
SECRET = f"{WEBHOOK}-tls"

_PATHS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts/{name}",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps/{name}",
    "Service": "/api/v1/namespaces/{ns}/services/{name}",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments/{name}",
    "DaemonSet": "/apis/apps/v1/namespaces/{ns}/daemonsets/{name}",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/{name}",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/{name}",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}",
    "MutatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}"
    ),
    "ValidatingAdmissionPolicy": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{name}",
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{name}"
    ),
}


def _call(
    api: KubeAPI,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
    token: str | None = None,
    agent: str | None = None,
) -> tuple[int, Any]:
    """``agent``: the User-Agent, which names the field manager of a write without a fieldManager."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    headers = {"Authorization": f"Bearer {token or api.token}", "Content-Type": content_type}
    if agent is not None:
        headers["User-Agent"] = agent
    request = urllib.request.Request(api.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, context=api.ssl_context(), timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            return err.code, json.loads(raw)
        except ValueError:
            return err.code, raw.decode(errors="replace")


def server_side_apply(api: KubeAPI, objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        path = _PATHS[obj["kind"]].format(
            ns=obj["metadata"].get("namespace", NS), name=obj["metadata"]["name"]
        )
        status, body = _call(
            api,
            "PATCH",
            f"{path}?fieldManager=helm&force=true",
            json.dumps(obj).encode(),
            "application/apply-patch+yaml",
        )
        assert status in (200, 201), f"apply {obj['kind']}/{obj['metadata']['name']}: {status} {body}"


@pytest.fixture(scope="module")
def kube_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeAPI]:
    logs = tmp_path_factory.mktemp("chart-k8s-logs")
    binaries = build_oldest_apiserver()  # the chart must install on the oldest supported minor
    etcd = start_etcd(binaries, logs)
    try:
        api = start_kube_apiserver(binaries, etcd, tmp_path_factory.mktemp("chart-apiserver"), logs)
        try:
            yield api
        finally:
            api.stop()
    finally:
        etcd.stop()


def _values(port: int, **extra: Any) -> dict[str, Any]:
    webhook = {
        "serviceType": "ExternalName",
        "serviceExternalName": "localhost",
        "servicePort": port,
        "port": port,
    }
    return {"webhook": {**webhook, **extra.pop("webhook", {})}, **extra}


def _sa_token(api: KubeAPI, name: str) -> str:
    status, body = _call(
        api,
        "POST",
        f"/api/v1/namespaces/{NS}/serviceaccounts/{name}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    assert status == 201, body
    return str(body["status"]["token"])


def _create_pod(api: KubeAPI, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
    status, body = _call(api, "POST", f"/api/v1/namespaces/{ns}/pods", obj)
    assert status == 201, body
    return dict(body)


def _pod_token(api: KubeAPI, service_account: str, node: str) -> str:
    """A token of ``service_account`` bound to a pod of it on ``node``, as the kubelet projects into
    that pod: from Kubernetes 1.32 it names the node, which the chart's policies compare."""
    name = f"{service_account}-on-{node}"
    pod = _create_pod(
        api,
        NS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "serviceAccountName": service_account,
                "nodeName": node,
                "containers": [{"name": "agent", "image": "ix-gpu"}],
            },
        },
    )
    bound = {"kind": "Pod", "apiVersion": "v1", "name": name, "uid": pod["metadata"]["uid"]}
    status, body = _call(
        api,
        "POST",
        f"/api/v1/namespaces/{NS}/serviceaccounts/{service_account}/token",
        {"spec": {"boundObjectRef": bound, "expirationSeconds": 600}},
    )
    assert status == 201, body
    return str(body["status"]["token"])


def _namespace(api: KubeAPI, labels: dict[str, str] | None = None) -> str:
    name = f"t-{secrets.token_hex(3)}"
    status, body = _call(
        api,
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}},
    )
    assert status == 201, body
    return name


def _ca_bundles(api: KubeAPI) -> set[str]:
    status, body = _call(api, "GET", _PATHS["MutatingWebhookConfiguration"].format(name=MWC))
    assert status == 200, body
    return {w["clientConfig"].get("caBundle", "") for w in body["webhooks"]}


def _ensure_namespace(api: KubeAPI, name: str) -> None:
    status, body = _call(
        api,
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )
    assert status in (201, 409), body


def _self_certs_published(api: KubeAPI, webhook: Process) -> bytes:
    """The CA the webhook put into its Secret, once every webhook's caBundle carries it."""
    secret = wait_until(
        lambda: (lambda r: r[1] if r[0] == 200 else None)(
            _call(api, "GET", f"/api/v1/namespaces/{NS}/secrets/{SECRET}")
        ),
        "the Secret",
        60,
        interval=0.3,
        process=webhook,
    )
    ca_bundle = base64.b64decode(secret["data"]["ca-bundle.crt"])
    wait_until(
        lambda: _ca_bundles(api) == {base64.b64encode(ca_bundle).decode()},
        "the caBundle of every webhook",
        60,
        interval=0.3,
        process=webhook,
    )
    return ca_bundle


def _start_webhook(api: KubeAPI, objects: list[dict[str, Any]], port: int, tmp_path: Path) -> Any:
    """The webhook process: the chart's args, its ConfigMap, its ServiceAccount's token."""
    deployment = find(objects, "Deployment", WEBHOOK)
    chart_args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    config = tmp_path / "config.yaml"
    config.write_text(find(objects, "ConfigMap", WEBHOOK)["data"]["config.yaml"])
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, api.ca_path, _sa_token(api, WEBHOOK))
    local = {
        "--config": str(config),
        "--cert-dir": str(tmp_path / "certs"),
        "--host": "127.0.0.1",
        "--port": str(port),
    }
    argv = [
        a if a.split("=", 1)[0] not in local else f"{a.split('=', 1)[0]}={local[a.split('=', 1)[0]]}"
        for a in chart_args
    ] + [f"--kubeconfig={kubeconfig}"]
    # The chart's args start with the subcommand (the image's ENTRYPOINT is ``ix-gpu``).
    return ix_gpu_process("webhook", *argv, log_dir=tmp_path)


def _trusting(ca_bundle: bytes) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca_bundle.decode())
    context.check_hostname = False
    return context


def _get(port: int, path: str, context: ssl.SSLContext) -> tuple[int, str]:
    with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=context, timeout=5) as r:
        return int(r.status), r.read().decode()


def _wait_ready(port: int, context: ssl.SSLContext, webhook: Any) -> None:
    def ready() -> bool:
        try:
            return _get(port, "/readyz", context)[0] == 200
        except OSError:
            return False

    wait_until(ready, "/readyz", 60, interval=0.3, process=webhook)


def _admissions(port: int, context: ssl.SSLContext) -> float:
    """How many admission reviews the webhook answered (its own counter)."""
    text = _get(port, "/metrics", context)[1]
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "ix_gpu_admission_requests_total"
    )


def test_install_mutates_gpu_pods_with_the_charts_rbac_and_upgrade_keeps_the_ca(
    kube_api: KubeAPI, tmp_path: Path
) -> None:
    api = kube_api
    _ensure_namespace(api, NS)
    port = free_port()
    objects = render(_values(port), release=RELEASE, namespace=NS)
    server_side_apply(api, objects)
    for kind, name in (
        ("DaemonSet", f"{RELEASE}-ix-gpu-plugin"),
        ("ConfigMap", "ix-config"),
        ("Service", f"{RELEASE}-ix-gpu-metrics"),
        ("ClusterRole", f"{RELEASE}-ix-gpu-plugin"),  # node labels are on by default
    ):
        assert _call(api, "GET", _PATHS[kind].format(ns=NS, name=name))[0] == 200

    webhook = _start_webhook(api, objects, port, tmp_path)
    try:
        ca_bundle = _self_certs_published(api, webhook)
        secret = _call(api, "GET", f"/api/v1/namespaces/{NS}/secrets/{SECRET}")[1]
        _wait_ready(port, _trusting(ca_bundle), webhook)

        ns = _namespace(api)
        gpu = _create_pod(api, ns, pod("gpu", limits={"iluvatar.com/gpu": "1"}))
        assert gpu["metadata"]["annotations"]["ix-gpu.io/injected"].startswith("iluvatar@")
        assert "/usr/local/corex" in {v.get("hostPath", {}).get("path") for v in gpu["spec"]["volumes"]}
        plain = _create_pod(api, ns, pod("plain", limits={"cpu": "1"}))
        assert "ix-gpu.io/injected" not in (plain["metadata"].get("annotations") or {})
        opted_out = _namespace(api, {"ix-gpu.io/inject": "disabled"})
        skipped = _create_pod(api, opted_out, pod("gpu", limits={"iluvatar.com/gpu": "1"}))
        assert "ix-gpu.io/injected" not in (skipped["metadata"].get("annotations") or {})

        # RBAC audit: what the webhook's own token may do, as the apiserver computes it.
        token = _sa_token(api, WEBHOOK)
        status, review = _call(
            api,
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectRulesReview",
                "spec": {"namespace": NS},
            },
            token=token,
        )
        assert status == 201, review
        granted = set()
        for rule in review["status"]["resourceRules"]:
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    for verb in rule["verbs"]:
                        granted.add((group, resource, verb, tuple(rule.get("resourceNames", []))))
        expected = {
            ("", "namespaces", "get", ()),
            ("", "namespaces", "list", ()),
            ("", "namespaces", "watch", ()),
            ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "get", (MWC,)),
            ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "patch", (MWC,)),
            ("", "secrets", "get", (SECRET,)),
            ("", "secrets", "update", (SECRET,)),
            ("", "secrets", "create", ()),
            # The claim caches: which DeviceClass a DRA pod's claims ask for (the default config maps
            # gpu.iluvatar.com to the Iluvatar profile).
            ("resource.k8s.io", "resourceclaims", "list", ()),
            ("resource.k8s.io", "resourceclaims", "watch", ()),
            ("resource.k8s.io", "resourceclaimtemplates", "list", ()),
            ("resource.k8s.io", "resourceclaimtemplates", "watch", ()),
        }
        # Backend and self-review rules every authenticated user has (system:basic-user etc.).
        baseline = {
            g
            for g in granted
            if g[1] in ("selfsubjectaccessreviews", "selfsubjectrulesreviews", "selfsubjectreviews")
        }
        assert granted - baseline == expected

        # Upgrade with changed values: the same CA stays in the caBundle and in the Secret.
        upgraded = render(
            _values(
                port,
                webhook={"timeoutSeconds": 7},
                plugin={"config": {"sharing": {"timeSlicing": {"replicas": 4}}}},
            ),
            release=RELEASE,
            namespace=NS,
        )
        server_side_apply(api, upgraded)
        assert _ca_bundles(api) == {base64.b64encode(ca_bundle).decode()}
        status, after = _call(api, "GET", f"/api/v1/namespaces/{NS}/secrets/{SECRET}")
        assert after["data"]["ca.crt"] == secret["data"]["ca.crt"]
        status, mwc = _call(api, "GET", _PATHS["MutatingWebhookConfiguration"].format(name=MWC))
        assert {w["timeoutSeconds"] for w in mwc["webhooks"]} == {7}
        again = _create_pod(api, _namespace(api), pod("gpu", limits={"nvidia.com/gpu": "1"}))
        assert again["metadata"]["annotations"]["ix-gpu.io/injected"].startswith("nvidia@")
    finally:
        webhook.stop(15)


def test_seed_config_as_the_config_value_reaches_a_configured_crd_and_skips_opted_out_pods(
    kube_api: KubeAPI, tmp_path: Path
) -> None:
    api = kube_api
    _ensure_namespace(api, NS)
    _ensure_namespace(api, "ml-team")  # the seed config's privileged namespace
    crd = install_crd(api, LEGACY_TFJOB_CRD)
    port = free_port()
    objects = render(
        _values(port, config=load_yaml(EXAMPLES / "seed-config.yaml")), release=RELEASE, namespace=NS
    )
    mwc = find(objects, "MutatingWebhookConfiguration", MWC)
    assert "tfjobs.v1beta1.mlkube.io.ix-gpu.io" in {w["name"] for w in mwc["webhooks"]}
    server_side_apply(api, objects)  # the apiserver compiles every derived CEL expression here
    webhook = _start_webhook(api, objects, port, tmp_path)
    try:
        ca_bundle = _self_certs_published(api, webhook)
        context = _trusting(ca_bundle)
        _wait_ready(port, context, webhook)

        # The seed's TfJob, a custom resource listed in config.workloads, comes back stored exactly
        # as `ix-gpu mutate` makes it with the seed config in ml-team (the CLI's golden file).
        job = load_yaml(EXAMPLES / "seed-tfjob.yaml")
        status, stored = _call(api, "POST", f"{crd}/namespaces/ml-team/tfjobs", job)
        assert status == 201, stored
        golden = yaml.safe_load((GOLDEN / "seed-tfjob.yaml").read_text())
        template = stored["spec"]["replica_specs"][0]["template"]
        # Same profile; the digest differs, as the chart adds its namespace to excludedNamespaces.
        for annotations in (
            template["metadata"]["annotations"],
            golden["spec"]["replica_specs"][0]["template"]["metadata"]["annotations"],
        ):
            profile, _, digest = annotations["ix-gpu.io/injected"].partition("@")
            assert (profile, len(digest)) == ("nvidia", 10)
            annotations["ix-gpu.io/injected"] = profile
        assert stored["spec"] == golden["spec"]
        assert template["spec"]["containers"][0]["securityContext"] == {"privileged": True}

        # A CPU-only TfJob is not sent at all (the derived matchCondition).
        before = _admissions(port, context)
        cpu = copy.deepcopy(job)
        cpu["metadata"]["name"] = "tf-cpu"
        cpu["spec"]["replica_specs"][0]["template"]["spec"]["containers"][0].pop("resources")
        status, stored_cpu = _call(api, "POST", f"{crd}/namespaces/ml-team/tfjobs", cpu)
        assert status == 201, stored_cpu
        assert stored_cpu["spec"] == cpu["spec"]

        # A GPU pod labelled ix-gpu.io/inject=disabled is not sent either (objectSelector)...
        ns = _namespace(api)
        gpu = {"nvidia.com/gpu": "1"}
        skipped = _create_pod(api, ns, pod("off", limits=gpu, labels={"ix-gpu.io/inject": "disabled"}))
        assert "ix-gpu.io/injected" not in (skipped["metadata"].get("annotations") or {})
        assert _admissions(port, context) == before
        # ...while unlabelled and otherwise-labelled GPU pods still are.
        for name, labels in (("plain", None), ("other", {"ix-gpu.io/inject": "enabled"})):
            mutated = _create_pod(api, ns, pod(name, limits=gpu, labels=labels))
            assert mutated["metadata"]["annotations"]["ix-gpu.io/injected"].startswith("nvidia@")
        assert _admissions(port, context) == before + 2
    finally:
        webhook.stop(15)


def _node(api: KubeAPI, name: str) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"team": "a"}}}
    status, body = _call(api, "POST", "/api/v1/nodes", node)
    assert status in (201, 409), body


def test_the_plugins_token_may_change_only_its_own_nodes_published_labels(
    kube_api: KubeAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart's node ValidatingAdmissionPolicy on the oldest supported apiserver: a token of the
    device plugin's ServiceAccount bound to a pod on n1 (as the pod's projected token is, naming
    n1) may merge-patch n1's published labels, and nothing else of n1 (its managedFields only as
    those writes record them) or of any other node."""
    plugin = f"{RELEASE}-ix-gpu-plugin"
    objects = [
        o
        for o in render({})
        if (
            o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
            and o["metadata"]["name"] == plugin
        )
        or (o["kind"].startswith("ValidatingAdmissionPolicy") and o["metadata"]["name"] == f"{plugin}-nodes")
    ]
    assert sorted(o["kind"] for o in objects) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    _ensure_namespace(kube_api, NS)
    server_side_apply(kube_api, objects)
    for name in ("n1", "n2"):
        _node(kube_api, name)
    token = _pod_token(kube_api, plugin, "n1")

    def patch(node: str, change: dict[str, Any], agent: str = PLUGIN_AGENT) -> tuple[int, Any]:
        return _call(
            kube_api,
            "PATCH",
            f"/api/v1/nodes/{node}",
            change,
            "application/merge-patch+json",
            token=token,
            agent=agent,
        )

    def labels(values: dict[str, str | None]) -> dict[str, Any]:
        return {"metadata": {"labels": values}}

    # The policy applies once the apiserver's policy informer has it: until another node is refused.
    wait_until(
        lambda: patch("n2", labels({"ix-gpu.io/gpu.count": "8"}))[0] in (403, 422), "policy in force", 30
    )
    refused = {
        "another node": patch("n2", labels({"ix-gpu.io/gpu.count": "8"})),
        "another label": patch("n1", labels({"team": "b"})),
        "removing another label": patch("n1", labels({"team": None})),
        "the allocation label": patch("n1", labels({"ix-gpu.io/gpu.allocation": "dra"})),
        "the config label": patch("n1", labels({"ix-gpu.io/device-plugin.config": "x"})),
        "an annotation": patch("n1", {"metadata": {"annotations": {"a": "b"}}}),
        "a taint": patch("n1", {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}),
        "cordon": patch("n1", {"spec": {"unschedulable": True}}),
    }
    for what, (status, reply) in refused.items():
        assert status in (403, 422), (what, status, reply)
    print("\n" + "\n".join(f"{what}: {status} {str(r)[:160]}" for what, (status, r) in refused.items()))
    assert "may change only that node" in str(refused["another node"][1])
    assert "may change only these labels" in str(refused["another label"][1])
    # What the plugin really writes, through its own client: every published label, set and then
    # removed (null). Its field manager (its User-Agent) comes to own those labels, and no more.
    published = {
        "ix-gpu.io/gpu.product": "BI-V150",
        "ix-gpu.io/gpu.vendor": "iluvatar",
        "ix-gpu.io/gpu.count": "8",
        "ix-gpu.io/gpu.memory": "65536",
        "ix-gpu.io/gpu.replicas": "4",
    }
    monkeypatch.setattr(apiserver, "USER_AGENT", apiserver.USER_AGENT)
    apiserver.identify("plugin")
    labeler = NodeLabeler(apiserver.ApiServer(kube_api.url, token, str(kube_api.ca_path)), "n1")
    assert labeler.publish(published), labeler.error
    status, node = _call(kube_api, "GET", "/api/v1/nodes/n1")
    assert node["metadata"]["labels"] == {"team": "a", **published}
    entries = node["metadata"]["managedFields"]
    (own,) = [e for e in entries if e["manager"] == PLUGIN_AGENT]
    assert own["fieldsV1"] == {"f:metadata": {"f:labels": {f"f:{key}": {} for key in published}}}
    _managed_fields_are_the_plugins_own(patch, entries, own)
    # A published label that an operator set to another value is the operator's (the write would
    # take it from that manager's entry), until the operator removes it (README, RBAC).
    merge = "application/merge-patch+json"
    for value, plugin_may in (("2", False), (None, True)):
        change = labels({"ix-gpu.io/gpu.count": value})
        status, reply = _call(kube_api, "PATCH", "/api/v1/nodes/n1", change, merge, agent="kubectl-label")
        assert status == 200, reply
        assert labeler.publish(published) is plugin_may, labeler.error
    assert labeler.publish({}), labeler.error
    status, node = _call(kube_api, "GET", "/api/v1/nodes/n1")
    assert node["metadata"]["labels"] == {"team": "a"}, node


PLUGIN_AGENT = "ix-gpu-plugin"
"""The device plugin's User-Agent (``ix-gpu plugin``), which names its field manager."""


def _managed_fields_are_the_plugins_own(
    patch: Callable[..., tuple[int, Any]], entries: list[dict[str, Any]], own: dict[str, Any]
) -> None:
    """With the plugin's token, n1's managedFields may change only as its own label writes change
    them: another manager's entry is not rewritten, dropped or added, and its own entry neither
    claims more than the published labels nor grows without bound."""
    others = [e for e in entries if e is not own]
    assert others and all(e["manager"] != PLUGIN_AGENT for e in others)
    theirs = copy.deepcopy(others)
    theirs[0]["fieldsV1"]["f:metadata"]["f:labels"].pop("f:team")  # nobody owns team any more
    bigger = copy.deepcopy(own)
    bigger["fieldsV1"]["f:metadata"]["f:labels"].update({f"f:x{i:04}": {} for i in range(2000)})
    spec = copy.deepcopy(own)
    spec["fieldsV1"]["f:spec"] = {"f:unschedulable": {}}
    applied = {**copy.deepcopy(own), "operation": "Apply"}

    def fields(forged: list[dict[str, Any]]) -> dict[str, Any]:
        return {"metadata": {"managedFields": forged}}

    refused = {
        "another manager's entry rewritten": patch("n1", fields([*theirs, own])),
        "another manager's entry dropped": patch("n1", fields([own])),
        "every entry cleared": patch("n1", fields([{}])),
        "a published label under another manager": patch(
            "n1", {"metadata": {"labels": {"ix-gpu.io/gpu.count": "9"}}}, agent="kubectl-label"
        ),
        "its own entry grown": patch("n1", fields([*others, bigger])),
        "its own entry claiming the spec": patch("n1", fields([*others, spec])),
        "a second entry of its own": patch("n1", fields([*others, own, applied])),
    }
    print("\n" + "\n".join(f"{what}: {status} …{str(r)[-230:]}" for what, (status, r) in refused.items()))
    for what, (status, reply) in refused.items():
        assert status in (403, 422), (what, status, reply)
    for what in ("another manager's entry rewritten", "a published label under another manager"):
        assert "may not change another manager's managedFields" in str(refused[what][1]), what
    for what in ("its own entry grown", "its own entry claiming the spec"):
        assert "managedFields entry (ix-gpu-plugin) may record only these labels" in str(refused[what][1])


def test_the_dra_plugins_token_may_write_a_bounded_set_of_counter_slices_without_devices(
    kube_api: KubeAPI,
) -> None:
    """The chart's ResourceSlice policy on the oldest supported apiserver: a token of the DRA
    plugin's ServiceAccount bound to a pod on d1 may write d1's slices under the plugin's names,
    the counter slices ``-counters-0`` to ``-counters-15`` only (no ``-counters-16``, no other
    spelling of an index), and those with no devices; it may delete them."""
    dra = f"{RELEASE}-ix-gpu-dra"
    objects = [
        o
        for o in render({"dra": {"enabled": True}})
        if (
            o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
            and o["metadata"]["name"] == dra
        )
        or (
            o["kind"].startswith("ValidatingAdmissionPolicy")
            and o["metadata"]["name"] == f"{dra}-resourceslices"
        )
    ]
    assert len(objects) == 5, [(o["kind"], o["metadata"]["name"]) for o in objects]
    _ensure_namespace(kube_api, NS)
    server_side_apply(kube_api, objects)
    for name in ("d1", "d2"):
        _node(kube_api, name)
    token = _pod_token(kube_api, dra, "d1")
    driver = "gpu.iluvatar.com"
    slices = "/apis/resource.k8s.io/v1/resourceslices"

    def body(name: str, node: str = "d1", devices: int = 0) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 2},
        }
        if devices:
            spec["devices"] = [{"name": f"gpu-{i}"} for i in range(devices)]
        else:  # dropped by an apiserver without DRAPartitionableDevices (1.35's default)
            spec["sharedCounters"] = [{"name": "board-0", "counters": {"chip-0": {"value": "1"}}}]
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": spec,
        }

    def write(method: str, name: str, obj: dict[str, Any] | None = None) -> tuple[int, Any]:
        path = slices if method == "POST" else f"{slices}/{name}"
        return _call(kube_api, method, path, obj, token=token)

    counters = f"d1-{driver}-counters-"
    # The policy applies once the apiserver's policy informer has it: until another node is refused.
    wait_until(lambda: write("POST", "", body(f"d2-{driver}", "d2"))[0] in (403, 422), "policy in force", 30)
    for name in (f"d1-{driver}", f"{counters}0", f"{counters}15"):
        status, reply = write("POST", name, body(name))
        assert status == 201, (name, reply)
    refused = {
        "counters-16": write("POST", "", body(f"{counters}16")),
        "counters-01": write("POST", "", body(f"{counters}01")),
        "counters-100": write("POST", "", body(f"{counters}100")),
        "a new counter slice with devices": write("POST", "", body(f"{counters}1", devices=2)),
        "devices put into a counter slice": write(
            "PUT",
            f"{counters}0",
            _with_version(kube_api, f"{slices}/{counters}0", body(f"{counters}0", devices=1)),
        ),
    }
    print("\n" + "\n".join(f"{what}: {status} …{str(r)[-230:]}" for what, (status, r) in refused.items()))
    for what, (status, reply) in refused.items():
        assert status in (403, 422), (what, status, reply)
    for what in ("counters-16", "counters-01", "counters-100"):
        assert "-counters-<k>, k below 16" in str(refused[what][1]), what
    for what in ("a new counter slice with devices", "devices put into a counter slice"):
        assert "may list shared counters only, no devices" in str(refused[what][1]), what
    # The devices slice keeps its devices; the counter slices it may delete.
    status, reply = write(
        "PUT",
        f"d1-{driver}",
        _with_version(kube_api, f"{slices}/d1-{driver}", body(f"d1-{driver}", devices=3)),
    )
    assert status == 200, reply
    for name in (f"{counters}0", f"{counters}15", f"d1-{driver}"):
        status, reply = write("DELETE", name)
        assert status == 200, (name, reply)


def _with_version(api: KubeAPI, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as a replacement of what ``path`` holds now (its resourceVersion)."""
    status, stored = _call(api, "GET", path)
    assert status == 200, stored
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": stored["metadata"]["resourceVersion"]}}


def test_the_chart_policy_names_exactly_the_labels_the_plugin_publishes() -> None:
    (policy,) = [o for o in render({}) if o["kind"] == "ValidatingAdmissionPolicy"]
    (published,) = [v for v in policy["spec"]["variables"] if v["name"] == "published"]
    assert json.loads(published["expression"]) == list(node_labels.PUBLISHED)
