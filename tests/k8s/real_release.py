"""A chart release on the real-node cluster, driven through the helm CLI as a user drives it, and
the module fixture both real-node test modules open it with (one cluster at a time: the tier's
addresses are fixed)."""

from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.k8s import host_settings
from tests.k8s.cluster import MiniCluster
from tests.k8s.conftest import REAL_NODES_NOT_RUN, _tier_requested
from tests.k8s.helm_cli import run_helm, write_values
from tests.k8s.k8s_tier import KubeAPI, build_binaries, build_helm
from tests.k8s.pods import get_pod, request_ok
from tests.k8s.real_nodes import (
    Images,
    RealNode,
    kube_chains,
    leftovers,
    misc_devices,
    release_machine,
    take_machine,
)
from tests.support.paths import ROOT
from tests.support.waiting import wait_until

NAMESPACE = "ix-gpu-system"
NS_PATH = f"/api/v1/namespaces/{NAMESPACE}"
RESOURCE = "iluvatar.com/gpu"

# What a GPU pod sees, printed for the test to judge (run as root: mknod needs it): the device
# nodes it was given, each opened; another chip's device refused by the device cgroup; the driver
# root read-only; the environment the injection set. Then it sleeps, holding its GPU.
DEVICE_CHECK = r"""
import glob, os, stat
given = sorted(glob.glob("/dev/iluvatar*"))
print("given:", " ".join(given))
for path in given:
    os.close(os.open(path, os.O_RDONLY))
    print("opened:", path)
# A device the container was not given: made here with the numbers of another node chip. The
# device cgroup refuses the open (EPERM) whatever the file says.
for numbers in @MISC@:
    if any(os.stat(p).st_rdev == os.makedev(*numbers) for p in given):
        continue
    os.mknod("/tmp/other", stat.S_IFCHR | 0o666, os.makedev(*numbers))
    try:
        os.close(os.open("/tmp/other", os.O_RDONLY))
        print("other: opened", numbers)
    except OSError as err:
        print("other: refused", numbers, err.errno)
    os.unlink("/tmp/other")
    break
try:
    open("/usr/local/corex/written", "w")
    print("driver root: writable")
except OSError as err:
    print("driver root: read-only", err.errno)
print("driver root:", " ".join(sorted(os.listdir("/usr/local/corex"))))
print("LD_LIBRARY_PATH=" + os.environ.get("LD_LIBRARY_PATH", ""))
print("IX_VISIBLE_DEVICES=" + os.environ.get("IX_VISIBLE_DEVICES", ""))
print("done", flush=True)
import time
time.sleep(3600)
"""


# How a GPU container finds the driver's libraries (tests of issue "CDI keeps LD_LIBRARY_PATH"): the
# variable as the container got it, the libixml entries of its linker cache, where libixml.so is
# loaded from with that variable, and where from without it (only the linker cache can find it).
LIBRARY_CHECK = r"""
import ctypes, os, subprocess, sys, time
print("LD_LIBRARY_PATH=" + os.environ.get("LD_LIBRARY_PATH", ""))
cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
print("ldcache:", " ".join(sorted(l.split(" => ")[1] for l in cache.splitlines() if "libixml" in l)))
LOAD = ("import ctypes; ctypes.CDLL('libixml.so'); "
        "print(*[l.split()[-1] for l in open('/proc/self/maps') if 'libixml' in l][:1])")
bare = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
for label, env in (("with", dict(os.environ)), ("without", bare)):
    done = subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True)
    print(f"loaded {label} LD_LIBRARY_PATH:", done.stdout.strip() or "failed " + done.stderr.strip()[-200:])
print("done", flush=True)
time.sleep(3600)
"""


