"""A real kubelet (the current Kubernetes, built by build.sh) on a fake container runtime,
registered as a Node of the tier's current kube-apiserver: the real ``ix-gpu plugin --backend
fake`` with the seed's two GPUs and ``sharing.timeSlicing.replicas: 4`` shows up as
``iluvatar.com/gpu: 8`` in the Node's ``status.capacity`` and ``status.allocatable``, as in the
seed's ``kubectl describe node``.

The Node is ``k8s_tier.start_kubelet_node``: fake-cri and the kubelet in one private mount namespace,
where a temp directory is bound over /var/lib/kubelet/device-plugins (the plugin serves into it;
the host's directory is untouched) and the sysctls the kubelet would rewrite are files that already
hold its values. This test creates no pods (test_kubelet_runs_pods.py does).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.k8s_tier import (
    CURRENT_K8S_VERSION,
    K8sBinaries,
    KubeAPI,
    KubeletNode,
    start_kubelet_node,
    unix_socket_ready,
)
from tests.k8s.plugin_inputs import RESOURCE, devices_yaml, seed_config
from tests.support.plugin_process import PluginProcess
from tests.support.processes import tail
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

NODE_READY_S = 120.0
CAPACITY_S = 60.0


@pytest.fixture(scope="module")
def kube_api(current_kube_api: KubeAPI) -> KubeAPI:
    """The current apiserver: a kubelet may not be newer than the apiserver it registers with."""
    return current_kube_api


@pytest.fixture
def real_kubelet(k8s_binaries: K8sBinaries, kube_api: KubeAPI, k8s_log_dir: Path) -> Iterator[KubeletNode]:
    node = start_kubelet_node(k8s_binaries, kube_api, k8s_log_dir, pod_cidr="127.0.79.0/24")
    try:
        yield node
    finally:
        node.close()


def describe_capacity(node: dict[str, Any]) -> str:
    """The Capacity/Allocatable part of ``kubectl describe node``."""
    lines = []
    for section in ("capacity", "allocatable"):
        lines.append(f"{section.capitalize()}:")
        for key, value in sorted(node["status"][section].items()):
            lines.append(f"  {key + ':':<24}{value}")
    return "\n".join(lines)


def test_node_capacity_two_gpus_replicas4_is_8(
    real_kubelet: KubeletNode, k8s_log_dir: Path, tmp_path: Path
) -> None:
    node = real_kubelet
    assert node.kubelet is not None
    start = time.monotonic()
    node.wait_ready(NODE_READY_S)
    print(f"Node {node.name} Ready after {time.monotonic() - start:.1f}s")
    wait_until(
        lambda: unix_socket_ready(node.plugin_dir / "kubelet.sock"),
        "the kubelet's device-plugin registration socket",
        30,
        interval=0.25,
        process=node.kubelet,
    )

    plugin = PluginProcess(
        tmp_path / "plugin",
        node.plugin_dir,
        devices_yaml(),
        seed_config(replicas=4),
        k8s_log_dir,
        name=f"ix-gpu-plugin-{node.name}",
    ).start()
    try:
        start = time.monotonic()

        def has_gpus() -> bool:
            current = node.node()
            return current is not None and current["status"].get("allocatable", {}).get(RESOURCE) == "8"

        wait_until(
            has_gpus,
            f"{RESOURCE} on Node {node.name}",
            CAPACITY_S,
            interval=0.25,
            process=node.kubelet,
            details=lambda: f"plugin log:\n{plugin.log_tail()}\nnode: {node.node()}",
        )
        current = node.node()
        assert current is not None
        print(f"{RESOURCE} on the Node after {time.monotonic() - start:.1f}s\n{describe_capacity(current)}")
        assert current["status"]["capacity"][RESOURCE] == "8"
        assert current["status"]["allocatable"][RESOURCE] == "8"
        assert current["status"]["nodeInfo"]["kubeletVersion"] == CURRENT_K8S_VERSION
        assert plugin.popen.poll() is None, plugin.log_tail()
    finally:
        plugin.stop()
    # Both stay alive to the end (a crash would otherwise only show in the logs).
    assert node.kubelet.alive(), tail(node.kubelet.log)
    assert node.fake_cri.alive(), tail(node.fake_cri.log)
