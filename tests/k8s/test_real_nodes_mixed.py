"""A mixed release on real nodes: DRA on one node, the device plugin with its default
``deviceListStrategy: envvar`` on the other, ``webhook.keepImageLibraryPath: auto``.

``gpu-a`` is labelled ``ix-gpu.io/gpu.allocation=device-plugin`` and ``gpu-b`` ``=dra`` before the
install; the chart has ``dra.enabled`` and nothing else of DRA or the device plugin changed. The
device plugin's pods find the driver only through the webhook's ``LD_LIBRARY_PATH`` (plain
Allocate runs no CDI hook), so the release renders it as plain ``prepend-path``. A container
served only through a DRA claim keeps its image's value all the same: the webhook decides per
container, and the claim's CDI spec puts the driver in the container's linker cache.

The library-check image (tests/k8s/images/library-check.c) sets ``ENV LD_LIBRARY_PATH=/opt/imglib``
and has a library of its own there. The tests share the release and run in file order; the last
three restart both nodes' kubelets, then their containerds, then kill both
agents at once, under pods holding GPUs on both paths (tests/k8s/node_restarts.py says what they
read and where).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from ix_gpu.node.attribution import ContainerDevices
from tests.k8s.chart_values import real_node_chart_values
from tests.k8s.node_restarts import (
    ContainerView,
    container_view,
    double_allocations,
    holders,
    pod_resources,
    registration_delay,
    shared_chips,
)
from tests.k8s.pods import get_pod, new_namespace, request_ok, wait_running
from tests.k8s.real_nodes import TIER_ROOT, Images, RealNode, container_pids
from tests.k8s.real_release import (
    APP_LIBRARY_PATH,
    NAMESPACE,
    NS_PATH,
    RESOURCE,
    Release,
    image_pod,
    open_release,
)
from tests.k8s.test_real_nodes_dra import (
    ALLOCATION_LABEL,
    CDI_LIBRARY,
    DRIVER,
    IMAGE_LIBRARIES,
    INJECTED,
    RESOURCE_API,
    cdi_specs,
    claim_library_pod,
    claim_template,
    devices,
    image_libraries,
    image_library_pod,
    sleeping_claim_pod,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(900)

RELEASE = "ixm"
LABELS = {"gpu-a": "device-plugin", "gpu-b": "dra"}
DRIVER_LIB = "/usr/local/corex/lib64"
"""Where the webhook's profile mounts the driver in a container, and the directory its variable names."""


def mixed_values(images: Images) -> dict[str, Any]:
    """The real-node values with ``dra.enabled``: the device plugin's strategy and
    ``keepImageLibraryPath`` stay at their defaults (``envvar``, ``auto``)."""
    values = real_node_chart_values(images)
    values["dra"] = {"enabled": True}
    return values


def pod_of(release: Release, namespace: str, name: str) -> dict[str, Any]:
    pod = get_pod(release.api, namespace, name)
    assert pod is not None, name
    return pod


def allocatable(release: Release, node: str) -> int:
    found = request_ok(release.api, "GET", f"/api/v1/nodes/{node}")["status"]["allocatable"]
    return int(found.get(RESOURCE, "0"))


def install_mixed(release: Release) -> None:
    """Label gpu-a for the device plugin and gpu-b for DRA, install the chart, wait until each
    node's allocator offers its chips (and only that one)."""
    release.label_and_install(RELEASE, {n: {ALLOCATION_LABEL: a} for n, a in LABELS.items()})
    wait_until(
        lambda: bool(devices(release, "gpu-b")) and allocatable(release, "gpu-a") > 0,
        "gpu-b's chips in its ResourceSlice and gpu-a's offered by the device plugin",
        120,
        interval=0.5,
    )
    assert not devices(release, "gpu-a") and allocatable(release, "gpu-b") == 0


@pytest.fixture(scope="module")
def release(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, k8s_log_dir: Path
) -> Iterator[Release]:
    for installed in open_release(request, tmp_path_factory, k8s_log_dir / "real-nodes-mixed", mixed_values):
        install_mixed(installed)
        yield installed


def test_the_release_renders_the_library_path_as_plain_prepend_path(release: Release) -> None:
    """What the per-container rule is for: the release's config as the webhook reads it keeps the
    variable's plain mode (its device plugin pods need it) and leaves the claims' policy at its
    default."""
    config_map = request_ok(release.api, "GET", f"{NS_PATH}/configmaps/{RELEASE}-ix-gpu-webhook")
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    modes = [(v["name"], v["mode"]) for p in config["profiles"] for v in p["env"]]
    assert ("LD_LIBRARY_PATH", "prepend-path") in modes, modes
    assert "keepImageLibraryPathInClaims" not in config["policy"], config["policy"]


