"""The chart as a user installs it, on real nodes: the project's image built from its Dockerfile,
real containers (containerd and runc), CNI pod networking and kube-proxy (tests/k8s/real_nodes.py).

One cluster for the module (``MiniCluster(runtime="containerd")``, Kubernetes v1.37.2): ``gpu-a``
with two BI-V150 boards of two chips, ``gpu-b`` with two single-chip BI-V100 boards, each GPU a
real character device and the driver root holding the stub libixml. The chart's DaemonSet runs
the plugin's ``ixml`` backend inside the image: it loads libixml from the driver root it mounts.

``helm install`` gets the values that adapt the chart to this cluster, which a real cluster needs
too, and the scenario's own choices; nothing else (``chart_values.real_node_chart_values``):

- ``image.repository``/``image.tag``: the image built here (no registry), as a user names theirs;
- ``plugin.driver.root`` and the Iluvatar profile's driver ``hostPath``: where this cluster's
  nodes have the driver (a real node's could be /usr/local/corex, the default);
- ``plugin.config``: the Iluvatar plugin's ConfigMap from its README (splitboard false,
  replicas 4: 8 GPUs a node); ``config``: the built-in Iluvatar profile beside the tf-operator
  discussion's NVIDIA profile and its privileged namespace ``ml-team``.

The module starts from a fresh machine's host settings (``ip_forward`` off, whatever this machine
has): the tier turns on what it needs for its run, and the fixture checks that every setting is
back afterwards (tests/k8s/host_settings.py).

The tests share the release and run in file order.
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.k8s import host_settings, training_operator
from tests.k8s.chart_values import real_node_chart_values
from tests.k8s.crds import install_crd, kubeflow_tfjob_crd
from tests.k8s.pods import (
    get_pod,
    new_namespace,
    request_ok,
    scheduling_failure,
    wait_ended,
    wait_running,
)
from tests.k8s.real_nodes import REAL_NODES, container_cgroup, container_pids
from tests.k8s.real_release import (
    APP_LIBRARY_PATH,
    NAMESPACE,
    NS_PATH,
    RESOURCE,
    Release,
    chip_holders,
    device_check,
    image_pod,
    library_check_lines,
    library_pod,
    open_release,
)
from tests.support.compiled import compiled_sources, module_name
from tests.support.paths import EXAMPLES, ROOT, load_yaml
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(1500)

RELEASE = "ixr"
WEBHOOK = f"{RELEASE}-ix-gpu-webhook"
MWC = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{RELEASE}-ix-gpu"
INJECTED = "ix-gpu.io/injected"

# Counts the image's pyc files that Python would not use: a timestamp pyc whose recorded source
# mtime or size no longer matches, or a module with no pyc at all. (Double quotes only: it runs
# inside `sh -c '...'`.)
STALE_BYTECODE = """
import glob, os, struct
stale = missing = 0
for source in glob.glob("/opt/ix-gpu/lib/python3.11/site-packages/**/*.py", recursive=True):
    folder, name = os.path.split(source)
    pyc = os.path.join(folder, "__pycache__", name[:-3] + ".cpython-311.pyc")
    if not os.path.exists(pyc):
        missing += 1
        continue
    with open(pyc, "rb") as f:
        flags, mtime, size = struct.unpack("<III", f.read(16)[4:])
    st = os.stat(source)
    stale += flags == 0 and (mtime, size) != (int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF)
