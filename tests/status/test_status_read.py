"""``ix-gpu status`` reading a cluster (:mod:`ix_gpu.status.read` and the command), over a fake API
server (``fake_api``): only the chart's plugin pods are believed; one node's bad plugin is that
node's note alone; a list whose continue token expires starts again; one deadline bounds the read;
every failure is one line and exit 1; and what is kept of each object as it is listed gives the
same view as the objects whole."""

from __future__ import annotations

import copy
import json
import threading
import time
from typing import Any

import pytest

from ix_gpu.devicemodel.vendors import ILUVATAR
from ix_gpu.dra.devices import dra_devices, slice_devices
from ix_gpu.node.backends.base import Chip
from ix_gpu.status.read import (
    DEADLINE_GRACE,
    LIST_ATTEMPTS,
    Deadline,
    DeadlineExceeded,
    slim_claim,
    slim_node,
    slim_pod,
    slim_slice,
    within,
)
from ix_gpu.status.view import cluster_status
from tests.status.fake_api import PLUGIN_LABELS, FakeCluster, Run, plugin_pod
from tests.status.objects import DRIVER, RESOURCE, claim, metrics, node, pod, slice_

pytestmark = pytest.mark.timeout(60)

PLUGIN_PODS = "/api/v1/namespaces/ix-gpu-system/pods"
SELECTOR_QUERY = (
    "labelSelector=app.kubernetes.io%2Fname%3Dix-gpu%2Capp.kubernetes.io%2Fcomponent%3Ddevice-plugin"
)


def nodes_of(run: Run, *args: str) -> dict[str, Any]:
    code, out, err = run("-o", "json", *args)
    assert code == 0, err
    return {n["name"]: n for n in json.loads(out)["nodes"]}


def one_line_failure(run: Run, *args: str) -> str:
    """The one line ``ix-gpu status`` fails with (exit 1, nothing on stdout, no traceback)."""
    code, out, err = run("-o", "json", *args)
    assert (code, out) == (1, ""), err
    assert err.count("\n") == 1 and err.startswith("ix-gpu status: ") and "Traceback" not in err, err
    return err.strip()


def test_each_nodes_chips_come_from_the_release_plugin_pod_there(
    run_status: Run, cluster: FakeCluster
) -> None:
    nodes = nodes_of(run_status)
    assert sorted(nodes) == ["dp", "dp2", "dra"]
    assert [c["uuid"] for c in nodes["dp"]["chips"]] == [f"GPU-dp-{i}" for i in range(8)]
    assert nodes["dp"]["chips"][0]["holders"] == ["ml/train"]
    assert nodes["dp2"]["chips"][2]["problems"] == ["ECC error"]
    assert nodes["dra"]["chips"][0]["holders"] == ["ml/a (claim ml/shared)"]
    assert {n["note"] for n in nodes.values()} == {""}
    # The plugins are looked for in the chart's namespace, with its labels, and nowhere else.
    listed = cluster.lists_of(PLUGIN_PODS)
    assert listed and all(SELECTOR_QUERY in q for q in listed)
    assert [s for s in cluster.seen if "/proxy/" in s] != []
    assert all(
        s.startswith("/api/v1/namespaces/ix-gpu-system/pods/ixd-plugin-")
        for s in cluster.seen
        if "/proxy/" in s
    )


def test_a_pod_with_the_plugins_labels_elsewhere_is_not_believed(
    run_status: Run, cluster: FakeCluster
) -> None:
    """A tenant's pod labelled as the device plugin, on dp and listed after the real one (the old
    reader kept the last pod per node): its /metrics, which would make dp's chips sick and its
    own, is never read. Neither is a pod of the chart's namespace without the plugin's labels."""
    cluster.pods.append(plugin_pod("spoof", "dp", namespace="tenant"))
    cluster.metrics["tenant/spoof"] = metrics("dp", 8, {0: [("tenant", "x", "")]}, {0: "over temperature"})
    webhook = {**PLUGIN_LABELS, "app.kubernetes.io/component": "webhook"}
    cluster.pods.append(plugin_pod("ixd-webhook", "dp", labels=webhook))
    cluster.metrics["ix-gpu-system/ixd-webhook"] = "garbage"
    dp = nodes_of(run_status)["dp"]
    assert dp["note"] == "" and dp["chips"][0]["holders"] == ["ml/train"]
    assert {c["health"] for c in dp["chips"]} == {"Healthy"}
    assert not [s for s in cluster.seen if "spoof" in s or "ixd-webhook" in s]
    # Another namespace named on the command line is looked in instead; a pod there too is believed
    # only as the release's DaemonSet's, which no DaemonSet of that namespace is (test_status_trust).
    nodes = nodes_of(run_status, "--namespace", "tenant")
    assert nodes["dp"]["chips"] == [] and "pod is not believed: tenant/spoof (" in nodes["dp"]["note"]
    assert nodes["dp2"]["note"].startswith(
        "chips unknown: no device-plugin pod on this node (namespace tenant"
    )
    assert not [s for s in cluster.seen if "/proxy/" in s and "spoof" in s]


