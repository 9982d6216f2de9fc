"""``ix-gpu status`` believes a device-plugin pod only as the release's (:mod:`ix_gpu.status.trust`):
controlled by the release's DaemonSet, matched by the UID the API gives it, and running as the
ServiceAccount the release's ClusterRoleBinding binds. Any other pod in the right namespace with
the right labels is reported, with why, and its /metrics are never read."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.status.fake_api import (
    BINDINGS,
    PLUGIN,
    PLUGIN_UID,
    FakeCluster,
    Run,
    binding,
    controller,
    daemonset,
    plugin_pod,
)
from tests.status.objects import metrics

pytestmark = pytest.mark.timeout(60)

SICK = metrics("dp", 8, {0: [("tenant", "x", "")]}, {0: "over temperature"})
"""What a forged plugin would say of dp: its chip 0 sick and held by a tenant's pod."""


def report(run: Run, *args: str) -> dict[str, Any]:
    code, out, err = run("-o", "json", *args)
    assert code == 0, err
    return dict(json.loads(out))


def replace_dp_plugin(cluster: FakeCluster, pod: dict[str, Any]) -> None:
    """dp's plugin pod is ``pod`` instead of the release's, and its /metrics say :data:`SICK`."""
    cluster.pods = [p for p in cluster.pods if p["metadata"]["name"] != "ixd-plugin-a"] + [pod]
    cluster.metrics[f"ix-gpu-system/{pod['metadata']['name']}"] = SICK


@pytest.mark.parametrize(
    ("pod", "reason"),
    [
        (
            plugin_pod("forged", "dp", owners=[]),
            "it has no controller (no ownerReference with controller: true)",
        ),
        (
            plugin_pod("forged", "dp", owners=[controller("ReplicaSet", "forged-7d9f", "0000-rs")]),
            "its controller is 'ReplicaSet' 'forged-7d9f', not a DaemonSet",
        ),
        (
            plugin_pod("forged", "dp", owners=[controller(name="other", uid="0000-other")]),
            "its controller, DaemonSet 'other', is not a DaemonSet of namespace ix-gpu-system with labels "
            "app.kubernetes.io/name=ix-gpu,app.kubernetes.io/component=device-plugin",
        ),
        (
            plugin_pod("forged", "dp", owners=[controller(uid="0000-before")]),
            f"its controller, DaemonSet '{PLUGIN}', has UID '0000-before': the DaemonSet of that name now "
            f"has {PLUGIN_UID}",
        ),
        (
            plugin_pod("forged", "dp", account="default"),
            f"it runs as ServiceAccount 'default', not as its DaemonSet's {PLUGIN}",
        ),
    ],
    ids=["no owner", "a ReplicaSet", "another DaemonSet", "same name, another UID", "another ServiceAccount"],
)
def test_a_pod_the_release_did_not_make_is_reported_and_never_read(
    run_status: Run, cluster: FakeCluster, pod: dict[str, Any], reason: str
) -> None:
    """A pod of the release's namespace with the release's labels, on dp instead of its plugin."""
    replace_dp_plugin(cluster, pod)
    found = report(run_status)
    assert found["untrustedPlugins"] == [{"pod": "ix-gpu-system/forged", "node": "dp", "reason": reason}]
    nodes = {n["name"]: n for n in found["nodes"]}
    dp = nodes["dp"]
    assert dp["chips"] == [] and (dp["total"], dp["in_use"]) == (8, 2)  # counts from the API stay
    assert (
        dp["note"] == f"chips unknown: its device-plugin pod is not believed: ix-gpu-system/forged ({reason})"
    )
    assert len(nodes["dp2"]["chips"]) == 4 and nodes["dp2"]["note"] == ""
    assert not [s for s in cluster.seen if "/proxy/" in s and "forged" in s]
    code, out, _ = run_status()
    assert code == 0
    heading = "Not believed as device plugins (their /metrics were not read):"
    assert f"{heading}\n  ix-gpu-system/forged on dp: {reason}\n" in out


