"""Seed 004 on the mini cluster (tests/k8s/cluster.py, Kubernetes v1.37.2): etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and two real kubelets on fake-cri, ``gpu-a`` (two BI-V150
boards of two chips) and ``gpu-b`` (two single-chip BI-V100 boards), each with the real
``ix-gpu plugin --backend fake`` serving the seed's ConfigMap (``flags.splitboard: false``,
``sharing.timeSlicing.replicas: 4``).

- ``gpu-a`` shows ``iluvatar.com/gpu: 8`` in capacity and allocatable (2 boards x 4 replicas).
- The real ``ix-gpu webhook`` runs as a host process behind a Service (no selector; an EndpointSlice
  names 127.0.0.1:PORT) and a MutatingWebhookConfiguration that refers to the Service: the
  apiserver (``--enable-aggregator-routing=true``, no kube-proxy) dials the endpoint.
- The seed's ``corex-example`` pod (examples/gpu-pod.yaml; its ``ixsmi -l`` replaced by a script that
  prints what ixsmi would see, then holds its GPU) is mutated by the webhook, placed by the real
  scheduler, started by the kubelet through fake-cri with what the plugin's Allocate returned, and
  its log, read through the apiserver, shows ``IX_VISIBLE_DEVICES``, the device nodes, the injected
  ``LD_LIBRARY_PATH`` and the mounted driver root.
- With ``gpu-a`` full (8 pods holding one replica each: every board handed out exactly 4 times), a
  ninth GPU pod for ``gpu-a`` stays Pending with the scheduler's ``Insufficient iluvatar.com/gpu``
  event.
- The plugin also runs as a DaemonSet's pods (one per node, through the kubelets and fake-cri), each
  serving its own node's device-plugin directory; with the kubelets on this machine's routable
  address, a hostNetwork pod's Service gets its endpoint from real readiness.
"""

from __future__ import annotations

import collections
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.cluster import RESOURCE, SEED_004_CONFIG, MiniCluster, host_address, node_specs
from tests.k8s.k8s_tier import build_binaries
from tests.k8s.pods import (
    COREX_SCRIPT,
    get_pod,
    gpu_pod,
    iluvatar_paths,
    new_namespace,
    pod_condition,
    request_ok,
    scheduling_failure,
    wait_running,
)
from tests.support.net import free_port
from tests.support.paths import ROOT
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory, k8s_log_dir: Path) -> Iterator[MiniCluster]:
    # Function scope: the tier's gate (an autouse function fixture) runs first, so a skipped run
    # starts nothing.
    binaries = build_binaries()  # cached: instant
    start = time.monotonic()
    mini = MiniCluster(
        tmp_path_factory.mktemp("mini-cluster"),
        binaries=binaries,
        plugin_config=SEED_004_CONFIG,
        log_dir=k8s_log_dir,
    )
    with mini:
        print(f"\nmini cluster up in {time.monotonic() - start:.1f}s: {mini.timings}")
        start = time.monotonic()
        mini.install_webhook()
        print(f"webhook installed (Service + EndpointSlice) in {time.monotonic() - start:.1f}s")
        yield mini