print(f"bytecode: {stale} stale, {missing} missing")
"""


def _native_probe() -> str:
    """Python that prints how many of the modules the native build compiles load compiled (double
    quotes only: it goes inside a single-quoted shell word)."""
    names = json.dumps([module_name(source) for source in compiled_sources()])
    return (
        f"import importlib; names = {names}; "
        'n = sum(importlib.import_module(m).__file__.endswith(".so") for m in names); '
        'print("native:", n, "of", len(names))'
    )


@pytest.fixture(scope="module")
def release(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, k8s_log_dir: Path
) -> Iterator[Release]:
    yield from open_release(
        request,
        tmp_path_factory,
        k8s_log_dir / "real-nodes",
        lambda images: real_node_chart_values(images, scenario=True),
        from_a_fresh_machine=True,
    )


# --------------------------------------------------------------------------- the host


def test_the_tier_turned_on_the_host_settings_it_needs_for_its_run(release: Release) -> None:
    """The cluster came up from ip_forward = 0 (the fixture set a fresh machine's value): the tier
    turned it on and recorded the value to put back, which the fixture checks at the module's end."""
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "1"
    recorded = json.loads(host_settings.STATE_FILE.read_text())["sysctls"]
    assert recorded["net.ipv4.ip_forward"] == "0", recorded
    for setting in host_settings.SYSCTLS:
        assert setting.satisfied_by(setting.path.read_text()), setting.key


# --------------------------------------------------------------------------- the image


def test_the_image_as_a_user_checks_it(release: Release) -> None:
    """The image the chart runs, built from the Dockerfile unchanged, checked in a real container
    before anything is installed: its version, a non-root user, no compiler, no pip."""
    node = release.node("gpu-a")
    script = (
        "ix-gpu --version; id -u; id -g; "
        "for t in gcc cc pip pip3; do command -v $t && echo found $t; done; "
        "ls -d /root/.cache /home/*/.cache 2>/dev/null && echo found cache; "
        "python -c 'import pip' 2>/dev/null && echo found pip-module; "
        "python -c 'import setuptools' 2>/dev/null && echo found setuptools; "
        "du -sk /opt/ix-gpu; "
        "cd /opt/ix-gpu/lib/python3.11/site-packages && du -sk * | sort -n | tail -5; "
        f"python -c '{STALE_BYTECODE}'; "
        f"python -c '{_native_probe()}'"
    )
    out = node.run_in_image(release.image, ["sh", "-c", script])
    print(f"\n{release.image}:\n{out}")
    lines = out.splitlines()
    assert lines[0] == "ix-gpu 0.1.0", out
    assert lines[1:3] == ["10001", "10001"], out
    assert not [line for line in lines if line.startswith("found")], out
    # Every process in the image imports from bytecode it ships: a stale pyc is recompiled at each
    # start, which doubles a start's memory peak (the kubernetes client's core_v1_api alone).
    assert "bytecode: 0 stale, 0 missing" in out, out
    # The webhook's request path as the Dockerfile builds it: compiled by mypyc, every listed module.
    compiled = len(compiled_sources())
    assert f"native: {compiled} of {compiled}" in out, out
    print(f"image size (compressed layers, as containerd lists it): {node.image_size(release.image)}")


# --------------------------------------------------------------------------- install


def test_helm_install_with_a_users_values_runs_the_plugin_with_ixml_and_the_webhook(release: Release) -> None:
    chart = str(ROOT / "charts" / "ix-gpu")
    started = time.monotonic()
    result = release.helm(
        "install",
        RELEASE,
        chart,
        "--create-namespace",
        "-f",
        str(release.values_file()),
        "--wait",
        "--timeout",
        "5m",
    )
    assert result.returncode == 0, result.stderr + "\n" + str(release.pods("device-plugin"))
    print(f"helm install --wait: {time.monotonic() - started:.1f}s")
    api = release.api
    plugins = release.pods("device-plugin")
    assert sorted(p["spec"]["nodeName"] for p in plugins) == ["gpu-a", "gpu-b"]
    for pod in plugins:
        log = release.log(NAMESPACE, pod["metadata"]["name"])
        assert '"backend": "ixml"' in log or "backend=ixml" in log or "ixml" in log, log[-2000:]
        assert "registered iluvatar.com/gpu with the kubelet" in log, log[-2000:]
    for node, product, count in (("gpu-a", "BI-V150", 8), ("gpu-b", "BI-V100", 8)):
        wait_until(
            lambda node=node, count=count: (release.cluster.node_resource(node) or (0, 0)) == (count, count),
            f"{count} {RESOURCE} on {node}",
            60,
            interval=0.5,
        )
        labels = (release.node(node).node() or {})["metadata"]["labels"]
        assert labels.get("ix-gpu.io/gpu.product") == product, labels
    webhooks = release.pods("webhook")
    assert len(webhooks) == 2 and all(
        p["status"].get("podIP", "").startswith("198.51.100.") for p in webhooks
    )
    assert not any(p["spec"].get("hostNetwork") for p in webhooks)
    secret = request_ok(api, "GET", f"{NS_PATH}/secrets/{WEBHOOK}-tls")
    mwc = request_ok(api, "GET", MWC)
    assert {w["clientConfig"]["caBundle"] for w in mwc["webhooks"]} == {secret["data"]["ca-bundle.crt"]}
    assert all("service" in w["clientConfig"] for w in mwc["webhooks"])


def test_the_plugins_token_may_change_only_its_own_nodes_published_labels(release: Release) -> None:
    """The chart's node ValidatingAdmissionPolicy, with a token of the device plugin's
    ServiceAccount bound to its pod on gpu-a (naming gpu-a, as the pod's projected token does): the
    plugin's own label writes went through (the install test saw the labels), and this token is
    refused another node, another label, an annotation, an ownerReference (to a missing owner, which
    would have the garbage collector delete the node), a finalizer, other metadata, a taint, the
    status, and deleting the node."""
    api = release.api
    token = release.pod_token("device-plugin", "gpu-a")

    def patch(node: str, change: dict[str, Any], subresource: str = "") -> tuple[int, Any]:
        path = f"/api/v1/nodes/{node}{subresource}"
        return api.request("PATCH", path, change, token=token, content_type="application/merge-patch+json")

    missing = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "gone",
        "uid": "00000000-0000-0000-0000-000000000000",
    }
    condition = {"type": "Ready", "status": "False", "reason": "Spoofed", "lastHeartbeatTime": None}

    count = request_ok(api, "GET", "/api/v1/nodes/gpu-a")["metadata"]["labels"]["ix-gpu.io/gpu.count"]
    status, reply = patch("gpu-a", {"metadata": {"labels": {"ix-gpu.io/gpu.count": count}}})
    assert status == 200, reply
    refused = {
        "another node": patch("gpu-b", {"metadata": {"labels": {"ix-gpu.io/gpu.count": "1"}}}),
        "another label": patch("gpu-a", {"metadata": {"labels": {"ix-gpu.io/gpu.allocation": "dra"}}}),
        "an annotation": patch("gpu-a", {"metadata": {"annotations": {"x": "y"}}}),
        "a taint": patch("gpu-a", {"spec": {"taints": [{"key": "k", "effect": "NoExecute"}]}}),
        "an ownerReference": patch("gpu-a", {"metadata": {"ownerReferences": [missing]}}),
        "a finalizer": patch("gpu-a", {"metadata": {"finalizers": ["ix-gpu.io/hold"]}}),
        "other metadata": patch("gpu-a", {"metadata": {"generateName": "gpu-"}}),
        "the status": patch("gpu-a", {"status": {"conditions": [condition]}}, "/status"),
        "deleting it": api.request("DELETE", "/api/v1/nodes/gpu-a", token=token),
    }
    print("\n" + "\n".join(f"{what}: {status} {str(r)[:200]}" for what, (status, r) in refused.items()))
    for what, (status, reply) in refused.items():
        assert status in (403, 422), (what, status, reply)
    assert "may change only that node" in str(refused["another node"][1])
    assert "ownerReferences, finalizers or other metadata" in str(refused["an ownerReference"][1])
    # Through the node itself, the apiserver drops a status change before any admission sees it.
    print("the status, through the node:", patch("gpu-a", {"status": {"capacity": {"ix-gpu.io/x": "1"}}})[0])
    node = request_ok(api, "GET", "/api/v1/nodes/gpu-a")
    assert not node["metadata"].get("ownerReferences") and not node["metadata"].get("finalizers")
    assert "ix-gpu.io/x" not in node["status"]["capacity"]