def test_a_forged_pod_beside_the_release_plugin_is_reported_and_the_real_one_read(
    run_status: Run, cluster: FakeCluster
) -> None:
    cluster.pods.append(plugin_pod("forged", "dp", owners=[]))
    cluster.metrics["ix-gpu-system/forged"] = SICK
    found = report(run_status)
    dp = next(n for n in found["nodes"] if n["name"] == "dp")
    assert dp["note"] == "" and dp["chips"][0]["holders"] == ["ml/train"]  # not "two pods on this node"
    assert [u["pod"] for u in found["untrustedPlugins"]] == ["ix-gpu-system/forged"]


def test_a_tenants_namespace_of_the_default_name_is_not_believed(
    run_status: Run, cluster: FakeCluster
) -> None:
    """The release lives in gpu-system; a tenant made ix-gpu-system (the default --namespace) with a
    DaemonSet, ServiceAccount and pods of its own, all labelled and owned as the chart's are. The
    tenant cannot bind a cluster role: its ServiceAccount is no subject of the chart's
    ClusterRoleBinding, so none of its pods is believed, and the report says where the release is."""
    tenant_uid = "0000-tenant"
    cluster.daemonsets = [daemonset("gpu-system"), daemonset(uid=tenant_uid)]
    cluster.bindings = [binding("gpu-system")]
    for pod in cluster.pods:
        if pod["metadata"]["name"].startswith("ixd-plugin-"):
            pod["metadata"]["ownerReferences"] = [controller(uid=tenant_uid)]
    real = plugin_pod("ixd-plugin-real", "dp2", namespace="gpu-system")
    cluster.pods.append(real)
    cluster.metrics["gpu-system/ixd-plugin-real"] = metrics("dp2", 4, {}, {})
    found = report(run_status)
    assert sorted(u["pod"] for u in found["untrustedPlugins"]) == [
        f"ix-gpu-system/ixd-plugin-{x}" for x in "abc"
    ]
    assert {u["reason"] for u in found["untrustedPlugins"]} == {
        f"its DaemonSet {PLUGIN} runs as ServiceAccount ix-gpu-system/{PLUGIN}, which no ClusterRoleBinding "
        "with labels app.kubernetes.io/name=ix-gpu,app.kubernetes.io/component=device-plugin binds; those "
        f"labels bind gpu-system/{PLUGIN}: is the release there (--namespace)?"
    }
    assert all(n["chips"] == [] for n in found["nodes"])
    assert not [s for s in cluster.seen if "/proxy/" in s]
    # Where the release is, its pods are believed.
    nodes = {n["name"]: n for n in report(run_status, "--namespace", "gpu-system")["nodes"]}
    assert len(nodes["dp2"]["chips"]) == 4 and nodes["dp2"]["note"] == ""


def test_the_release_is_read_with_the_selector_and_only_when_there_are_pods_to_check(
    run_status: Run, cluster: FakeCluster
) -> None:
    report(run_status)
    selector = (
        "labelSelector=app.kubernetes.io%2Fname%3Dix-gpu%2Capp.kubernetes.io%2Fcomponent%3Ddevice-plugin"
    )
    for path in ("/apis/apps/v1/namespaces/ix-gpu-system/daemonsets", BINDINGS):
        listed = cluster.lists_of(path)
        assert listed and all(selector in q for q in listed), path
    cluster.seen.clear()
    cluster.pods = [p for p in cluster.pods if not p["metadata"]["name"].startswith("ixd-plugin-")]
    report(run_status)
    assert not cluster.lists_of(BINDINGS)


def test_a_release_that_cannot_be_read_believes_no_pod(run_status: Run, cluster: FakeCluster) -> None:
    """An operator who may not list ClusterRoleBindings sees the counts, and why there are no chips."""
    cluster.status[BINDINGS] = (403, b'{"kind": "Status", "message": "clusterrolebindings is forbidden"}')
    found = report(run_status)
    assert len(found["untrustedPlugins"]) == 3
    (reason,) = {u["reason"] for u in found["untrustedPlugins"]}
    assert reason.startswith("its DaemonSet or the release's ClusterRoleBindings could not be read (")
    assert "clusterrolebindings is forbidden" in reason
    dp = next(n for n in found["nodes"] if n["name"] == "dp")
    assert dp["chips"] == [] and dp["total"] == 8 and "could not be read" in dp["note"]
    assert not [s for s in cluster.seen if "/proxy/" in s]
