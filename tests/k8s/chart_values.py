"""Values for charts/ix-gpu on the mini cluster (fake devices, loopback pods, no kube-proxy) and
on the real-node cluster (the image built here, the nodes' driver root), and the files they point at.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

import yaml

from tests.k8s import real_nodes
from tests.k8s.cluster import SEED_004_CONFIG, NodeSpec
from tests.k8s.real_nodes import Images
from tests.support.cli import ix_gpu
from tests.support.paths import EXAMPLES, load_yaml


def chart_values(
    api_url: str,
    devices_dir: Path,
    driver_root: Path,
    webhook_port: int,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Values for charts/ix-gpu on this cluster (kubelets on ``host_address()``): what adapts the
    chart to loopback pods, no kube-proxy and no GPU, and nothing else (tests/k8s/README.md).

    - ``webhook.hostNetwork``: loopback pod IPs cannot be Service endpoints.
    - ``*.extraEnv`` ``KUBERNETES_SERVICE_HOST/PORT``: the ``kubernetes`` Service's ClusterIP
      leads nowhere without kube-proxy.
    - The plugin: the fake backend with ``devices_dir/<node>.yaml``, /healthz and /metrics on its
      pod IP (fake-cri's pods share one network namespace), the driver root ``driver_root``.
    - ``config``: the webhook's config (default: the built-in one with ``driver_root`` as the
      Iluvatar driver's hostPath); the plugin runs seed 004's ix-config.
    """
    if config is None:
        config = yaml.safe_load(ix_gpu("config", "default", check=True).stdout)
        for profile in config["profiles"]:
            for volume in profile["volumes"]:
                if volume["hostPath"] == "/usr/local/corex":
                    volume["hostPath"] = str(driver_root)
    port = urllib.parse.urlsplit(api_url).port
    api_env = [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(port)},
    ]
    return {
        "config": config,
        "webhook": {
            "replicas": 1,
            "hostNetwork": True,
            "port": webhook_port,
            "extraEnv": api_env,
        },
        "plugin": {
            "config": yaml.safe_load(SEED_004_CONFIG),
            "driver": {"root": str(driver_root)},
            "extraEnv": [
                *api_env,
                {"name": "IX_GPU_BACKEND", "value": "fake"},
                {"name": "IX_GPU_FAKE_DEVICES", "value": f"{devices_dir}/$(NODE_NAME).yaml"},
                {"name": "IX_GPU_METRICS_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            ],
        },
        "tests": {"extraEnv": api_env},
    }


def real_node_chart_values(images: Images, scenario: bool = False) -> dict[str, Any]:
    """Values for charts/ix-gpu on the real-node cluster: the image built here and the nodes'
    driver root (``plugin.driver.root`` and the Iluvatar profile's hostPath), which any cluster
    whose image or driver lives elsewhere sets too; nothing else. ``scenario``: also the
    Iluvatar plugin's ConfigMap (8 GPUs a node) and the tf-operator discussion's NVIDIA profile
    with its privileged namespace, as the tests install it."""
    config: dict[str, Any] = yaml.safe_load(ix_gpu("config", "default", check=True).stdout)
    (iluvatar,) = [p for p in config["profiles"] if p["name"] == "iluvatar"]
    for volume in iluvatar["volumes"]:
        if volume["hostPath"] == "/usr/local/corex":
            volume["hostPath"] = real_nodes.DRIVER_ROOT
    values: dict[str, Any] = {
        "image": {"repository": images.project_repository, "tag": images.project_tag},
        "plugin": {"driver": {"root": real_nodes.DRIVER_ROOT}},
        "config": {"profiles": config["profiles"]},
    }
    if scenario:
        seed = load_yaml(EXAMPLES / "seed-config.yaml")
        # Privileged where the policy allows it, so the TFJob example's GPU worker in ml-team gets it.
        values["config"]["profiles"] = [{**iluvatar, "privileged": "allowed"}, *seed["profiles"]]
        values["config"]["policy"] = {
            **config["policy"],
            **{"privilegedNamespaces": seed["policy"]["privilegedNamespaces"]},
        }
        values["plugin"]["config"] = yaml.safe_load(SEED_004_CONFIG)
    return values


def write_chart_inputs(work_dir: Path, nodes: tuple[NodeSpec, ...]) -> tuple[Path, Path]:
    """Each node's fake devices file (``work_dir/fake-devices/<node>.yaml``) and a driver root
    with a ``lib64`` (``work_dir/corex``): what :func:`chart_values` points the chart at."""
    devices, driver_root = work_dir / "fake-devices", work_dir / "corex"
    devices.mkdir(parents=True, exist_ok=True)
    (driver_root / "lib64").mkdir(parents=True, exist_ok=True)
    for spec in nodes:
        (devices / f"{spec.name}.yaml").write_text(spec.devices)
    return devices, driver_root
