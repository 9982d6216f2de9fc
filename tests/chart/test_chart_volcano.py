"""``flags.usevolcano`` in the chart: the ix-config says it, the plugin's ClusterRole gets list,
watch and patch on pods, and a ValidatingAdmissionPolicy keeps what a token of the plugin may patch
to three annotations of pods on its own node. The policy is enforced here on the oldest supported
kube-apiserver (IX_GPU_K8S=1), with the plugin's own write-back and watch through such a token."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import pytest

from ix_gpu.config.plugin_config import parse_plugin_yaml
from ix_gpu.kube import apiserver
from ix_gpu.plugin.offer.volcano import (
    ANNOTATIONS,
    DEV_KUBELET,
    DEV_REAL_ALLOC,
    DEV_VOLCANO,
    PREDICATE_TIME,
    pod_facts,
)
from ix_gpu.plugin.server.volcano import Binding, NodePods, write_back
from tests.chart.rendering import find, render
from tests.chart.test_chart_install import (  # noqa: F401  (kube_api: the module's apiserver)
    NS,
    PLUGIN_AGENT,
    RELEASE,
    _call,
    _ensure_namespace,
    _node,
    _pod_token,
    kube_api,
    server_side_apply,
)
from tests.k8s.k8s_tier import KubeAPI
from tests.support.waiting import wait_until

PLUGIN = f"{RELEASE}-ix-gpu-plugin"
ON = {"plugin": {"config": {"flags": {"usevolcano": True}}}}
REAL = pytest.mark.skipif(
    os.environ.get("IX_GPU_K8S", "").lower() not in ("1", "true", "yes"),
    reason="real-Kubernetes tier: set IX_GPU_K8S=1",
)


def pod_rules(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    role = find(objects, "ClusterRole", PLUGIN)
    return [rule for rule in role["rules"] if "pods" in rule["resources"]]


def test_off_by_default_no_pod_rights_and_no_pod_policy() -> None:
    objects = render({})
    assert pod_rules(objects) == []
    assert not [o for o in objects if o["metadata"]["name"].startswith(f"{PLUGIN}-pod")]
    assert "usevolcano" not in find(objects, "ConfigMap", "ix-config")["data"]["ix-config"]


def test_usevolcano_reaches_the_ix_config_and_grants_list_watch_and_patch_on_pods_limited_by_the_policy() -> (
    None
):
    objects = render(ON)
    config = parse_plugin_yaml(
        find(objects, "ConfigMap", "ix-config")["data"]["ix-config"].encode(), "ix-config"
    )
    assert config.runtime().usevolcano
    assert pod_rules(objects) == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "patch"]}
    ]
    policy = find(objects, "ValidatingAdmissionPolicy", f"{PLUGIN}-pods")
    (allowed,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "allowed"]
    assert allowed == "[" + ", ".join(f'"{a}"' for a in ANNOTATIONS) + "]"  # what the plugin writes
    for name in (f"{PLUGIN}-pods", f"{PLUGIN}-pod-records"):
        assert find(objects, "ValidatingAdmissionPolicyBinding", name)["spec"]["policyName"] == name
    quiet = render({**ON, "plugin": {**ON["plugin"], "restrictPodWrites": False}})
    assert pod_rules(quiet) and not [o for o in quiet if o["metadata"]["name"].startswith(f"{PLUGIN}-pod")]


def test_a_node_config_with_usevolcano_grants_it_and_mounts_the_token_without_node_labels() -> None:
    objects = render(
        {"plugin": {"nodeLabels": False, "nodeConfigs": {"volcano": {"flags": {"usevolcano": True}}}}}
    )
    assert pod_rules(objects) and find(objects, "ValidatingAdmissionPolicy", f"{PLUGIN}-pods")
    daemonset = find(objects, "DaemonSet", PLUGIN)
    assert daemonset["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    # Without node labels the node rule has no verbs of its own and is left out, not left empty.
    role = find(render({"plugin": {"nodeLabels": False, **ON["plugin"]}}), "ClusterRole", PLUGIN)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "patch"]}]


def _pod(api: KubeAPI, namespace: str, name: str, node: str, annotations: dict[str, str]) -> dict[str, Any]:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": False,
            "containers": [{"name": "main", "image": "ix-gpu"}],
        },
    }
    status, created = _call(api, "POST", f"/api/v1/namespaces/{namespace}/pods", body)
    assert status == 201, created
    return dict(created)


@pytest.mark.k8s
@REAL
def test_the_plugins_token_may_patch_only_the_volcano_annotations_of_its_own_nodes_pods(
    kube_api: KubeAPI,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A token of the plugin's ServiceAccount bound to a pod on v1 (naming v1, as the pod's
    projected token does): the plugin's own write-back of a binding goes through and its watch of
    v1's pods sees them; every other change of a pod is refused, and so is any change of v2's."""
    rbac = [
        o
        for o in render(ON)
        if o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
        and o["metadata"]["name"] == PLUGIN
    ]
    policies = [
        o
        for o in render(ON)
        if o["kind"].startswith("ValidatingAdmissionPolicy")
        and o["metadata"]["name"] in (f"{PLUGIN}-pods", f"{PLUGIN}-pod-records")
    ]
    assert (len(rbac), len(policies)) == (3, 4), [(o["kind"], o["metadata"]["name"]) for o in rbac + policies]
    _ensure_namespace(kube_api, NS)
    server_side_apply(kube_api, rbac)
    for node in ("v1", "v2"):
        _node(kube_api, node)
    namespace = "volcano-ml"
    _ensure_namespace(kube_api, namespace)
    status, reply = _call(
        kube_api, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "default"}}
    )
    assert status in (201, 409), reply
    chosen = {DEV_VOLCANO: "GPU-3", PREDICATE_TIME: "1700000000000000000", "team": "a"}
    _pod(kube_api, namespace, "train", "v1", {"team": "a"})
    _pod(kube_api, namespace, "elsewhere", "v2", dict(chosen))
    # As Volcano leaves it (one field manager wrote both its annotations), with a DevKubelet that
    # Iluvatar's plugin wrote before (its entry owns that alone). The plugin's write takes them:
    # vc-scheduler's entry keeps DevVolcano, the old plugin's entry goes (it owns nothing more).
    for agent, notes in (("vc-scheduler", chosen), ("ix-device-plugin", {DEV_KUBELET: "GPU-9"})):
        change = {"metadata": {"annotations": {k: v for k, v in notes.items() if k != "team"}}}
        status, train = _call(
            kube_api, "PATCH", f"/api/v1/namespaces/{namespace}/pods/train", change,
            "application/merge-patch+json", agent=agent,
        )  # fmt: skip
        assert status == 200, train
    assert {e["manager"] for e in train["metadata"]["managedFields"]} >= {"vc-scheduler", "ix-device-plugin"}
    server_side_apply(kube_api, policies)  # after the writes of a plugin that ran before
    token = _pod_token(kube_api, PLUGIN, "v1")
    pods = f"/api/v1/namespaces/{namespace}/pods"

    def patch(name: str, change: dict[str, Any], subresource: str = "") -> tuple[int, Any]:
        return _call(
            kube_api,
            "PATCH",
            f"{pods}/{name}{subresource}",
            change,
            "application/merge-patch+json",
            token=token,
            agent=PLUGIN_AGENT,
        )

    def annotate(name: str, values: dict[str, str | None]) -> tuple[int, Any]:
        return patch(name, {"metadata": {"annotations": values}})

    wait_until(lambda: annotate("elsewhere", {PREDICATE_TIME: "1"})[0] in (403, 422), "policy in force", 30)
    forged = {
        "metadata": {"name": "forged", "annotations": {DEV_REAL_ALLOC: "GPU-1"}},
        "spec": {"nodeName": "v1", "containers": [{"name": "main", "image": "ix-gpu"}]},
    }
    wait_until(
        lambda: _call(kube_api, "POST", f"/api/v1/namespaces/{namespace}/pods", forged)[0] == 422,
        "records policy in force",
        30,
    )
    monkeypatch.setattr(apiserver, "USER_AGENT", apiserver.USER_AGENT)
    apiserver.identify("plugin")  # the plugin's field manager, ix-gpu-plugin
    api = apiserver.ApiServer(kube_api.url, token, str(kube_api.ca_path))
    watch = NodePods(api, "v1")
    watch.start()
    try:
        assert watch.wait_synced(20), watch.last_error()
        # v1's pods, and no other node's (the token's own pod is on v1 too).
        assert sorted(p.key for p in watch.pods()) == [f"{NS}/{PLUGIN}-on-v1", f"{namespace}/train"]
    finally:
        watch.stop()
    facts = pod_facts(train)
    assert facts is not None
    write_back(api, Binding(facts, ("GPU-0",), ("GPU-3",)))
    status, stored = _call(kube_api, "GET", f"{pods}/train")
    assert stored["metadata"]["annotations"] == {
        **chosen,
        PREDICATE_TIME: "18446744073709551615",
        DEV_KUBELET: "GPU-0",
        DEV_REAL_ALLOC: "GPU-3",
    }
    entries = {e["manager"]: e for e in stored["metadata"]["managedFields"]}
    own = entries[PLUGIN_AGENT]
    assert own["fieldsV1"] == {"f:metadata": {"f:annotations": {f"f:{key}": {} for key in ANNOTATIONS}}}
    assert "ix-device-plugin" not in entries
    assert entries["vc-scheduler"]["fieldsV1"] == {"f:metadata": {"f:annotations": {f"f:{DEV_VOLCANO}": {}}}}
    # A pod of the same name but another uid (deleted and created again) is not written.
    with pytest.raises(OSError) as stale:
        write_back(api, Binding(replace(facts, uid="0" * 8), ("GPU-0",), ("GPU-3",)))
    assert getattr(stale.value, "code", None) in (409, 422), stale.value

    missing = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "gone",
        "uid": "00000000-0000-0000-0000-000000000000",
    }
    others = [e for e in stored["metadata"]["managedFields"] if e["manager"] != PLUGIN_AGENT]
    forged = [{**others[0], "manager": "someone-else"}, *others[1:], own]
    claiming = {**own, "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}}}
    refused = {
        "another node's pod": annotate("elsewhere", {DEV_REAL_ALLOC: "GPU-0"}),
        "another annotation": annotate("train", {"x": "y"}),
        "Volcano's own choice": annotate("train", {DEV_VOLCANO: "GPU-1"}),
        "removing an annotation": annotate("train", {"team": None}),
        "a label": patch("train", {"metadata": {"labels": {"app": "other"}}}),
        "an ownerReference": patch("train", {"metadata": {"ownerReferences": [missing]}}),
        "a finalizer": patch("train", {"metadata": {"finalizers": ["ix-gpu.io/hold"]}}),
        "the spec": patch("train", {"spec": {"activeDeadlineSeconds": 1}}),
        "another manager's managedFields": patch("train", {"metadata": {"managedFields": forged}}),
        "another manager's entry dropped": patch("train", {"metadata": {"managedFields": [own]}}),
        "its own entry claiming a label": patch(
            "train", {"metadata": {"managedFields": [*others, claiming]}}
        ),
        "the status": patch("train", {"status": {"phase": "Failed"}}, "/status"),
        "an ephemeral container": patch(
            "train",
            {"spec": {"ephemeralContainers": [{"name": "x", "image": "ix-gpu"}]}},
            "/ephemeralcontainers",
        ),
        "deleting it": _call(kube_api, "DELETE", f"{pods}/train", token=token),
        "creating one": _call(kube_api, "POST", pods, {"metadata": {"name": "new"}, "spec": {}}, token=token),
    }
    print("\n" + "\n".join(f"{what}: {status} …{str(r)[-200:]}" for what, (status, r) in refused.items()))
    for what, (status, reply) in refused.items():
        assert status in (403, 422), (what, status, reply)
    assert "may change only pods on that node" in str(refused["another node's pod"][1])
    for what in ("another annotation", "Volcano's own choice", "removing an annotation"):
        assert "may change only these annotations of a pod" in str(refused[what][1]), what
    for what in ("a label", "an ownerReference", "a finalizer"):
        assert "labels, ownerReferences, finalizers or other metadata" in str(refused[what][1]), what
    # A spec change is also recorded in the plugin's managedFields entry, whose rule says so first.
    assert "may record only these annotations of a pod" in str(refused["the spec"][1])
    for what in ("another manager's managedFields", "another manager's entry dropped"):
        assert "another manager's managedFields" in str(refused[what][1]), what
    assert "may record only these annotations" in str(refused["its own entry claiming a label"][1])
    status, after = _call(kube_api, "GET", f"{pods}/train")
    assert after["metadata"]["annotations"] == stored["metadata"]["annotations"]
    assert after["metadata"]["labels"] == {"app": "train"} and not after["metadata"].get("finalizers")
    # Nobody else writes the plugin's records, a cluster admin included: not on a new pod (above),
    # not on one the plugin wrote; the pod's other annotations stay its owner's.
    records = {
        "changing DevRealAlloc": {DEV_REAL_ALLOC: "GPU-0"},
        "removing DevKubelet": {DEV_KUBELET: None},
    }
    for what, values in records.items():
        status, reply = _call(
            kube_api,
            "PATCH",
            f"{pods}/train",
            {"metadata": {"annotations": values}},
            "application/merge-patch+json",
        )
        assert status == 422 and "only the device plugin writes" in str(reply), (what, status, reply)
    status, reply = _call(
        kube_api,
        "PATCH",
        f"{pods}/train",
        {"metadata": {"annotations": {"team": "b"}}},
        "application/merge-patch+json",
    )
    assert status == 200, reply