def test_two_plugin_pods_on_one_node_are_that_nodes_error(run_status: Run, cluster: FakeCluster) -> None:
    cluster.pods.append(plugin_pod("ixd-plugin-z", "dp"))
    cluster.metrics["ix-gpu-system/ixd-plugin-z"] = metrics("dp", 8, {}, {3: "ECC error"})
    nodes = nodes_of(run_status)
    dp = nodes["dp"]
    assert dp["note"] == (
        "two device-plugin pods on this node: ix-gpu-system/ixd-plugin-a, ix-gpu-system/ixd-plugin-z"
    )
    assert (dp["chips"], dp["total"], dp["in_use"], dp["free"]) == ([], 8, 2, 6)  # counts stay
    assert len(nodes["dp2"]["chips"]) == 4 and nodes["dp2"]["note"] == ""
    assert not [s for s in cluster.seen if "/proxy/" in s and ("ixd-plugin-a" in s or "ixd-plugin-z" in s)]
    code, out, _ = run_status()
    assert code == 0 and "dp (device-plugin): two device-plugin pods on this node: " in out


@pytest.mark.parametrize(
    ("page", "why"),
    [
        ("<html><body>502 Bad Gateway</body></html>", "is not Prometheus text"),
        ('ix_gpu_chip_telemetry_stale{node="dp",uuid="GPU-dp-0" 0\n', "is not Prometheus text"),
        ('# TYPE x gauge\nx{node="dp"} not-a-number\n', "is not Prometheus text"),
        (b"\xff\xfe\x00binary", "could not be read"),
    ],
)
def test_a_page_that_is_not_prometheus_text_is_that_nodes_note_alone(
    run_status: Run, cluster: FakeCluster, page: str | bytes, why: str
) -> None:
    cluster.metrics["ix-gpu-system/ixd-plugin-a"] = page
    nodes = nodes_of(run_status)
    note = nodes["dp"]["note"]
    assert note.startswith("chips unknown: ") and why in note and "ix-gpu-system/ixd-plugin-a" in note, note
    assert "\n" not in note and nodes["dp"]["chips"] == [] and nodes["dp"]["total"] == 8
    assert len(nodes["dp2"]["chips"]) == 4 and len(nodes["dra"]["chips"]) == 2
    assert nodes["dp2"]["note"] == nodes["dra"]["note"] == ""


def test_a_plugin_that_does_not_answer_or_is_not_running_is_that_nodes_note(
    run_status: Run, cluster: FakeCluster
) -> None:
    del cluster.metrics["ix-gpu-system/ixd-plugin-a"]  # the proxy answers 503
    cluster.pods[-1]["status"]["phase"] = "Pending"  # dra's plugin
    cluster.pods.remove(next(p for p in cluster.pods if p["metadata"]["name"] == "ixd-plugin-b"))
    nodes = nodes_of(run_status)
    assert nodes["dp"]["note"].startswith("chips unknown: the device plugin's /metrics could not be read (")
    assert (
        nodes["dra"]["note"] == "chips unknown: the device-plugin pod ix-gpu-system/ixd-plugin-c is Pending"
    )
    assert nodes["dp2"]["note"] == (
        "chips unknown: no device-plugin pod on this node (namespace ix-gpu-system, labels "
        "app.kubernetes.io/name=ix-gpu,app.kubernetes.io/component=device-plugin)"
    )


def test_no_chips_reads_no_plugin(run_status: Run, cluster: FakeCluster) -> None:
    nodes = nodes_of(run_status, "--no-chips")
    assert {n["note"] for n in nodes.values()} == {""} and nodes["dp"]["in_use"] == 2
    assert not cluster.lists_of(PLUGIN_PODS) and not [s for s in cluster.seen if "/proxy/" in s]


def test_a_continue_token_that_expired_starts_the_list_again(run_status: Run, cluster: FakeCluster) -> None:
    """410 Gone on the second page of nodes, and of pods: each list is read again from its first
    page, and the view is what it would have been."""
    expected = nodes_of(run_status)
    cluster.seen.clear()
    cluster.gone.update({"/api/v1/nodes": 1, "/api/v1/pods": 2})
    assert nodes_of(run_status) == expected
    starts = [q for q in cluster.lists_of("/api/v1/nodes") if "continue=" not in q]
    assert len(starts) == 2 and len(cluster.lists_of("/api/v1/nodes")) == 2 + 2  # 2 pages, 1 expired
    assert len([q for q in cluster.lists_of("/api/v1/pods") if "continue=" not in q]) == 3