def test_a_claim_pod_keeps_its_images_library_path_beside_an_envvar_device_plugin(release: Release) -> None:
    """The library-check image in one namespace, once through a claim (gpu-b, DRA) and once with
    ``iluvatar.com/gpu: 1`` (gpu-a, the device plugin's ``envvar``). The claim pod's spec gets no
    ``LD_LIBRARY_PATH``: its image's ``/opt/imglib`` stands, its own library loads through it and
    the driver's through the linker cache. The limit pod's spec gets the profile's variable, which
    replaces the image's: the driver loads from the webhook's mount, the image's library does not
    (the one case the docs name where the image's value is lost)."""
    api = release.api
    image = release.library_check_image
    namespace = f"mixed-{secrets.token_hex(3)}"
    ns = new_namespace(api, namespace)
    request_ok(
        api,
        "POST",
        f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates",
        claim_template("g", None),
    )
    claim = image_libraries(release, ns, image_library_pod("claim", image, "g"))
    limit = image_libraries(release, ns, image_library_pod("limit", image))
    pods = {name: pod_of(release, namespace, name) for name in ("claim", "limit")}
    print(f"\nclaim pod: {json.dumps(claim)}\nlimit pod: {json.dumps(limit)}")

    claim_pod = pods["claim"]
    assert claim_pod["spec"]["nodeName"] == "gpu-b"
    assert claim_pod["metadata"]["annotations"][INJECTED].startswith("iluvatar@"), claim_pod["metadata"]
    main = claim_pod["spec"]["containers"][0]
    assert "env" not in main, main
    assert [m["mountPath"] for m in main["volumeMounts"] if m["name"].startswith("ix-gpu-")] == [
        "/usr/local/corex"
    ]
    assert {k: claim.get(k) for k in IMAGE_LIBRARIES} == IMAGE_LIBRARIES, claim

    limit_pod = pods["limit"]
    assert limit_pod["spec"]["nodeName"] == "gpu-a"
    assert limit_pod["spec"]["containers"][0]["env"] == [{"name": "LD_LIBRARY_PATH", "value": DRIVER_LIB}]
    assert limit["LD_LIBRARY_PATH"] == DRIVER_LIB, limit
    assert limit["driver library"] == f"{DRIVER_LIB}/libixml.so", limit
    assert (
        limit["image library"].startswith("failed")
        and "cannot open shared object file" in limit["image library"]
    )
    request_ok(api, "DELETE", ns)


def test_a_claim_pod_that_sets_its_library_path_gets_the_profiles_merged_in(release: Release) -> None:
    """A claim pod whose spec sets ``LD_LIBRARY_PATH`` gets the profile's directory merged in
    front, once; with or without the variable the driver's library loads."""
    api = release.api
    namespace = f"mixed-lib-{secrets.token_hex(3)}"
    ns = new_namespace(api, namespace)
    request_ok(
        api,
        "POST",
        f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates",
        claim_template("g", None),
    )
    found = image_libraries(release, ns, claim_library_pod("lib", release.image, "g"))
    pod = pod_of(release, namespace, "lib")
    assert pod["spec"]["nodeName"] == "gpu-b"
    assert found["LD_LIBRARY_PATH"] == f"{DRIVER_LIB}:{APP_LIBRARY_PATH}", found
    assert found["ldcache"] == CDI_LIBRARY, found
    assert found["loaded with LD_LIBRARY_PATH"] == f"{DRIVER_LIB}/libixml.so", found
    assert found["loaded without LD_LIBRARY_PATH"] == CDI_LIBRARY, found
    request_ok(api, "DELETE", ns)


# --------------------------------------------------------------------------- restarts
#
# Last in the module: they restart gpu-a's and gpu-b's kubelets and containerds and kill both agents
# under the release above. Each step ends in the same checks (:func:`unchanged_and_not_shared`): every
# pod still running in the very container it started in, seeing the same GPUs, and no device held
# twice in either kubelet's PodResources.

REGISTRATION_S = 2.0
"""The device plugin registers again within this of its kubelet's registration server's start."""


@dataclasses.dataclass
class Busy:
    """The restart tests' pods: ``pods`` maps each to its node, ``views`` to its container's view
    when it first ran (node_restarts.ContainerView)."""

    namespace: str
    boards: int
    """gpu-a's allocatable: the device plugin's devices there."""
    pods: dict[str, str] = dataclasses.field(default_factory=dict)
    views: dict[str, ContainerView] = dataclasses.field(default_factory=dict)