def test_seed_004_eight_replicas_corex_example_runs_and_a_ninth_pod_is_pending(cluster: MiniCluster) -> None:
    started = time.monotonic()
    api = cluster.api
    assert cluster.node_resource("gpu-a") == (8, 8), cluster.nodes["gpu-a"].node()
    assert cluster.node_resource("gpu-b") == (8, 8), cluster.nodes["gpu-b"].node()

    namespace = f"seed-004-{secrets.token_hex(3)}"
    ns = new_namespace(api, namespace)

    # The seed's pod, as the user wrote it, with a script in place of `ixsmi -l`.
    corex = yaml.safe_load((ROOT / "examples" / "gpu-pod.yaml").read_text())
    container = corex["spec"]["containers"][0]
    assert container["resources"]["limits"] == {RESOURCE: 1}
    container["command"], container["args"] = ["sh", "-c", COREX_SCRIPT], []
    request_ok(api, "POST", f"{ns}/pods", corex)
    running = wait_running(api, namespace, "corex-example")
    node_name = running["spec"]["nodeName"]
    assert node_name in cluster.nodes, node_name
    wait_until(
        lambda: "corex-example done" in str(api.request("GET", f"{ns}/pods/corex-example/log")[1]),
        "corex-example's output",
        30,
        interval=0.25,
    )
    status, log = api.request("GET", f"{ns}/pods/corex-example/log")
    assert status == 200 and isinstance(log, str), log
    print(f"corex-example on {node_name}; kubectl logs corex-example:\n{log}")
    node = cluster.nodes[node_name]
    (record,) = [
        r for r in node.container_records()
        if (r["pod"]["namespace"], r["pod"]["name"]) == (namespace, "corex-example")
    ]  # fmt: skip
    env = dict(kv.split("=", 1) for kv in record["env"])
    assert env["IX_VISIBLE_DEVICES"], env
    assert f"IX_VISIBLE_DEVICES={env['IX_VISIBLE_DEVICES']}" in log.splitlines()
    paths = iluvatar_paths(record)
    expected_chips = 2 if node_name == "gpu-a" else 1  # splitboard false: a device is a whole board
    assert len(paths) == expected_chips, record["devices"]
    assert f"device nodes: {' '.join(paths)} " in log.splitlines()
    # The webhook (through its Service) added the driver root and LD_LIBRARY_PATH.
    annotations = running["metadata"].get("annotations", {})
    assert annotations.get("ix-gpu.io/injected", "").startswith("iluvatar@"), annotations
    assert "LD_LIBRARY_PATH=/usr/local/corex/lib64" in log.splitlines(), log
    assert "driver root: lib64 " in log.splitlines(), log

    # Fill gpu-a: 8 pods hold one replica each.
    on_a = 1 if node_name == "gpu-a" else 0
    fillers = [f"filler-{i}" for i in range(8 - on_a)]
    for name in fillers:
        request_ok(api, "POST", f"{ns}/pods", gpu_pod(name, "gpu-a", ["sleep", "3600"]))
    for name in fillers:
        assert wait_running(api, namespace, name)["spec"]["nodeName"] == "gpu-a"
    holders = [*fillers, *(["corex-example"] if on_a else [])]
    records = [
        r for r in cluster.nodes["gpu-a"].container_records()
        if r["pod"]["namespace"] == namespace and r["pod"]["name"] in holders and not r.get("removed")
    ]  # fmt: skip
    assert len(records) == 8, [r["pod"]["name"] for r in records]
    boards = collections.Counter(iluvatar_paths(r) for r in records)
    print(f"gpu-a's 8 replicas by device nodes: {dict(boards)}")
    board0, board1 = ("/dev/iluvatar0", "/dev/iluvatar1"), ("/dev/iluvatar2", "/dev/iluvatar3")
    assert boards == {board0: 4, board1: 4}, boards

    # A ninth GPU pod for gpu-a: the scheduler says why it stays Pending.
    request_ok(api, "POST", f"{ns}/pods", gpu_pod("ninth", "gpu-a", ["sleep", "3600"]))

    event = scheduling_failure(api, namespace, "ninth")
    print(f"event: {event['reason']}: {event['message']}")
    assert f"Insufficient {RESOURCE}" in event["message"], event
    ninth = get_pod(api, namespace, "ninth")
    assert ninth is not None and ninth["status"]["phase"] == "Pending", ninth
    assert "nodeName" not in ninth["spec"], ninth["spec"]
    scheduled = pod_condition(api, namespace, "ninth", "PodScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable"), scheduled
    assert f"Insufficient {RESOURCE}" in scheduled["message"], scheduled

    request_ok(api, "DELETE", ns)
    print(f"test body took {time.monotonic() - started:.1f}s")


