"""Per-node plugin configs through a real kubelet (the current Kubernetes, fake-cri): the plugin
reads a directory of named configs (as a mounted ConfigMap lays them out), the node label
``ix-gpu.io/device-plugin.config`` picks one, and a label change is followed without a restart:
the Node's ``iluvatar.com/gpu`` capacity goes 2 → 8 → 2. A label naming no config keeps the
config in use and says so in the log."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ix_gpu.devicemodel import labels
from tests.chart.rendering import render
from tests.k8s.k8s_tier import K8sBinaries, KubeAPI, KubeletNode, start_kubelet_node
from tests.k8s.plugin_inputs import RESOURCE, devices_yaml
from tests.support.cli import ix_gpu_process
from tests.support.processes import Process
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

LABEL = "ix-gpu.io/device-plugin.config"
CAPACITY_S = 60.0


@pytest.fixture(scope="module")
def kube_api(current_kube_api: KubeAPI) -> KubeAPI:
    """The current apiserver: a kubelet may not be newer than the apiserver it registers with."""
    return current_kube_api


@pytest.fixture
def node(k8s_binaries: K8sBinaries, kube_api: KubeAPI, k8s_log_dir: Path) -> Iterator[KubeletNode]:
    node = start_kubelet_node(k8s_binaries, kube_api, k8s_log_dir, pod_cidr="127.0.78.0/24")
    try:
        node.wait_ready()
        yield node
    finally:
        node.close()


def _label(api: KubeAPI, node: str, value: str | None) -> None:
    status, body = api.request(
        "PATCH",
        f"/api/v1/nodes/{node}",
        {"metadata": {"labels": {LABEL: value}}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, body


def _capacity(node: KubeletNode) -> str | None:
    found = node.node()
    return None if found is None else found["status"].get("allocatable", {}).get(RESOURCE)


def _gpu_labels(node: KubeletNode) -> tuple[str | None, str | None]:
    found = node.node() or {}
    node_labels = found.get("metadata", {}).get("labels", {})
    return node_labels.get(labels.GPU_COUNT), node_labels.get(labels.GPU_REPLICAS)


def test_the_node_label_picks_the_config_and_a_change_is_followed_without_restart(
    node: KubeletNode, kube_api: KubeAPI, k8s_log_dir: Path, tmp_path: Path
) -> None:
    """The configs are what the chart renders for ``plugin.nodeConfigs`` (its ConfigMap's keys, as
    the mounted directory has them), so the node labels are on in the named config too: they
    follow each capacity change."""
    configs = tmp_path / "configs"
    configs.mkdir()
    shared4 = {"sharing": {"timeSlicing": {"replicas": 4}}}
    (configmap,) = [
        o
        for o in render({"plugin": {"nodeConfigs": {"shared4": shared4}}})
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "ix-config"
    ]
    assert set(configmap["data"]) == {"ix-config", "shared4"}
    for name, text in configmap["data"].items():
        (configs / name).write_text(text)
    devices = tmp_path / "devices.yaml"
    devices.write_text(devices_yaml())
    plugin: Process = ix_gpu_process(
        f"ix-gpu-plugin-{node.name}",
        "plugin", "--backend", "fake", "--fake-devices", str(devices),
        "--device-plugin-dir", str(node.plugin_dir),
        "--config", str(configs), "--default-config", "ix-config",
        "--kubeconfig", str(kube_api.kubeconfig),
        "--metrics-port", "0",
        log_dir=k8s_log_dir,
        env={"NODE_NAME": node.name},
    )  # fmt: skip
    try:

        def capacity_is(value: str) -> None:
            wait_until(
                lambda: _capacity(node) == value,
                f"{RESOURCE} allocatable {value} on {node.name}",
                CAPACITY_S,
                interval=0.25,
                process=plugin,
                details=lambda: f"allocatable {_capacity(node)}; plugin log:\n{plugin.tail(15)}",
            )

        def labels_are(count: str, replicas: str) -> None:
            wait_until(
                lambda: _gpu_labels(node) == (count, replicas),
                f"node labels count={count} replicas={replicas}",
                CAPACITY_S,
                interval=0.25,
                process=plugin,
            )

        capacity_is("2")  # no label: the default, ix-config (two boards, no sharing)
        labels_are("2", "1")
        _label(kube_api, node.name, "shared4")
        capacity_is("8")  # the same process, now with replicas 4
        labels_are("8", "4")  # the named config keeps the labels on
        _label(kube_api, node.name, "no-such-config")
        wait_until(
            lambda: "names no config" in plugin.log.read_text(),
            "the plugin to say the label names no config",
            30,
            process=plugin,
        )
        assert _capacity(node) == "8"  # kept, not reset to the default
        _label(kube_api, node.name, None)
        capacity_is("2")
        labels_are("2", "1")
        switches = [
            json.loads(line)["msg"]
            for line in plugin.log.read_text().splitlines()
            if line.startswith("{") and "using config" in line
        ]
        used = [s.removeprefix(f"using config {configs}/").split(":", 1)[0] for s in switches]
        assert used == ["shared4", "ix-config"], switches
        assert plugin.alive(), plugin.tail(20)
    finally:
        plugin.stop()