def run_pods(release: Release, busy: Busy, pods: list[tuple[dict[str, Any], str]]) -> None:
    """Create each (pod, node) of ``pods`` in busy's namespace, all at once; wait until each runs
    on its node, record its view."""
    for pod, _ in pods:
        request_ok(release.api, "POST", f"/api/v1/namespaces/{busy.namespace}/pods", pod)
    for pod, node in pods:
        name = pod["metadata"]["name"]
        running = wait_running(release.api, busy.namespace, name, timeout=90)
        assert running["spec"]["nodeName"] == node, (name, running["spec"]["nodeName"])
        busy.pods[name] = node
        busy.views[name] = container_view(running)
        print(f"\n{name} on {node}: {busy.views[name]}")


def gpu_holders(node: str) -> list[str]:
    """The pods holding a device on ``node``, from its PodResources."""
    return sorted({f"{c.namespace}/{c.pod}" for c in pod_resources(node)})


@pytest.fixture(scope="module")
def busy(release: Release) -> Iterator[Busy]:
    """Both nodes busy, one device left free on each for the pods started after the agents come
    back: on gpu-a a sleeping pod of ``iluvatar.com/gpu: 1`` (the device plugin) per device but
    one, on gpu-b a sleeping pod with its own claim (DRA; two chips). The earlier tests' pods are
    gone first (their namespaces are deleted asynchronously), so the free device is known."""
    started = time.monotonic()
    for node in LABELS:
        wait_until(lambda node=node: not gpu_holders(node), f"the earlier tests' pods gone from {node}", 90)
    print(f"\nthe earlier tests' GPU pods gone after {time.monotonic() - started:.1f} s")
    boards = allocatable(release, "gpu-a")
    assert boards >= 2, boards
    found = Busy(namespace=f"restarts-{secrets.token_hex(3)}", boards=boards)
    new_namespace(release.api, found.namespace)
    templates = f"{RESOURCE_API}/namespaces/{found.namespace}/resourceclaimtemplates"
    request_ok(release.api, "POST", templates, claim_template("g", None))
    assert len(devices(release, "gpu-b")) == 2, devices(release, "gpu-b")
    sleeping = [
        (image_pod(f"dp-{i}", release.image, ["sleep", "3600"], gpus=1), "gpu-a") for i in range(boards - 1)
    ]
    run_pods(release, found, [*sleeping, (sleeping_claim_pod("claim-0", release.image, "g"), "gpu-b")])
    yield found
    release.api.request("DELETE", f"/api/v1/namespaces/{found.namespace}")


def listing(node: str, namespace: str, pods: set[str]) -> list[ContainerDevices] | None:
    """``node``'s PodResources once it lists exactly ``pods`` of ``namespace`` as holding devices
    (a kubelet just started lists pods only once it has them from the API server again)."""
    try:
        found = pod_resources(node)
    except grpc.RpcError:
        return None
    return found if {c.pod for c in found if c.namespace == namespace} == pods else None


def unchanged_and_not_shared(release: Release, busy: Busy, step: str) -> None:
    """After ``step``: every pod of ``busy`` runs in the container it started in (same ID, no
    restart, same first process) with the same GPUs, device cgroup, GPU environment and driver
    mounts; no two pods of a node reach the same chip; each node's kubelet lists every one of
    them in PodResources, and no device there has two holders."""
    now = {}
    for name in busy.pods:
        pod = pod_of(release, busy.namespace, name)
        assert pod["status"]["phase"] == "Running", (step, name, pod["status"])
        now[name] = container_view(pod)
        assert now[name] == busy.views[name], (step, name, busy.views[name], now[name])
    for node in LABELS:
        on_node = {name: view for name, view in now.items() if busy.pods[name] == node}
        assert not shared_chips(on_node), (step, node, shared_chips(on_node))
        found = wait_until(
            lambda node=node, on_node=on_node: listing(node, busy.namespace, set(on_node)),
            f"{step}: {node}'s PodResources listing {sorted(on_node)} with their devices",
            30,
            interval=0.2,
            details=lambda node=node: str(pod_resources(node)),
        )
        assert not double_allocations(found), (step, node, double_allocations(found))
        held = {device: sorted(who) for device, who in holders(found).items()}
        print(f"\n{step}: {node}'s PodResources: {held}")