def test_webhook_pods_run_as_non_root_read_only_with_their_memory_limit_and_pass_probes(
    release: Release,
) -> None:
    for pod in release.pods("webhook"):
        conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert conditions.get("Ready") == "True", pod["status"]  # readiness over pod networking
        (status,) = pod["status"]["containerStatuses"]
        assert status["restartCount"] == 0, status
        limit = container_cgroup(pod, "webhook", "memory") / "memory.limit_in_bytes"
        assert int(limit.read_text()) == 256 * 2**20, limit
        pid = container_pids(pod, "webhook")[0]
        uids = [
            line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:")
        ]
        assert uids[0].split()[1:] == ["10001"] * 4, uids
        root = [line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()]
        (root_mount,) = [m for m in root if m[4] == "/"]
        assert root_mount[5].split(",")[0] == "ro", root_mount


def test_the_seed_pod_sees_only_its_devices_and_the_driver_root_read_only(release: Release) -> None:
    api = release.api
    namespace = f"corex-{secrets.token_hex(3)}"
    ns = new_namespace(api, namespace)
    corex = load_yaml(EXAMPLES / "gpu-pod.yaml")  # the seed's pod as the user wrote it
    container = corex["spec"]["containers"][0]
    # Its image and command replaced by ours; root, so it may try mknod (the device cgroup decides).
    container.update(image=release.image, command=["python3", "-c", device_check()], args=[])
    container["securityContext"] = {"runAsUser": 0}
    corex["spec"]["terminationGracePeriodSeconds"] = 1
    request_ok(api, "POST", f"{ns}/pods", corex)
    running = wait_running(api, namespace, "corex-example", timeout=120)
    assert running["metadata"]["annotations"][INJECTED].startswith("iluvatar@")
    wait_until(
        lambda: "done" in release.log(namespace, "corex-example").splitlines(),
        "the check's output",
        60,
        details=lambda: (
            release.log(namespace, "corex-example") + str(get_pod(api, namespace, "corex-example"))[-2000:]
        ),
    )
    log = release.log(namespace, "corex-example")
    print(f"\nkubectl logs corex-example:\n{log}")
    lines = log.splitlines()
    # splitboard false: the device is a board, so the container gets every chip of one board.
    (spec,) = [s for s in REAL_NODES if s.name == running["spec"]["nodeName"]]
    per_board = spec.chips_per_board
    boards = [[f"/dev/iluvatar{b * per_board + c}" for c in range(per_board)] for b in range(spec.boards)]
    given = lines[0].removeprefix("given: ").split()
    assert given in boards, (spec.name, log)
    assert [f"opened: {path}" for path in given] == lines[1 : 1 + len(given)], log
    refused = [line for line in lines if line.startswith("other:")]
    assert refused and refused[0].startswith("other: refused") and refused[0].endswith(" 1"), log  # EPERM
    assert "driver root: read-only 30" in lines, log  # EROFS
    assert "driver root: fake-ixml-devices lib64" in lines, log
    assert "LD_LIBRARY_PATH=/usr/local/corex/lib64" in lines, log
    request_ok(api, "DELETE", ns)