def chip_holders(release: Release, node: str) -> list[dict[str, str]]:
    """The device plugin's ``ix_gpu_chip_allocation`` series on ``node`` (its /metrics at its pod
    IP, routed to the node), each as its labels; [] while it cannot be read."""
    pods = [p for p in release.pods("device-plugin") if p["spec"]["nodeName"] == node]
    if not pods or not pods[0]["status"].get("podIP"):
        return []
    try:
        with urllib.request.urlopen(f"http://{pods[0]['status']['podIP']}:9401/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return []
    return [
        dict(sample.labels)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "ix_gpu_chip_allocation"
    ]


APP_LIBRARY_PATH = "/opt/app/lib"
"""What an application's image or pod puts on LD_LIBRARY_PATH, which injection must keep."""


def library_pod(name: str, image: str, gpus: int = 0) -> dict[str, Any]:
    """A root pod running LIBRARY_CHECK with ``LD_LIBRARY_PATH=/opt/app/lib`` of its own and
    ``gpus`` iluvatar.com/gpu."""
    pod = image_pod(name, image, ["python3", "-c", LIBRARY_CHECK], gpus=gpus)
    container = pod["spec"]["containers"][0]
    container["securityContext"] = {"runAsUser": 0}
    container["env"] = [{"name": "LD_LIBRARY_PATH", "value": APP_LIBRARY_PATH}]
    return pod


def finished_log(release: Release, namespace: str, pod: str, what: str = "check") -> str:
    """``pod``'s log once its check printed ``done`` (printed here too, for the test's output)."""
    wait_until(
        lambda: "done" in release.log(namespace, pod).splitlines(),
        f"{pod}'s {what}",
        90,
        details=lambda: release.log(namespace, pod) + str(get_pod(release.api, namespace, pod))[-2000:],
    )
    log = release.log(namespace, pod)
    print(f"\nkubectl logs {pod}:\n{log}")
    return log


def library_check_lines(release: Release, namespace: str, pod: str) -> dict[str, str]:
    """LIBRARY_CHECK's output of ``pod``, once it is done: each line's key (before ``=`` or ``:``)
    to the rest."""
    found = {}
    for line in finished_log(release, namespace, pod, "library check").splitlines():
        key, _, value = line.partition("=" if line.startswith("LD_LIBRARY_PATH=") else ":")
        found[key] = value.strip()
    return found


def device_check() -> str:
    """DEVICE_CHECK with this kernel's stand-in device numbers (real_nodes.misc_devices)."""
    return DEVICE_CHECK.replace("@MISC@", repr(misc_devices()))


class Release:
    """A release of charts/ix-gpu in ``NAMESPACE`` on the real-node cluster."""

    def __init__(self, cluster: MiniCluster, helm_binary: Path, work: Path, values: dict[str, Any]) -> None:
        self.cluster, self.helm_binary, self.work, self.values = cluster, helm_binary, work, values
        self.revision = 0

    @property
    def api(self) -> KubeAPI:
        return self.cluster.api

    @property
    def image(self) -> str:
        return f"{self.values['image']['repository']}:{self.values['image']['tag']}"

    @property
    def library_check_image(self) -> str:
        """An application image with ``ENV LD_LIBRARY_PATH=/opt/imglib`` and a library of its own
        there (tests/k8s/images/library-check.c): its entrypoint says where each library loads
        from."""
        nodes = self.cluster.real_nodes
        assert nodes is not None and nodes.images is not None
        return nodes.images.library_check_ref

    def helm(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return run_helm(
            self.helm_binary, self.cluster.kubeconfig, self.work, NAMESPACE, *args, timeout=timeout
        )

    def values_file(self) -> Path:
        self.revision += 1
        return write_values(self.work, self.values, self.revision)

    def label_and_install(
        self, name: str, node_labels: dict[str, dict[str, str]], timeout: str = "240s"
    ) -> None:
        """Label the nodes as the operator chooses (which allocator, which config), then
        ``helm install --wait`` the chart with this release's values."""
        for node, labels in node_labels.items():
            status, reply = self.api.request(
                "PATCH",
                f"/api/v1/nodes/{node}",
                {"metadata": {"labels": labels}},
                content_type="application/merge-patch+json",
            )
            assert status == 200, reply
        chart = str(ROOT / "charts" / "ix-gpu")
        result = self.helm(
            "install", name, chart, "--create-namespace", "-f", str(self.values_file()),
            "--wait", "--timeout", timeout,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr

    def pods(self, component: str) -> list[dict[str, Any]]:
        path = f"{NS_PATH}/pods?labelSelector=app.kubernetes.io/component%3D{component}"
        return [
            p for p in request_ok(self.api, "GET", path)["items"] if "deletionTimestamp" not in p["metadata"]
        ]

    def pod_token(self, component: str, node: str) -> str:
        """A token of ``component``'s ServiceAccount bound to its pod on ``node``: it names that
        node, as the pod's own projected token does (ServiceAccountTokenPodNodeInfo)."""
        (pod,) = [p for p in self.pods(component) if p["spec"]["nodeName"] == node]
        account = pod["spec"]["serviceAccountName"]
        bound = {
            "kind": "Pod",
            "apiVersion": "v1",
            "name": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"],
        }
        answer = request_ok(
            self.api,
            "POST",
            f"{NS_PATH}/serviceaccounts/{account}/token",
            {"spec": {"boundObjectRef": bound, "expirationSeconds": 600}},
        )
        return str(answer["status"]["token"])

    def node(self, name: str) -> RealNode:
        node = self.cluster.nodes[name]
        assert isinstance(node, RealNode)
        return node

    def log(self, namespace: str, pod: str, previous: bool = False) -> str:
        query = "?previous=true" if previous else ""
        return str(self.api.request("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}/log{query}")[1])


def require_real_nodes(config: pytest.Config) -> list[tuple[str, str, str]]:
    """Before a real-node cluster starts: skip where the tier was not asked for or this machine
    cannot run real nodes (the reason kept for the session's summary), fail where a real-node
    cluster is already here. Returns the host's own KUBE-* chains (another kubelet's or
    kube-proxy's, not ours to judge), which ``leftovers(keep=...)`` leaves out afterwards."""
    if not _tier_requested(config):
        pytest.skip("real-Kubernetes tier: run with -m k8s (or IX_GPU_K8S=1)")
    reason = host_settings.unfit_reason()
    if reason:
        skip_real_nodes(config, reason)
    try:
        misc_devices()
    except host_settings.HostUnfit as err:
        skip_real_nodes(config, str(err))
    take_machine()  # another run's cluster on this machine: wait for it to be gone
    host_chains = kube_chains()
    stale = leftovers(keep=host_chains)
    assert not stale, f"a real-node cluster is already on this machine: {stale}"
    return host_chains


def open_release(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    log_dir: Path,
    values: Callable[[Images], dict[str, Any]],
    from_a_fresh_machine: bool = False,
) -> Iterator[Release]:
    """The body of a module fixture: a real-node cluster, a :class:`Release` (not installed yet)
    with ``values(images)``, and, after the module, the checks that nothing of the cluster is left
    and that the host settings the tier changed are back. ``from_a_fresh_machine`` starts from a
    fresh machine's settings (``host_settings.FRESH_MACHINE``: ``ip_forward`` off), whatever this
    machine has, and puts this machine's own back at the end.

    A machine that cannot run real nodes (not root, a read-only ``/proc/sys``, no iptables, ...)
    skips the module with the reason; the reason is also kept for the session's summary."""
    host_chains = require_real_nodes(request.config)
    helm = build_helm()
    work = tmp_path_factory.mktemp("real-nodes")
    with contextlib.ExitStack() as stack:
        stack.callback(release_machine)  # last: after the checks below, another run may start
        expected = (
            stack.enter_context(host_settings.as_on_a_fresh_machine())
            if from_a_fresh_machine
            else host_settings.snapshot()
        )
        try:
            mini = start_real_node_cluster(work, log_dir)
        except host_settings.HostUnfit as err:
            skip_real_nodes(request.config, str(err))
        try:
            assert mini.real_nodes is not None and mini.real_nodes.images is not None
            yield Release(mini, helm, work, values(mini.real_nodes.images))
        finally:
            mini.stop()
        assert leftovers(keep=host_chains) == [], "the real-node cluster left things behind"
        assert host_settings.snapshot() == expected, "the tier did not put the host settings back"


def start_real_node_cluster(work: Path, log_dir: Path) -> MiniCluster:
    """The real-node cluster in ``work/cluster``, started (the caller stops it); raises
    :class:`host_settings.HostUnfit` where this machine cannot run it. For a fixture and for a
    bench alike."""
    started = time.monotonic()
    mini = MiniCluster(
        work / "cluster", binaries=build_binaries(), plugin_config=None, log_dir=log_dir, runtime="containerd"
    )
    mini.start()
    print(f"\nreal-node cluster up in {time.monotonic() - started:.1f}s: {mini.timings}")
    return mini


def skip_real_nodes(config: pytest.Config, reason: str) -> NoReturn:
    """Skip a real-node module, keeping the reason for the session's summary (conftest)."""
    reasons: list[str] = config.stash.setdefault(REAL_NODES_NOT_RUN, [])
    if reason not in reasons:
        reasons.append(reason)
    pytest.skip(f"real-node tier not run: {reason}")


def image_pod(
    name: str, image: str, command: list[str], gpus: int = 0, resource: str = RESOURCE, **spec: Any
) -> dict[str, Any]:
    """A pod of the project image (the only image on these nodes besides pause)."""
    container: dict[str, Any] = {"name": "main", "image": image, "command": command}
    if gpus:
        container["resources"] = {"limits": {resource: str(gpus)}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 1, **spec},
    }