def test_a_kubelet_restart_keeps_the_pods_and_their_gpus_and_the_plugin_registers_within_2_s(
    release: Release, busy: Busy
) -> None:
    """Both kubelets restarted (SIGTERM, then the same command line). The device plugin on gpu-a
    notices the new registration socket (the kubelet deleted the plugin's own) and registers
    within ``REGISTRATION_S`` of the kubelet's registration server starting, both read from the
    kubelet's own log; allocatable comes back. Running pods keep their containers and GPUs: the
    kubelet's device-manager and DRA checkpoints hold their allocations, and nothing admits them
    again with other devices."""
    unchanged_and_not_shared(release, busy, "before the restarts")
    nodes = {name: release.node(name) for name in LABELS}
    offsets = {name: node.kubelet.log.stat().st_size for name, node in nodes.items() if node.kubelet}
    year = datetime.datetime.now().year
    started = time.monotonic()
    for node in nodes.values():
        node.restart_kubelet()
    restarted = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=1)
    kubelet_a = nodes["gpu-a"].kubelet
    assert kubelet_a is not None

    def since_restart() -> str:
        with kubelet_a.log.open("rb") as log:
            log.seek(offsets["gpu-a"])
            return log.read().decode(errors="replace")

    delay, server_started = wait_until(
        lambda: registration_delay(since_restart(), RESOURCE, year),
        "the device plugin's Register in gpu-a's restarted kubelet's log",
        60,
        interval=0.1,
        process=kubelet_a,
        details=lambda: since_restart()[-3000:],
    )
    for node in nodes.values():
        wait_until(lambda node=node: heartbeat_after(node, restarted), f"{node.name} Ready again", 60)
    wait_until(
        lambda: allocatable(release, "gpu-a") == busy.boards, "gpu-a's allocatable back", 30, interval=0.1
    )
    print(
        f"\nkubelet restart: the device plugin registered {delay:.3f} s after gpu-a's kubelet's "
        f"registration server started ({server_started:%H:%M:%S.%f}); both restarted kubelets posted "
        f"Ready, and gpu-a's allocatable was back, {time.monotonic() - started:.1f} s after the "
        "restarts began"
    )
    assert delay <= REGISTRATION_S, f"re-registered {delay:.3f} s after the kubelet's return"
    unchanged_and_not_shared(release, busy, "after the kubelet restarts")


def tasks(node: RealNode) -> dict[str, str]:
    """The node's containerd's tasks: container ID → ``<pid> <status>``."""
    rows = node.ctr("tasks", "ls").splitlines()[1:]
    return {
        fields[0]: f"{fields[1]} {fields[2]}" for fields in (row.split() for row in rows) if len(fields) >= 3
    }


def heartbeat_after(node: RealNode, moment: datetime.datetime) -> bool:
    """Whether ``node``'s kubelet has posted its Ready condition (it checks its runtime for it)
    later than ``moment`` (UTC)."""
    for condition in (node.node() or {}).get("status", {}).get("conditions", []):
        if condition["type"] == "Ready" and condition["status"] == "True":
            beat = datetime.datetime.fromisoformat(condition["lastHeartbeatTime"].replace("Z", "+00:00"))
            return beat > moment
    return False


def test_a_containerd_restart_keeps_every_pod_in_its_container_with_its_gpus(
    release: Release, busy: Busy
) -> None:
    """Both containerds restarted (SIGTERM; the new one started in the node's mount namespace,
    which the kubelet and the shims share). The shims outlive containerd: the new one lists every
    pod's container as a running task with the same process, and the kubelet, once it has posted
    its node status a second past the restart (it asks the runtime, and relists the pods every
    second), restarts no container."""
    nodes = {name: release.node(name) for name in LABELS}
    started = time.monotonic()
    for node in nodes.values():
        node.restart_containerd()
    back = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=1)
    print(f"\ncontainerd restart: both serving again {time.monotonic() - started:.1f} s after the first stop")
    for name, node in nodes.items():
        running = tasks(node)
        for pod, view in busy.views.items():
            if busy.pods[pod] == name:
                task = running.get(view.container_id.split("://", 1)[1])
                assert task == f"{view.first_pid} RUNNING", (pod, task, running)
    for node in nodes.values():
        wait_until(lambda node=node: heartbeat_after(node, back), f"{node.name}'s status posted again", 30)
    print(f"containerd restart: both kubelets posted their status {time.monotonic() - started:.1f} s after")
    unchanged_and_not_shared(release, busy, "after the containerd restarts")