def test_plugin_daemonset_pods_and_host_network_endpoints(tmp_path: Path, k8s_log_dir: Path) -> None:
    """The plugin as a DaemonSet's pods, run by each node's kubelet through fake-cri: the pod's
    hostPath /var/lib/kubelet/device-plugins is that node's device-plugin directory (the hostPath is
    resolved in the node's mount namespace), so each node gets its own plugin's devices.

    With the kubelets on this machine's routable address (``node_ip``), a hostNetwork pod behind a
    Service gets an EndpointSlice from the endpointslice controller, from its real readiness (pods on
    fake-cri's loopback pod IPs cannot: "may not be in the loopback range")."""
    address = host_address()
    if address is None:
        pytest.skip("no global IPv4 address on this machine")
    start = time.monotonic()
    with MiniCluster(
        tmp_path / "cluster",
        binaries=build_binaries(),
        plugin_config=SEED_004_CONFIG,
        nodes=node_specs(12),  # pod IPs apart from the other tests' clusters
        plugin_mode="daemonset",
        log_dir=k8s_log_dir / "daemonset",
        node_ip=address,
    ) as mini:
        print(f"\nmini cluster (plugin DaemonSet) up in {time.monotonic() - start:.1f}s: {mini.timings}")
        assert mini.node_resource("gpu-a") == (8, 8)
        assert mini.node_resource("gpu-b") == (8, 8)
        pods = mini.plugin_pods()
        assert sorted(p["spec"]["nodeName"] for p in pods) == ["gpu-a", "gpu-b"], pods
        for pod in pods:
            assert pod["status"]["phase"] == "Running", pod["status"]
            node = mini.nodes[pod["spec"]["nodeName"]]
            assert node.pod_cidr.startswith(pod["status"]["podIP"].rsplit(".", 1)[0]), pod["status"]
            status, log = mini.api.request(
                "GET", f"/api/v1/namespaces/kube-system/pods/{pod['metadata']['name']}/log"
            )
            assert status == 200 and "registered iluvatar.com/gpu with the kubelet" in str(log), log
            # The socket the pod serves is in that node's device-plugin directory, seen from the host.
            assert (node.plugin_dir / "iluvatar-gpu.sock").exists()

        # A hostNetwork pod behind a Service: an endpoint on the node's address, once it is ready.
        api, ns = mini.api, "/api/v1/namespaces/default"
        port = free_port()
        server = {
            "name": "http",
            "image": "python:3.11",
            "command": [Path(sys.executable).name, "-m", "http.server", str(port), "--bind", address],
            "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1},
        }
        pod = {
            "metadata": {"name": "host-net", "labels": {"app": "host-net"}},
            "spec": {
                "hostNetwork": True,
                "nodeSelector": {"kubernetes.io/hostname": "gpu-b"},
                "containers": [server],
            },
        }
        request_ok(api, "POST", f"{ns}/pods", pod)
        service = {
            "metadata": {"name": "host-net"},
            "spec": {"selector": {"app": "host-net"}, "ports": [{"port": 443, "targetPort": port}]},
        }
        request_ok(api, "POST", f"{ns}/services", service)

        def ready_endpoints() -> list[dict[str, Any]] | None:
            status, slices = api.request(
                "GET",
                "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?labelSelector=kubernetes.io/service-name%3Dhost-net",
            )
            assert status == 200, slices
            endpoints = [
                e for s in slices["items"] for e in s.get("endpoints") or [] if e["conditions"].get("ready")
            ]
            return endpoints or None

        (endpoint,) = wait_until(ready_endpoints, "a ready endpoint of Service host-net", 60, interval=0.25)
        assert endpoint["addresses"] == [address] and endpoint["nodeName"] == "gpu-b", endpoint
        assert endpoint["targetRef"]["name"] == "host-net", endpoint
        gpu_b = mini.nodes["gpu-b"].node() or {}
        assert {"type": "InternalIP", "address": address} in gpu_b["status"]["addresses"], gpu_b["status"]