def test_a_device_plugin_pod_without_cdi_keeps_its_library_path(release: Release) -> None:
    """Allocate without CDI sets no LD_LIBRARY_PATH: the container has the pod's own value with
    the profile's directory merged in front, each once, and the driver's library loads from the
    webhook's mount. No CDI spec, so nothing is added to the linker cache."""
    api = release.api
    namespace = f"lib-{secrets.token_hex(3)}"
    ns = new_namespace(api, namespace)
    request_ok(api, "POST", f"{ns}/pods", library_pod("lib", release.image, gpus=1))
    pod = wait_running(api, namespace, "lib", timeout=120)
    assert pod["metadata"]["annotations"][INJECTED].startswith("iluvatar@")
    found = library_check_lines(release, namespace, "lib")
    assert found["LD_LIBRARY_PATH"] == f"/usr/local/corex/lib64:{APP_LIBRARY_PATH}", found
    assert found["loaded with LD_LIBRARY_PATH"] == "/usr/local/corex/lib64/libixml.so", found
    assert found["ldcache"] == "", found
    assert found["loaded without LD_LIBRARY_PATH"].startswith("failed"), found
    # The node's device plugin names the pod as the holder of its board's chips on /metrics, read
    # from the real kubelet's PodResources API.
    node = pod["spec"]["nodeName"]
    wait_until(
        lambda: [h for h in chip_holders(release, node) if h["namespace"] == namespace],
        "the pod on its chips in the plugin's /metrics",
        45,
        details=lambda: str(chip_holders(release, node)),
    )
    held = [h for h in chip_holders(release, node) if h["namespace"] == namespace]
    print(f"\nix_gpu_chip_allocation: {held}")
    (spec,) = [s for s in REAL_NODES if s.name == node]
    assert len(held) == spec.chips_per_board, held  # splitboard false: a board, each chip once
    assert {(h["pod"], h["container"], h["claim"]) for h in held} == {("lib", "main", "")}
    assert len({h["board"] for h in held}) == 1 and all(h["node"] == node for h in held)
    request_ok(api, "DELETE", ns)