def test_a_list_that_keeps_expiring_fails_in_one_line(run_status: Run, cluster: FakeCluster) -> None:
    cluster.gone["/api/v1/nodes"] = LIST_ATTEMPTS
    line = one_line_failure(run_status)
    assert line.endswith(f"listing nodes: 410 Gone {LIST_ATTEMPTS} times (the list's continue token "
                         "expired before its last page was read each time); try again"), line  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (
            (403, b'{"kind": "Status", "message": "nodes is forbidden"}'),
            "HTTP Error 403: Forbidden: nodes is forbidden",
        ),
        ((200, b"<html>a login page</html>"), "the answer is not JSON"),
        ((200, b'{"kind": "Status"}'), "nodes list without items or metadata"),
    ],
)
def test_an_api_that_cannot_be_read_is_one_line_and_exit_1(
    run_status: Run, cluster: FakeCluster, served: str, answer: tuple[int, bytes], says: str
) -> None:
    cluster.status["/api/v1/nodes"] = answer
    line = one_line_failure(run_status)
    assert line.startswith(f"ix-gpu status: cannot read the cluster at {served}: ") and says in line, line


def test_a_cluster_without_dra_is_read(run_status: Run, cluster: FakeCluster) -> None:
    cluster.slices = None  # resource.k8s.io/v1 not served: 404
    cluster.nodes = cluster.nodes[:2]
    assert sorted(nodes_of(run_status)) == ["dp", "dp2"]


@pytest.mark.parametrize(
    ("hang", "timeout", "doing"),
    [
        ("/api/v1/nodes", "1", "listing nodes"),
        (PLUGIN_PODS, "1", "listing device-plugin pods in ix-gpu-system"),
        ("ix-gpu-system/ixd-plugin-b", "1.5", "reading the /metrics of 3 device-plugin pods"),
    ],
)
def test_the_deadline_ends_the_read_in_one_line(
    run_status: Run, cluster: FakeCluster, hang: str, timeout: str, doing: str
) -> None:
    cluster.hang.add(hang)
    started = time.monotonic()
    line = one_line_failure(run_status, "--timeout", timeout)
    took = time.monotonic() - started
    assert line == f"ix-gpu status: did not finish within --timeout {timeout} s ({doing})"
    assert float(timeout) <= took < float(timeout) + 1.0, took


def test_a_read_that_outlasts_its_socket_timeouts_is_abandoned_at_the_deadline() -> None:
    """A server that trickles a byte now and then resets every socket timeout: the read is given
    up all the same, :data:`DEADLINE_GRACE` after the deadline."""
    stuck = threading.Event()
    deadline = Deadline(0.3)
    deadline.doing = "listing nodes"
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"^did not finish within --timeout 0.3 s \(listing nodes\)$"):
        within(deadline, lambda: stuck.wait(30))
    assert time.monotonic() - started < 0.3 + DEADLINE_GRACE + 0.5
    stuck.set()
    assert within(Deadline(5), lambda: 42) == 42
    with pytest.raises(KeyError):
        within(Deadline(5), lambda: dict[str, int]()["x"])


def test_usage_errors_exit_2(
    run_status: Run, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run_status("--selector", " ")[0] == 2
    for bad in ("0", "-1", "soon"):
        with pytest.raises(SystemExit) as exited:
            run_status("--timeout", bad)
        assert exited.value.code == 2
    from ix_gpu.cli import main

    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at hyphens too
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for said in (
        "--namespace NAME",
        "default ix-gpu-system",
        "app.kubernetes.io/instance=RELEASE",
        "--timeout SECONDS",
        "IX_GPU_STATUS_NAMESPACE",
        "a pod elsewhere with the same labels is not believed",
    ):
        assert said in text, said


# ----------------------------------------------------------------------- what a list keeps


def whole_node(name: str, gpus: int = 0, dra: bool = False) -> dict[str, Any]:
    """A node as the API server gives it: managedFields, images, conditions and all."""
    found = node(name, gpus=gpus, dra=dra)
    found["metadata"].update(
        uid="u-" + name,
        annotations={"node.alpha.kubernetes.io/ttl": "0", "kubeadm": "x" * 500},
        managedFields=[{"manager": "kubelet", "fieldsV1": {"f:status": {"x": "y" * 200}}}] * 8,
    )
    found["metadata"]["labels"].update({"kubernetes.io/hostname": name, "ix-gpu.io/gpu.count": str(gpus)})
    found["status"].update(
        capacity=dict(found["status"]["allocatable"]),
        conditions=[{"type": t, "status": "False", "message": "m" * 80} for t in ("Ready", "DiskPressure")],
        images=[
            {"names": [f"registry/image-{i}@sha256:{'0' * 64}"], "sizeBytes": 1 << 30} for i in range(40)
        ],
        nodeInfo={"kernelVersion": "6.1", "kubeletVersion": "v1.37.2"},
    )
    found["spec"] = {"podCIDR": "10.0.0.0/24", "taints": []}
    return found


def whole_claim(namespace: str, name: str, node_name: str, device: str, pods: list[str]) -> dict[str, Any]:
    found = claim(namespace, name, node_name, device, pods)
    found["metadata"]["managedFields"] = [{"manager": "kube-scheduler", "fieldsV1": {"x": "y" * 300}}]
    found["spec"] = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}
    found["status"]["devices"] = [{"driver": DRIVER, "pool": node_name, "device": device, "data": {}}]
    return found


