"""A real kubelet (v1.35, built by build.sh) on a fake container runtime, registered as a Node of the
tier's kube-apiserver: the real ``ix-gpu plugin --backend fake`` with the seed's two GPUs and
``sharing.timeSlicing.replicas: 4`` shows up as ``iluvatar.com/gpu: 8`` in the Node's
``status.capacity`` and ``status.allocatable``, as in the seed's ``kubectl describe node``.

The container runtime is tests/k8s/fake-cri (it runs containers as host processes; this test creates no pods).
The kubelet runs in a private mount namespace (``unshare --mount``) in which
 - a temp directory is bind-mounted over /var/lib/kubelet/device-plugins (the device manager's
   socket directory is fixed), so the plugin serves into that temp directory and nothing on the
   host's device-plugin directory is touched, and
 - the six kernel sysctls the kubelet's container manager would otherwise rewrite on the host
   (vm.overcommit_memory, kernel.panic, ...) are bind-mounted files that already hold the values it
   wants, so the host's kernel settings stay as they are.
Config for this VM (cgroup v1, swap, no systemd): failCgroupV1 false, failSwapOn false, cgroupfs,
cgroupsPerQOS false, enforceNodeAllocatable [], only 127.0.0.1 ports.
``--node-ip=127.0.0.1`` keeps every address the Node reports on loopback; the kubelet logs
"nodeIP can't be loopback address" on status updates, which does not keep the Node from Ready.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.k8s_tier import K8sBinaries, KubeAPI, kubelet_node_config
from tests.k8s.plugin_process import RESOURCE, devices_yaml, seed_config
from tests.support.net import free_port
from tests.support.plugin_process import PluginProcess
from tests.support.processes import Process, start_process, tail
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SYSCTLS = {
    # /proc/sys path -> the value the kubelet's setupKernelTunables wants (component-helpers sysctl)
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}
# $1 device-plugin dir, $2 sysctl dir, $3 kubelet binary, then the kubelet's arguments.
LAUNCHER = f"""set -eu
dp=$1 sysctls=$2 kubelet=$3
shift 3
mount --bind "$dp" {DEVICE_PLUGIN_DIR}
for f in "$sysctls"/*; do
    mount --bind "$f" "/proc/sys/$(basename "$f" | tr . /)"
done
exec "$kubelet" "$@"
"""
NODE_READY_S = 120.0
CAPACITY_S = 60.0


def unix_socket_ready(path: Path) -> bool:
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def kubelet_config(cri_socket: Path, root: Path) -> dict[str, Any]:
    return kubelet_node_config(free_port(), free_port(), cri_socket, root)


class RealKubelet:
    """fake-cri + kubelet (private mount namespace) registered as Node ``name``."""

    def __init__(self, binaries: K8sBinaries, api: KubeAPI, log_dir: Path) -> None:
        self.api = api
        self.name = f"ix-node-{secrets.token_hex(3)}"
        # Short paths: unix socket paths are limited to 107 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="ix-kl-"))
        self.plugin_dir = self.root / "dp"
        self.plugin_dir.mkdir()
        sysctls = self.root / "sysctl"
        sysctls.mkdir()
        for key, value in KUBELET_SYSCTLS.items():
            (sysctls / key.replace("/", ".")).write_text(f"{value}\n")
        self.cri_socket = self.root / "cri.sock"
        self.processes: list[Process] = []

        cri = start_process(
            "fake-cri",
            [str(binaries.bin_dir / "fake-cri"), "--endpoint", f"unix://{self.cri_socket}"],
            log_dir,
        )
        self.processes.append(cri)
        wait_until(
            lambda: unix_socket_ready(self.cri_socket), "the fake CRI socket", 30, interval=0.25, process=cri
        )

        config = self.root / "kubelet-config.yaml"
        config.write_text(yaml.safe_dump(kubelet_config(self.cri_socket, self.root)))
        Path(DEVICE_PLUGIN_DIR).mkdir(parents=True, exist_ok=True)  # the mount point
        argv = [
            "unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", LAUNCHER, "launcher",
            str(self.plugin_dir), str(sysctls), str(binaries.bin_dir / "kubelet"),
            f"--config={config}",
            f"--kubeconfig={api.kubeconfig}",
            f"--root-dir={self.root / 'root'}",
            f"--cert-dir={self.root / 'pki'}",
            f"--hostname-override={self.name}",
            "--node-ip=127.0.0.1",
            "--v=2",
        ]  # fmt: skip
        self.kubelet = start_process(f"kubelet-{self.name}", argv, log_dir)
        self.processes.append(self.kubelet)

    def node(self) -> dict[str, Any] | None:
        status, body = self.api.request("GET", f"/api/v1/nodes/{self.name}")
        return body if status == 200 and isinstance(body, dict) else None

    def ready(self) -> bool:
        node = self.node()
        if node is None:
            return False
        conditions = node.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def close(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
        with contextlib.suppress(Exception):
            self.api.request("DELETE", f"/api/v1/nodes/{self.name}")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def real_kubelet(k8s_binaries: K8sBinaries, kube_api: KubeAPI, k8s_log_dir: Path) -> Iterator[RealKubelet]:
    kubelet = RealKubelet(k8s_binaries, kube_api, k8s_log_dir)
    try:
        yield kubelet
    finally:
        kubelet.close()


def describe_capacity(node: dict[str, Any]) -> str:
    """The Capacity/Allocatable part of ``kubectl describe node``."""
    lines = []
    for section in ("capacity", "allocatable"):
        lines.append(f"{section.capitalize()}:")
        for key, value in sorted(node["status"][section].items()):
            lines.append(f"  {key + ':':<24}{value}")
    return "\n".join(lines)


def test_node_capacity_two_gpus_replicas4_is_8(
    real_kubelet: RealKubelet, k8s_log_dir: Path, tmp_path: Path
) -> None:
    kubelet = real_kubelet
    start = time.monotonic()
    wait_until(
        kubelet.ready, f"Node {kubelet.name} Ready", NODE_READY_S, interval=0.25, process=kubelet.kubelet
    )
    print(f"Node {kubelet.name} Ready after {time.monotonic() - start:.1f}s")
    wait_until(
        lambda: unix_socket_ready(kubelet.plugin_dir / "kubelet.sock"),
        "the kubelet's device-plugin registration socket",
        30,
        interval=0.25,
        process=kubelet.kubelet,
    )

    plugin = PluginProcess(
        tmp_path / "plugin",
        kubelet.plugin_dir,
        devices_yaml(),
        seed_config(replicas=4),
        k8s_log_dir,
        name=f"ix-gpu-plugin-{kubelet.name}",
    ).start()
    try:
        start = time.monotonic()

        def has_gpus() -> bool:
            node = kubelet.node()
            return node is not None and node["status"].get("allocatable", {}).get(RESOURCE) == "8"

        wait_until(
            has_gpus,
            f"{RESOURCE} on Node {kubelet.name}",
            CAPACITY_S,
            interval=0.25,
            process=kubelet.kubelet,
            details=lambda: f"plugin log:\n{plugin.log_tail()}\nnode: {kubelet.node()}",
        )
        node = kubelet.node()
        assert node is not None
        print(f"{RESOURCE} on the Node after {time.monotonic() - start:.1f}s\n{describe_capacity(node)}")
        assert node["status"]["capacity"][RESOURCE] == "8"
        assert node["status"]["allocatable"][RESOURCE] == "8"
        assert node["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.35.")
        assert plugin.popen.poll() is None, plugin.log_tail()
    finally:
        plugin.stop()
    # Both stay alive to the end (a crash would otherwise only show in the logs).
    assert kubelet.kubelet.alive(), tail(kubelet.kubelet.log)