def test_gpu_type_schedules_onto_its_node_and_a_full_node_leaves_the_ninth_pending(release: Release) -> None:
    api = release.api
    namespace = f"fill-{secrets.token_hex(3)}"
    ns = new_namespace(api, namespace)
    v100 = image_pod("v100", release.image, ["sleep", "3600"], gpus=1)
    v100["metadata"]["annotations"] = {"ix-gpu.io/gpu-type": "BI-V100"}
    request_ok(api, "POST", f"{ns}/pods", v100)
    assert wait_running(api, namespace, "v100", timeout=120)["spec"]["nodeName"] == "gpu-b"
    names = [f"holder-{i}" for i in range(8)]
    for name in names:
        pod = image_pod(
            name, release.image, ["sleep", "3600"], gpus=1, nodeSelector={"kubernetes.io/hostname": "gpu-a"}
        )
        request_ok(api, "POST", f"{ns}/pods", pod)
    for name in names:
        wait_running(api, namespace, name, timeout=180)
    on_gpu_a = {"kubernetes.io/hostname": "gpu-a"}
    request_ok(
        api,
        "POST",
        f"{ns}/pods",
        image_pod("ninth", release.image, ["sleep", "3600"], 1, nodeSelector=on_gpu_a),
    )
    event = scheduling_failure(api, namespace, "ninth")
    assert "Insufficient iluvatar.com/gpu" in event["message"], event
    ninth = get_pod(api, namespace, "ninth")
    assert ninth is not None and ninth["status"]["phase"] == "Pending"
    # Each of gpu-a's two boards handed out exactly four times (replicas 4).
    boards: collections.Counter[str] = collections.Counter()
    for name in names:
        pod = get_pod(api, namespace, name)
        assert pod is not None
        devices = container_cgroup(pod, "main", "devices") / "devices.list"
        boards[
            " ".join(sorted(line for line in devices.read_text().splitlines() if line.startswith("c 10:")))
        ] += 1
    assert sorted(boards.values()) == [4, 4], boards
    request_ok(api, "DELETE", ns)


def test_privileged_only_in_the_allowlisted_namespace(release: Release) -> None:
    api = release.api
    results = {}
    for namespace in ("ml-team", f"other-{secrets.token_hex(3)}"):
        new_namespace(api, namespace)
        pod = image_pod("trainer", release.image, ["sleep", "3600"])
        pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
        status, created = api.request("POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", pod)
        assert status == 201, created
        results[namespace] = created["spec"]["containers"][0].get("securityContext", {}).get("privileged")
        if namespace != "ml-team":  # the TFJob test below runs there
            request_ok(api, "DELETE", f"/api/v1/namespaces/{namespace}")
    assert list(results.values()) == [True, None], results