def whole_cluster() -> dict[str, Any]:
    """Nodes of each kind, a partitionable DRA node (boards and chips, counters, defaultForm), a
    tainted device, another driver's slice and claim, as the API server gives them."""
    chips = [Chip(f"GPU-{i}", i, i, f"b{i // 2}", i % 2, "Iluvatar BI-V150", 32768, 0) for i in range(4)]
    devices = slice_devices(dra_devices(chips, splitboard=True, partitionable=True), ILUVATAR, DRIVER)
    pool = {"name": "part", "generation": 3}
    shared = [{"name": "board-0", "counters": {}}]
    boards = {
        "spec": {
            "driver": DRIVER,
            "nodeName": "part",
            "pool": pool,
            "devices": devices,
            "sharedCounters": shared,
        }
    }
    other = slice_("dra", 2) | {"metadata": {"name": "other"}}
    other["spec"]["driver"] = "other.example.com"
    plain = slice_("dra", 4, tainted=(3,))
    plain["spec"]["devices"][0]["attributes"]["defaultForm"] = {"bool": True}
    plain["metadata"] = {"name": "dra-gpu", "managedFields": [{"manager": "ix-gpu-dra"}] * 5}
    theirs = whole_claim("ml", "theirs", "dra", "gpu-1", ["d"])
    theirs["status"]["allocation"]["devices"]["results"][0]["driver"] = "other.example.com"
    return {
        "nodes": [
            whole_node("dp", 8),
            whole_node("dra", dra=True),
            whole_node("part", dra=True),
            whole_node("cpu"),
        ],
        "pods": [pod("ml", "train", "dp", 2)],
        "slices": [plain, other, boards],
        "claims": [
            whole_claim("ml", "shared", "dra", "gpu-0", ["a", "b"]),
            whole_claim("ml", "board", "part", "board-2", ["c"]),
            theirs,
        ],
        "chips": {},
    }


def test_objects_cut_down_as_listed_give_the_same_view() -> None:
    whole = whole_cluster()
    untouched = copy.deepcopy(whole)
    slim = {
        **whole,
        "nodes": list(map(slim_node(RESOURCE), whole["nodes"])),
        "pods": list(map(slim_pod, whole["pods"])),
        "slices": list(map(slim_slice(DRIVER), whole["slices"])),
        "claims": list(map(slim_claim, whole["claims"])),
    }
    assert whole == untouched  # cutting down copies, never edits
    for kind in ("nodes", "slices", "claims"):
        assert len(json.dumps(slim[kind])) < len(json.dumps(whole[kind])) / 2, kind
    assert len(json.dumps(slim["nodes"][0])) < 250
    view = cluster_status(resource=RESOURCE, driver=DRIVER, **whole).as_json()
    assert cluster_status(resource=RESOURCE, driver=DRIVER, **slim).as_json() == view
    nodes = {n["name"]: n for n in view["nodes"]}
    assert sorted(nodes) == ["dp", "dra", "part"] and nodes["part"]["in_use"] == 2  # a board takes its chips
    assert [d["healthy"] for d in nodes["dra"]["devices"]] == [True, True, True, False]
    # Whatever a field holds, cutting it down does not raise: the view's defaults decide.
    for odd in ({}, {"metadata": None, "spec": None, "status": None}, {"spec": {"devices": [{"name": "x"}]}}):
        slim_node(RESOURCE)(odd), slim_slice(DRIVER)(odd), slim_claim(odd)


def test_the_command_shows_whole_objects_as_the_view_does(run_status: Run, cluster: FakeCluster) -> None:
    whole = whole_cluster()
    cluster.nodes, cluster.pods, cluster.slices, cluster.claims = (
        whole["nodes"], whole["pods"], whole["slices"], whole["claims"],
    )  # fmt: skip
    code, out, err = run_status("-o", "json", "--no-chips")
    assert code == 0, err
    assert json.loads(out) == cluster_status(resource=RESOURCE, driver=DRIVER, **whole).as_json()