def claim_uid(release: Release, namespace: str, pod: str) -> tuple[str, str]:
    """The name and UID of ``pod``'s one ResourceClaim."""
    (status,) = pod_of(release, namespace, pod)["status"]["resourceClaimStatuses"]
    path = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{status['resourceClaimName']}"
    return status["resourceClaimName"], request_ok(release.api, "GET", path)["metadata"]["uid"]


def agent_pod(release: Release, component: str, node: str) -> dict[str, Any]:
    (pod,) = [p for p in release.pods(component) if p["spec"]["nodeName"] == node]
    return pod


def test_both_agents_killed_at_once_come_back_and_hand_out_only_the_free_devices(
    release: Release, busy: Busy
) -> None:
    """The device plugin's process on gpu-a and the DRA plugin's on gpu-b SIGKILLed together: no
    farewell, no cleanup. The kubelets start both containers again. The device plugin registers
    (its pod turns ready) and a new one-GPU pod on gpu-a gets the one free board, not one a
    running pod holds. The new DRA plugin registers; a new claim pod on gpu-b gets the free chip,
    which it prepares, keeping the claim from before in the checkpoint it read at its start (one
    that started empty would write it out of the file); then the pod from before ends and the new
    plugin unprepares that claim, which only the killed instance prepared and only the checkpoint
    tells of: it names the claim, and the claim's CDI spec and checkpoint entry go. The running
    pods keep their containers and GPUs throughout."""
    agents = {"gpu-a": "device-plugin", "gpu-b": "dra-plugin"}
    before = {node: agent_pod(release, component, node) for node, component in agents.items()}
    claim_name, uid = claim_uid(release, busy.namespace, "claim-0")
    (spec_file,) = [p for p in cdi_specs("gpu-b") if p.name == f"iluvatar.com-gpu-claim-{uid}.json"]
    checkpoint = TIER_ROOT / "gpu-b" / "kubelet" / "plugins" / DRIVER / "checkpoint.json"
    assert uid in checkpoint.read_text()
    pids = [container_pids(pod, agents[node])[0] for node, pod in before.items()]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()

    def back(node: str) -> bool:
        pod = agent_pod(release, agents[node], node)
        (status,) = pod["status"].get("containerStatuses") or [{}]
        restarted = (
            status.get("restartCount", 0) > before[node]["status"]["containerStatuses"][0]["restartCount"]
        )
        return restarted and bool(status.get("ready"))

    wait_until(
        lambda: back("gpu-a"), "gpu-a's device plugin restarted and registered (ready)", 90, interval=0.2
    )
    plugin_back = time.monotonic() - killed
    dra = before["gpu-b"]["metadata"]["name"]
    wait_until(
        lambda: back("gpu-b") and "registered with the kubelet" in release.log(NAMESPACE, dra),
        "gpu-b's DRA plugin restarted and registered",
        90,
        interval=0.2,
    )
    dra_back = time.monotonic() - killed
    print(f"\nagents killed: device plugin ready {plugin_back:.1f} s, DRA plugin registered {dra_back:.1f} s")
    assert spec_file.exists(), "a killed plugin's claim must stay prepared"
    after = image_pod("dp-after", release.image, ["sleep", "3600"], gpus=1)
    run_pods(release, busy, [(after, "gpu-a"), (sleeping_claim_pod("claim-1", release.image, "g"), "gpu-b")])
    unchanged_and_not_shared(release, busy, "after both agents were killed")
    # The new instance wrote claim-1 into the checkpoint it read at its start: claim-0 is kept.
    new_uid = claim_uid(release, busy.namespace, "claim-1")[1]
    assert uid in checkpoint.read_text() and new_uid in checkpoint.read_text(), checkpoint.read_text()

    request_ok(release.api, "DELETE", f"/api/v1/namespaces/{busy.namespace}/pods/claim-0")
    wait_until(lambda: not spec_file.exists(), "claim-0's CDI spec removed by the new plugin's unprepare", 60)
    wait_until(lambda: uid not in checkpoint.read_text(), "claim-0's claim gone from the checkpoint", 30)
    # It unprepared a claim it knew from the checkpoint alone (the log names only a known claim).
    assert f"unprepared claim {busy.namespace}/{claim_name} ({uid})" in release.log(NAMESPACE, dra)
    wait_until(lambda: get_pod(release.api, busy.namespace, "claim-0") is None, "claim-0 gone", 60)
    del busy.pods["claim-0"], busy.views["claim-0"]
    unchanged_and_not_shared(release, busy, "after claim-0 ended")