def test_a_tfjob_with_one_gpu_worker_runs_injected_and_privileged_in_the_allowlisted_namespace(
    release: Release,
) -> None:
    """The TFJob example for real: the training operator creates the worker pod from the template
    the webhook already mutated; the pod's own admission then finds everything in place."""
    api = release.api
    assert release.cluster.real_nodes is not None and release.cluster.real_nodes.images is not None
    group_version = install_crd(api, kubeflow_tfjob_crd())
    training_operator.install(api, release.cluster.real_nodes.images.training_operator_ref)
    namespace = "ml-team"
    if api.request("GET", f"/api/v1/namespaces/{namespace}")[0] != 200:
        new_namespace(api, namespace)
    worker = {
        "name": "tensorflow",
        "image": release.image,
        "command": ["sh", "-c", "echo LD_LIBRARY_PATH=$LD_LIBRARY_PATH; ls /dev/iluvatar*; sleep 3600"],
        "resources": {"limits": {RESOURCE: "1"}},
    }
    template = {"spec": {"containers": [worker], "terminationGracePeriodSeconds": 1}}
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "mnist"},
        "spec": {
            "tfReplicaSpecs": {"Worker": {"replicas": 1, "restartPolicy": "Never", "template": template}}
        },
    }
    stored = request_ok(api, "POST", f"{group_version}/namespaces/{namespace}/tfjobs", job)
    stored_container = stored["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert stored_container["securityContext"]["privileged"] is True, stored_container
    pod = wait_running(api, namespace, "mnist-worker-0", timeout=180)
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("TFJob", "mnist"), owner
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"]["privileged"] is True
    names = [v["name"] for v in pod["spec"]["volumes"]]
    assert len(names) == len(set(names)), names
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    assert len(mounts) == len(set(mounts)) and "/usr/local/corex" in mounts, mounts
    env = [e for e in container.get("env") or [] if e["name"] == "LD_LIBRARY_PATH"]
    assert env == [{"name": "LD_LIBRARY_PATH", "value": "/usr/local/corex/lib64"}], env
    wait_until(lambda: "/dev/iluvatar" in release.log(namespace, "mnist-worker-0"), "the worker's output", 60)
    print(f"\nkubectl logs mnist-worker-0:\n{release.log(namespace, 'mnist-worker-0')}")
    request_ok(api, "DELETE", f"{group_version}/namespaces/{namespace}/tfjobs/mnist")


def test_a_webhook_container_killed_is_replaced_and_no_gpu_pod_is_admitted_unmutated(
    release: Release,
) -> None:
    api = release.api
    namespace = f"kill-{secrets.token_hex(3)}"
    ns = new_namespace(api, namespace)
    victims = release.pods("webhook")
    for pod in victims:  # both replicas: until one is back, the apiserver has nowhere to send reviews
        pid = container_pids(pod, "webhook")[0]
        os.kill(pid, 9)  # the container's first process: what `kill -9 1` inside it would hit
    refused: list[str] = []
    admitted = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status, reply = api.request(
            "POST", f"{ns}/pods?dryRun=All", image_pod("p", release.image, ["true"], gpus=1)
        )
        if status == 201:
            assert reply["metadata"]["annotations"][INJECTED].startswith("iluvatar@"), reply
            admitted += 1
            if admitted >= 20:
                break
        else:
            assert "failed calling webhook" in reply.get("message", ""), reply
            refused.append(reply["message"])
        time.sleep(0.05)
    print(f"\nafter kill -9 of both replicas: {len(refused)} refused, then {admitted} admitted mutated")
    if refused:
        print(f"  e.g. {refused[0]}")
    assert admitted >= 20
    restarted = wait_until(
        lambda: [
            p for p in release.pods("webhook") if p["status"]["containerStatuses"][0]["restartCount"] >= 1
        ],
        "both webhook containers restarted",
        60,
    )
    assert len(restarted) == 2
    request_ok(api, "DELETE", ns)


PLUGIN_DAEMONSET = f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{RELEASE}-ix-gpu-plugin"


def gpu_pod_outcome(release: Release, namespace: str, name: str) -> str:
    """Create a one-GPU pod on gpu-a that exits at once; its end (``Succeeded``, or ``Failed`` with
    the kubelet's reason); the pod is deleted again."""
    on_a = {"kubernetes.io/hostname": "gpu-a"}
    pod = image_pod(name, release.image, ["true"], gpus=1, nodeSelector=on_a)
    pod["spec"]["restartPolicy"] = "Never"
    request_ok(release.api, "POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    ended = wait_ended(release.api, namespace, name, 60)
    request_ok(release.api, "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
    return " ".join(filter(None, [ended["status"]["phase"], ended["status"].get("reason")]))


def plugin_rolled(release: Release, before: set[str], nodes: int) -> bool:
    """The DaemonSet has rolled: every node's pod is a new one, available, and no old one is left."""
    daemonset = request_ok(release.api, "GET", PLUGIN_DAEMONSET)
    status = daemonset["status"]
    pods = {p["metadata"]["uid"] for p in release.pods("device-plugin")}
    return (
        status.get("observedGeneration") == daemonset["metadata"]["generation"]
        and status.get("updatedNumberScheduled") == status.get("numberAvailable") == nodes
        and len(pods - before) == nodes
        and not pods & before
    )


def test_the_device_plugin_rolls_without_a_node_offering_fewer_gpus_or_refusing_a_pod(
    release: Release,
) -> None:
    """The chart's device plugin DaemonSet rolled (a template change, as an upgrade makes) while GPU
    pods are created on gpu-a one after another: the new pod on each node serves beside the old one
    and is ready before the old one goes (maxSurge 1, maxUnavailable 0, /readyz), and the old one
    leaves without its all-Unhealthy farewell. Every pod created meanwhile runs (none refused by the
    kubelet, UnexpectedAdmissionError), and no node's allocatable, read from its Node between pods,
    drops."""
    full = {node: release.cluster.node_resource(node) for node in ("gpu-a", "gpu-b")}
    before = {p["metadata"]["uid"] for p in release.pods("device-plugin")}
    namespace = f"roll-{secrets.token_hex(3)}"
    ns = new_namespace(release.api, namespace)
    roll = {"ix-gpu.io/test-roll": secrets.token_hex(4)}
    patch = {"spec": {"template": {"metadata": {"annotations": roll}}}}
    status, reply = release.api.request(
        "PATCH", PLUGIN_DAEMONSET, patch, content_type="application/merge-patch+json"
    )
    assert status == 200, reply
    seen: list[dict[str, tuple[int, int] | None]] = []
    outcomes: list[str] = []

    def rolled() -> bool:
        seen.append({node: release.cluster.node_resource(node) for node in full})
        outcomes.append(gpu_pod_outcome(release, namespace, f"p{len(outcomes)}"))
        return plugin_rolled(release, before, len(full))

    wait_until(rolled, "the device plugin's rollout", 300, interval=0.1, details=lambda: str(outcomes))
    print(
        f"during the roll: {collections.Counter(outcomes)}; allocatable {full} at each of {len(seen)} reads"
    )
    assert all(reading == full for reading in seen), (full, seen)
    assert set(outcomes) == {"Succeeded"}, outcomes
    request_ok(release.api, "DELETE", ns)


def test_helm_upgrade_reloads_then_helm_test_then_uninstall_leaves_nothing(release: Release) -> None:
    api = release.api
    before = {p["metadata"]["uid"] for p in release.pods("webhook")}
    release.values["config"]["profiles"][0]["env"].append({"name": "IX_GPU_RELEASE", "value": "upgraded"})
    chart = str(ROOT / "charts" / "ix-gpu")
    result = release.helm("upgrade", RELEASE, chart, "-f", str(release.values_file()))
    assert result.returncode == 0, result.stderr
    namespace = f"upgrade-{secrets.token_hex(3)}"
    ns = new_namespace(api, namespace)

    def upgraded() -> bool:
        status, created = api.request(
            "POST", f"{ns}/pods?dryRun=All", image_pod("u", release.image, ["true"], gpus=1)
        )
        assert status == 201, created
        env = {e["name"]: e.get("value") for e in created["spec"]["containers"][0].get("env") or []}
        return env.get("IX_GPU_RELEASE") == "upgraded"

    wait_until(upgraded, "the upgraded config served", 120, interval=1)
    assert {p["metadata"]["uid"] for p in release.pods("webhook")} == before, "reloaded in place"
    request_ok(api, "DELETE", ns)

    result = release.helm("test", RELEASE, "--timeout", "180s", "--logs")
    if result.returncode != 0:  # what the test pod went through (helm keeps a failed one)
        check = f"{NS_PATH}/pods/{RELEASE}-ix-gpu-check"
        events = api.request(
            "GET", f"{NS_PATH}/events?fieldSelector=involvedObject.name%3D{RELEASE}-ix-gpu-check"
        )
        pod_status = json.dumps(api.request("GET", check)[1].get("status"))
        messages = [e.get("message") for e in events[1].get("items", [])]
        pytest.fail(f"helm test: {result.stdout}{result.stderr}\npod: {pod_status}\nevents: {messages}")
    assert "Succeeded" in result.stdout, result.stdout

    result = release.helm("uninstall", RELEASE, "--wait", "--timeout", "180s")
    assert result.returncode == 0, result.stderr
    assert api.request("GET", MWC)[0] == 404
    assert api.request("GET", f"{NS_PATH}/secrets/{WEBHOOK}-tls")[0] == 404
    for spec in REAL_NODES:
        wait_until(
            lambda spec=spec: (
                not [
                    k
                    for k in (release.node(spec.name).node() or {})["metadata"]["labels"]
                    if k.startswith("ix-gpu.io/gpu.")
                ]
            ),
            f"no ix-gpu.io/gpu.* labels on {spec.name}",
            60,
        )
    print(json.dumps(release.cluster.timings))
