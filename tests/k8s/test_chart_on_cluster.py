"""The chart on the mini cluster (tests/k8s/cluster.py, Kubernetes v1.37.2) through the real ``helm``
v4 CLI: an operator's install, a user's GPU workloads, and the operator's day two.

One cluster for the module: ``gpu-a`` (two BI-V150 boards of two chips) and ``gpu-b`` (two
single-chip BI-V100 boards), no plugin of its own. One release, ``ixg`` in ``ix-gpu-system``: the
chart's DaemonSet runs the plugin on both nodes with seed 004's ix-config as ``plugin.config``
(``flags.splitboard: false``, ``sharing.timeSlicing.replicas: 4``) and node labels on (the
default); the ``config`` value expresses seed 000 (the seed's NVIDIA device nodes, LD_LIBRARY_PATH
and privileged in ``ml-team`` only) beside the built-in Iluvatar profile. The tests share the
release and run in file order: install, GPU type, seed 000, a Deployment, failurePolicy without
webhook pods, a config that fails to load, ``helm upgrade``, ``helm test``, ``helm uninstall``.

Where this cluster differs from a real one, and what the values do about it (nothing else is
changed after ``helm install``):

- No CNI: pod IPs are loopback addresses, which EndpointSlices refuse, so ``webhook.hostNetwork:
  true`` and the kubelets on this machine's routable address (``--node-ip``); the apiserver
  (``--enable-aggregator-routing``) dials the endpoint the endpointslice controller publishes from
  the pod's real readiness.
- No kube-proxy: the in-cluster apiserver address the kubelet gives pods (the ``kubernetes``
  Service's ClusterIP) leads nowhere, so ``webhook.extraEnv`` and ``tests.extraEnv`` set
  ``KUBERNETES_SERVICE_HOST``/``PORT`` to the apiserver's real address.
- No GPU: ``plugin.extraEnv`` selects the fake backend (``IX_GPU_BACKEND``) and each node's devices
  file (``IX_GPU_FAKE_DEVICES``, a host path with ``$(NODE_NAME)``; fake-cri's containers see the
  host's files). fake-cri's pods share one network namespace, so each plugin binds /healthz and
  /metrics on its pod IP (``IX_GPU_METRICS_HOST`` from the downward API) instead of ``::``.
- The Iluvatar driver root (``plugin.driver.root`` and the webhook profile's hostPath) is a
  directory of the test (this machine has no /usr/local/corex).
- The kubelets' ``syncFrequency`` is 5 s (default 1 min), which bounds how soon a changed ConfigMap
  reaches the webhook pod's volume.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.chart_values import chart_values, write_chart_inputs
from tests.k8s.cluster import MiniCluster, host_address, node_specs
from tests.k8s.conftest import _tier_requested
from tests.k8s.crds import LEGACY_TFJOB_CRD, install_crd, kubeflow_tfjob_crd
from tests.k8s.helm_cli import run_helm, write_values
from tests.k8s.k8s_tier import KubeAPI, build_binaries, build_helm
from tests.k8s.pods import (
    COREX_SCRIPT,
    get_pod,
    gpu_pod,
    iluvatar_paths,
    new_namespace,
    request_ok,
    scheduling_failure,
    wait_running,
)
from tests.support.cli import ix_gpu
from tests.support.net import free_port
from tests.support.paths import EXAMPLES, ROOT, load_yaml
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(900)

RELEASE, NAMESPACE = "ixg", "ix-gpu-system"
WEBHOOK = f"{RELEASE}-ix-gpu-webhook"
NS_PATH = f"/api/v1/namespaces/{NAMESPACE}"
DEPLOYMENT = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{WEBHOOK}"
SECRET = f"{NS_PATH}/secrets/{WEBHOOK}-tls"
MWC_NAME = f"{RELEASE}-ix-gpu"
MWC = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{MWC_NAME}"
WEBHOOK_PODS = f"{NS_PATH}/pods?labelSelector=app.kubernetes.io/component%3Dwebhook"
PRIVILEGED_NS = "ml-team"  # the seed config's privileged namespace
INJECTED = "ix-gpu.io/injected"
SLEEP = ["sleep", "3600"]


def release_config(driver_root: Path) -> dict[str, Any]:
    """The built-in Iluvatar profile (its driver root moved to ``driver_root``) and seed 000's
    NVIDIA profile and privileged namespace (examples/seed-config.yaml), with the default workloads
    (Pods, kubeflow.org/v1 TFJobs, mlkube.io/v1beta1 TfJobs)."""
    config: dict[str, Any] = yaml.safe_load(ix_gpu("config", "default", check=True).stdout)
    seed = load_yaml(EXAMPLES / "seed-config.yaml")
    (iluvatar,) = [p for p in config["profiles"] if p["name"] == "iluvatar"]
    for volume in iluvatar["volumes"]:
        if volume["hostPath"] == "/usr/local/corex":
            volume["hostPath"] = str(driver_root)
    config["profiles"] = [iluvatar, *seed["profiles"]]
    config["policy"]["privilegedNamespaces"] = seed["policy"]["privilegedNamespaces"]
    return config


@dataclasses.dataclass
class Release:
    cluster: MiniCluster
    helm_binary: Path
    work: Path
    address: str
    values: dict[str, Any]
    upgrades: int = 0

    @property
    def api(self) -> KubeAPI:
        return self.cluster.api

    def helm(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return run_helm(
            self.helm_binary, self.cluster.kubeconfig, self.work, NAMESPACE, *args, timeout=timeout
        )

    def values_file(self) -> Path:
        self.upgrades += 1
        return write_values(self.work, self.values, self.upgrades)

    def webhook_pods(self) -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = request_ok(self.api, "GET", WEBHOOK_PODS)["items"]
        return [p for p in pods if "deletionTimestamp" not in p["metadata"]]

    def ready_endpoints(self) -> list[list[str]]:
        slices = request_ok(
            self.api,
            "GET",
            f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
            f"?labelSelector=kubernetes.io/service-name%3D{WEBHOOK}",
        )
        endpoints = [e for s in slices["items"] for e in s.get("endpoints") or []]
        return [e["addresses"] for e in endpoints if e["conditions"].get("ready")]

    def wait_serving(self, what: str, timeout: float = 120) -> None:
        """The Deployment available with one up-to-date replica, and its one endpoint ready."""

        def serving() -> bool:
            status = request_ok(self.api, "GET", DEPLOYMENT)["status"]
            available = status.get("availableReplicas") == 1 and status.get("updatedReplicas") == 1
            return available and self.ready_endpoints() == [[self.address]]

        wait_until(serving, what, timeout, interval=0.5, details=self._webhook_details)

    def plugin_logs(self) -> str:
        """The plugin pods' statuses and their containers' last logs (a failed start shows here)."""
        out = []
        pods = request_ok(
            self.api, "GET", f"{NS_PATH}/pods?labelSelector=app.kubernetes.io/component%3Ddevice-plugin"
        )
        for pod in pods["items"]:
            name = pod["metadata"]["name"]
            out.append(f"{name} on {pod['spec'].get('nodeName')}: {pod['status'].get('containerStatuses')}")
            for previous in ("true", "false"):
                log = self.api.request("GET", f"{NS_PATH}/pods/{name}/log?previous={previous}&tailLines=15")[
                    1
                ]
                out.append(f"  log (previous={previous}): {str(log)[-1500:]}")
        return "\n".join(out)

    def _webhook_details(self) -> str:
        return yaml.safe_dump(
            [
                {p["metadata"]["name"]: p.get("status", {}).get("containerStatuses")}
                for p in self.webhook_pods()
            ]
        )[-3000:]


@pytest.fixture(scope="module")
def release(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, k8s_log_dir: Path
) -> Iterator[Release]:
    if not _tier_requested(request.config):  # module scope: the tier's autouse gate comes later
        pytest.skip("real-Kubernetes tier: run with -m k8s (or IX_GPU_K8S=1)")
    address = host_address()
    if address is None:
        pytest.skip("no global IPv4 address on this machine (EndpointSlices refuse loopback ones)")
    helm = build_helm()
    work = tmp_path_factory.mktemp("chart-on-cluster")
    started = time.monotonic()
    nodes = node_specs(14)  # pod IPs apart from the other modules' clusters
    devices, driver_root = write_chart_inputs(work, nodes)
    with MiniCluster(
        work / "cluster",
        binaries=build_binaries(),
        nodes=nodes,
        plugin_config=None,  # the chart's DaemonSet runs the plugin
        log_dir=k8s_log_dir / "chart",
        node_ip=address,
        kubelet_config={"syncFrequency": "5s"},
    ) as mini:
        print(f"\nmini cluster up in {time.monotonic() - started:.1f}s: {mini.timings}")
        values = chart_values(mini.api.url, devices, driver_root, free_port(), release_config(driver_root))
        installed = Release(mini, helm, work, address, values)
        started = time.monotonic()
        chart = str(ROOT / "charts" / "ix-gpu")
        result = installed.helm(
            "install", RELEASE, chart, "--create-namespace", "-f", str(installed.values_file())
        )
        assert result.returncode == 0, result.stderr
        installed.wait_serving("the chart's webhook Deployment available with a ready endpoint")
        for spec in nodes:
            wait_until(
                lambda name=spec.name: (mini.node_resource(name) or (0, 0))[1] > 0,
                f"{spec.name}'s devices from the chart's plugin pod",
                90,
                interval=0.5,
                details=installed.plugin_logs,
            )
        print(f"helm install to a ready webhook endpoint: {time.monotonic() - started:.1f}s")
        yield installed


def dry_run(api: KubeAPI, namespace: str, body: dict[str, Any]) -> tuple[int, Any]:
    return api.request("POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", body)


def container_env(obj: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in obj["spec"]["containers"][0].get("env") or []}


# --------------------------------------------------------------------------- install


def test_install_plugin_pods_advertise_seed_004s_replicas_and_label_their_nodes(release: Release) -> None:
    api = release.api
    selector = f"{NS_PATH}/pods?labelSelector=app.kubernetes.io/component%3Ddevice-plugin"

    def started() -> list[dict[str, Any]] | None:
        # The kubelet's startup probe (httpGet /healthz on the pod IP, every 5 s) has passed.
        items: list[dict[str, Any]] = request_ok(api, "GET", selector)["items"]
        done = all(s.get("started") for p in items for s in p["status"].get("containerStatuses") or [])
        return items if done and len(items) == 2 else None

    pods = wait_until(started, "the plugin pods' startup probes passed", 60, interval=0.5)
    assert sorted(p["spec"]["nodeName"] for p in pods) == ["gpu-a", "gpu-b"], pods
    for pod in pods:
        # Started, and kept running, by the kubelet's startup and liveness probes.
        assert pod["status"]["phase"] == "Running", pod["status"]
        (status,) = pod["status"]["containerStatuses"]
        assert status["restartCount"] == 0, status
        log = str(request_ok(api, "GET", f"{NS_PATH}/pods/{pod['metadata']['name']}/log"))
        assert "registered iluvatar.com/gpu with the kubelet" in log, log[-2000:]
    # Two boards, one device each (splitboard: false), each shared by 4.
    assert release.cluster.node_resource("gpu-a") == (8, 8)
    assert release.cluster.node_resource("gpu-b") == (8, 8)
    for node, product, count in (("gpu-a", "BI-V150", "8"), ("gpu-b", "BI-V100", "8")):
        labels = (release.cluster.nodes[node].node() or {})["metadata"]["labels"]
        published = {k: v for k, v in labels.items() if k.startswith("ix-gpu.io/gpu.")}
        assert published["ix-gpu.io/gpu.product"] == product, published
        assert published["ix-gpu.io/gpu.vendor"] == "iluvatar", published
        assert (published["ix-gpu.io/gpu.count"], published["ix-gpu.io/gpu.replicas"]) == (count, "4")
        print(f"{node}: {published}")


def test_install_webhook_pod_owns_its_certificate_and_the_seed_pod_runs_with_its_driver(
    release: Release,
) -> None:
    api = release.api
    (pod,) = release.webhook_pods()
    assert pod["spec"]["hostNetwork"] is True and pod["spec"]["nodeName"] in release.cluster.nodes
    # Self mode: the webhook made its Secret, owned by the MutatingWebhookConfiguration (so that
    # helm uninstall, which deletes the configuration, garbage-collects it), and put its CA into
    # every webhook's caBundle.
    secret = request_ok(api, "GET", SECRET)
    mwc = request_ok(api, "GET", MWC)
    owner = {k: secret["metadata"]["ownerReferences"][0][k] for k in ("kind", "name", "uid")}
    assert owner == {"kind": "MutatingWebhookConfiguration", "name": MWC_NAME, "uid": mwc["metadata"]["uid"]}
    assert {w["clientConfig"]["caBundle"] for w in mwc["webhooks"]} == {secret["data"]["ca-bundle.crt"]}
    assert [w["name"] for w in mwc["webhooks"]] == [
        "pods.v1.ix-gpu.io",
        "tfjobs.v1.kubeflow.org.ix-gpu.io",
        "tfjobs.v1beta1.mlkube.io.ix-gpu.io",
    ]

    # The seed's corex-example, as the user wrote it (its ixsmi replaced by a script), runs with
    # the driver root and LD_LIBRARY_PATH from the chart's webhook and the devices from Allocate.
    namespace = f"corex-{secrets.token_hex(3)}"
    ns = new_namespace(api, namespace)
    corex = load_yaml(EXAMPLES / "gpu-pod.yaml")
    corex["spec"]["containers"][0].update(command=["sh", "-c", COREX_SCRIPT], args=[])
    request_ok(api, "POST", f"{ns}/pods", corex)
    running = wait_running(api, namespace, "corex-example")
    assert running["metadata"]["annotations"][INJECTED].startswith("iluvatar@")
    wait_until(
        lambda: "corex-example done" in str(api.request("GET", f"{ns}/pods/corex-example/log")[1]),
        "corex-example's output",
        30,
        interval=0.25,
    )
    log = str(api.request("GET", f"{ns}/pods/corex-example/log")[1])
    print(f"kubectl logs corex-example:\n{log}")
    lines = log.splitlines()
    assert "LD_LIBRARY_PATH=/usr/local/corex/lib64" in lines and "driver root: lib64 " in lines, log
    (record,) = [
        r for r in release.cluster.nodes[running["spec"]["nodeName"]].container_records()
        if (r["pod"]["namespace"], r["pod"]["name"]) == (namespace, "corex-example")
    ]  # fmt: skip
    devices = iluvatar_paths(record)
    assert devices and f"device nodes: {' '.join(devices)} " in lines, (record["devices"], log)
    env = dict(kv.split("=", 1) for kv in record["env"])
    assert f"IX_VISIBLE_DEVICES={env['IX_VISIBLE_DEVICES']}" in lines
    # The webhook pod logs JSON lines, read through the apiserver like `kubectl logs`.
    webhook_log = str(request_ok(api, "GET", f"{NS_PATH}/pods/{pod['metadata']['name']}/log"))
    records = [json.loads(line) for line in webhook_log.splitlines() if line.strip()]
    assert "namespace cache synced" in {r.get("message", r.get("msg")) for r in records}, webhook_log[-2000:]
    request_ok(api, "DELETE", ns)


# --------------------------------------------------------------------------- GPU type


def test_gpu_type_annotation_schedules_onto_the_node_with_that_model(release: Release) -> None:
    api = release.api

    def product(node: str) -> str | None:
        labels = (release.cluster.nodes[node].node() or {}).get("metadata", {}).get("labels", {})
        value = labels.get("ix-gpu.io/gpu.product")
        return str(value) if value else None

    # Published by each node's plugin, in the one spelling the webhook's affinity uses.
    assert wait_until(lambda: product("gpu-a"), "gpu-a's product label", 30) == "BI-V150"
    assert wait_until(lambda: product("gpu-b"), "gpu-b's product label", 30) == "BI-V100"

    namespace = f"gpu-type-{secrets.token_hex(3)}"
    ns = new_namespace(api, namespace)
    # The model as a user writes it, with or without the vendor; no node pinning.
    for name, model in (("v100", "BI-V100"), ("v100-vendor", "Iluvatar BI-V100")):
        request_ok(api, "POST", f"{ns}/pods", gpu_pod(name, None, SLEEP, {"ix-gpu.io/gpu-type": model}))
    for name in ("v100", "v100-vendor"):
        assert wait_running(api, namespace, name)["spec"]["nodeName"] == "gpu-b"

    request_ok(api, "POST", f"{ns}/pods", gpu_pod("unknown", None, SLEEP, {"ix-gpu.io/gpu-type": "BI-V999"}))
    event = scheduling_failure(api, namespace, "unknown")
    print(f"unknown model: {event['reason']}: {event['message']}")
    assert "didn't match Pod's node affinity/selector" in event["message"], event
    pending = get_pod(api, namespace, "unknown")
    assert pending is not None and pending["status"]["phase"] == "Pending"
    terms = pending["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expressions = [e for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]]
    assert {"key": "ix-gpu.io/gpu.product", "operator": "In", "values": ["BI-V999"]} in expressions
    request_ok(api, "DELETE", ns)


# --------------------------------------------------------------------------- seed 000


def kubeflow_tfjob(name: str) -> dict[str, Any]:
    """The seed's TfJob in its kubeflow.org/v1 form: one GPU Master."""
    container = {
        "name": "tensorflow",
        "image": "gcr.io/project/tf_smoke_cmle-375-20:latest",
        "args": ["--gpu"],
        "resources": {"limits": {"nvidia.com/gpu": 1}},
    }
    template = {"metadata": {}, "spec": {"containers": [container], "restartPolicy": "OnFailure"}}
    master = {"replicas": 1, "restartPolicy": "OnFailure", "template": template}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name},
        "spec": {"tfReplicaSpecs": {"Master": master}},
    }


def test_seed_000_tfjobs_are_stored_injected_and_privileged_only_where_allowed(release: Release) -> None:
    api = release.api
    legacy = install_crd(api, LEGACY_TFJOB_CRD)
    kubeflow = install_crd(api, kubeflow_tfjob_crd())
    other = f"other-team-{secrets.token_hex(3)}"
    for namespace in (PRIVILEGED_NS, other):
        new_namespace(api, namespace)
    seed_job = load_yaml(EXAMPLES / "seed-tfjob.yaml")

    def stored(namespace: str) -> dict[str, tuple[dict[str, Any], list[str]]]:
        out = {}
        for kind, group_version, job, template_of in (
            ("TfJob", legacy, copy.deepcopy(seed_job), lambda j: j["spec"]["replica_specs"][0]["template"]),
            (
                "TFJob",
                kubeflow,
                kubeflow_tfjob("tf-smoke-gpu"),
                lambda j: j["spec"]["tfReplicaSpecs"]["Master"]["template"],
            ),
        ):
            path = f"{group_version}/namespaces/{namespace}/tfjobs"
            status, body, warnings = api.request_with_warnings("POST", path, job)
            assert status == 201, body
            out[kind] = (template_of(request_ok(api, "GET", f"{path}/{job['metadata']['name']}")), warnings)
        return out

    for kind, (template, warnings) in stored(PRIVILEGED_NS).items():
        # The seed's hand-written TfJob: /dev/nvidia* by hostPath, the CUDA libraries, privileged.
        assert template["metadata"]["annotations"][INJECTED].startswith("nvidia@"), kind
        spec = template["spec"]
        host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        assert {"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"} <= host_paths, (kind, spec["volumes"])
        container = spec["containers"][0]
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert {"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"} <= mounts, kind
        assert container_env(template)["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64", kind
        assert container["securityContext"]["privileged"] is True, kind
        assert warnings == [], (kind, warnings)

    for kind, (template, warnings) in stored(other).items():
        # Outside the allowlist: the same devices and env, no privileged, and the user is told.
        assert template["metadata"]["annotations"][INJECTED].startswith("nvidia@"), kind
        container = template["spec"]["containers"][0]
        assert "privileged" not in (container.get("securityContext") or {}), (kind, container)
        assert container_env(template)["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64", kind
        expected = f'privileged not set: namespace "{other}" is not in policy.privilegedNamespaces'
        assert any(w.endswith(expected) for w in warnings), (kind, warnings)
        print(f"{kind} in {other}: warning {warnings}")
    request_ok(api, "DELETE", f"/api/v1/namespaces/{other}")


# --------------------------------------------------------------------------- a Deployment


def test_a_deployment_of_three_gpu_replicas_is_mutated_scheduled_allocated_and_running(
    release: Release,
) -> None:
    api = release.api
    namespace = f"deploy-{secrets.token_hex(3)}"
    ns = new_namespace(api, namespace)
    labels = {"app": "trainer"}
    template = gpu_pod("unused", None, SLEEP)
    template["metadata"] = {"labels": labels}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "trainer"},
        "spec": {"replicas": 3, "selector": {"matchLabels": labels}, "template": template},
    }
    request_ok(api, "POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment)

    def three_running() -> list[dict[str, Any]] | None:
        pods = request_ok(api, "GET", f"{ns}/pods?labelSelector=app%3Dtrainer")["items"]
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return running if len(running) == 3 else None

    pods = wait_until(three_running, "3 running replicas of Deployment trainer", 90, interval=0.5)
    for pod in pods:
        name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        assert pod["metadata"]["annotations"][INJECTED].startswith("iluvatar@"), name
        assert container_env(pod)["LD_LIBRARY_PATH"] == "/usr/local/corex/lib64", name
        (record,) = [
            r for r in release.cluster.nodes[node].container_records()
            if (r["pod"]["namespace"], r["pod"]["name"]) == (namespace, name)
        ]  # fmt: skip
        env = dict(kv.split("=", 1) for kv in record["env"])
        assert iluvatar_paths(record) and env.get("IX_VISIBLE_DEVICES"), (name, record)
    print(f"trainer replicas on {sorted(p['spec']['nodeName'] for p in pods)}")
    request_ok(api, "DELETE", ns)


# --------------------------------------------------------------------------- without the webhook


def scale_webhook(release: Release, replicas: int) -> None:
    status, reply = release.api.request(
        "PATCH",
        f"{DEPLOYMENT}/scale",
        {"spec": {"replicas": replicas}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, reply


def test_failure_policy_fail_refuses_gpu_pods_only_while_no_webhook_pod_runs(release: Release) -> None:
    api = release.api
    namespace = f"no-webhook-{secrets.token_hex(3)}"
    ns = new_namespace(api, namespace)
    scale_webhook(release, 0)
    wait_until(
        lambda: not release.webhook_pods() and not release.ready_endpoints(),
        "the webhook pods gone",
        60,
        interval=0.5,
    )
    try:
        status, reply = api.request("POST", f"{ns}/pods", gpu_pod("refused", None, SLEEP))
        print(f"GPU pod without webhook pods: {status} {reply.get('message')}")
        assert status == 500 and 'failed calling webhook "pods.v1.ix-gpu.io"' in reply["message"], reply
        cpu = gpu_pod("cpu-only", None, SLEEP)
        del cpu["spec"]["containers"][0]["resources"]
        request_ok(api, "POST", f"{ns}/pods", cpu)  # never sent: the matchConditions
        assert wait_running(api, namespace, "cpu-only")["metadata"].get("annotations") is None
    finally:
        scale_webhook(release, 1)
    release.wait_serving("the webhook back with a ready endpoint")
    request_ok(api, "POST", f"{ns}/pods", gpu_pod("accepted", None, SLEEP))
    assert wait_running(api, namespace, "accepted")["metadata"]["annotations"][INJECTED].startswith(
        "iluvatar@"
    )
    request_ok(api, "DELETE", ns)


def upgrade(release: Release) -> None:
    """``helm upgrade`` with ``release.values``."""
    chart = str(ROOT / "charts" / "ix-gpu")
    result = release.helm("upgrade", RELEASE, chart, "-f", str(release.values_file()))
    assert result.returncode == 0, result.stderr


def test_a_config_that_fails_to_load_keeps_the_new_pod_unready_and_the_running_one_serving(
    release: Release,
) -> None:
    """A config the values schema accepts but the webhook refuses (two profiles of one name: JSON
    Schema cannot say "unique by name"), rolled out with ``helm upgrade``."""
    api = release.api
    namespace = f"bad-config-{secrets.token_hex(3)}"
    new_namespace(api, namespace)
    good = copy.deepcopy(release.values["config"])
    release.values["config"]["profiles"].append(copy.deepcopy(good["profiles"][0]))
    (running,) = release.webhook_pods()
    old_log = f"{NS_PATH}/pods/{running['metadata']['name']}/log"
    try:
        upgrade(release)
        # The running pod keeps its last good config, says so, and stays ready.
        wait_until(
            lambda: "duplicate profile name" in str(api.request("GET", old_log)[1]),
            "the running webhook's reload error",
            60,
            interval=1,
        )
        assert release.ready_endpoints() == [[release.address]]
        status, created = dry_run(api, namespace, gpu_pod("still-served", None, SLEEP))
        assert status == 201 and created["metadata"]["annotations"][INJECTED].startswith("iluvatar@"), created

        # A new pod cannot load it: it exits with the reason and never becomes ready, so the
        # endpoint stays unready and the apiserver sends it nothing; GPU pods are refused.
        request_ok(api, "DELETE", f"{NS_PATH}/pods/{running['metadata']['name']}")

        def failed_new_pod() -> dict[str, Any] | None:
            for pod in release.webhook_pods():
                if pod["metadata"]["uid"] == running["metadata"]["uid"]:
                    continue
                for status in pod["status"].get("containerStatuses") or []:
                    state = status["state"].get("terminated") or {}
                    exited = status.get("lastState", {}).get("terminated") or state
                    if exited.get("exitCode") == 2:
                        return pod
            return None

        new = wait_until(failed_new_pod, "the new webhook pod failing on the config", 90, interval=0.5)
        ready = [c for c in new["status"].get("conditions", []) if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "False", new["status"]
        assert release.ready_endpoints() == []
        new_log = str(api.request("GET", f"{NS_PATH}/pods/{new['metadata']['name']}/log?previous=true")[1])
        print(f"new webhook pod, previous container's log:\n{new_log[-600:]}")
        reason = "profiles: Value error, duplicate profile name 'iluvatar' (profiles[0] and profiles[2])"
        assert "invalid config" in new_log and reason in new_log, new_log
        refused = gpu_pod("refused", None, SLEEP)
        status, reply = api.request("POST", f"/api/v1/namespaces/{namespace}/pods", refused)
        assert status == 500 and "failed calling webhook" in reply["message"], reply
    finally:
        release.values["config"] = good
        upgrade(release)
    # Back to the good config: a fresh pod (no crash-loop back-off to wait out) becomes ready.
    for pod in release.webhook_pods():
        api.request("DELETE", f"{NS_PATH}/pods/{pod['metadata']['name']}")
    release.wait_serving("the webhook ready again on the good config")
    status, created = dry_run(api, namespace, gpu_pod("served-again", None, SLEEP))
    assert status == 201 and created["metadata"]["annotations"][INJECTED].startswith("iluvatar@"), created
    request_ok(api, "DELETE", f"/api/v1/namespaces/{namespace}")


# --------------------------------------------------------------------------- helm upgrade, test, uninstall


def test_helm_upgrade_reloads_the_config_in_place_and_keeps_the_ca(release: Release) -> None:
    api = release.api
    namespace = f"upgrade-{secrets.token_hex(3)}"
    new_namespace(api, namespace)
    ca_before = request_ok(api, "GET", SECRET)["data"]["ca.crt"]
    bundles_before = {w["clientConfig"]["caBundle"] for w in request_ok(api, "GET", MWC)["webhooks"]}
    (pod_before,) = release.webhook_pods()
    iluvatar = release.values["config"]["profiles"][0]
    iluvatar["env"].append({"name": "IX_GPU_RELEASE", "value": "upgraded"})
    release.values["webhook"]["timeoutSeconds"] = 7
    started = time.monotonic()
    upgrade(release)

    def upgraded_env() -> dict[str, Any] | None:
        status, created = dry_run(api, namespace, gpu_pod("after-upgrade", None, SLEEP))
        assert status == 201, created
        return created if container_env(created).get("IX_GPU_RELEASE") == "upgraded" else None

    wait_until(upgraded_env, "the upgraded config served", 90, interval=1)
    print(f"helm upgrade to the new config served: {time.monotonic() - started:.1f}s")
    mwc = request_ok(api, "GET", MWC)
    assert {w["timeoutSeconds"] for w in mwc["webhooks"]} == {7}
    assert {w["clientConfig"]["caBundle"] for w in mwc["webhooks"]} == bundles_before
    assert request_ok(api, "GET", SECRET)["data"]["ca.crt"] == ca_before
    (pod_after,) = release.webhook_pods()
    assert pod_after["metadata"]["uid"] == pod_before["metadata"]["uid"], "reloaded, not restarted"
    request_ok(api, "DELETE", f"/api/v1/namespaces/{namespace}")


def test_helm_test_dry_runs_a_gpu_pod_through_the_webhook(release: Release) -> None:
    result = release.helm("test", RELEASE, "--timeout", "120s", "--logs")
    print(result.stdout[-1500:])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Succeeded" in result.stdout and "injected" in result.stdout, result.stdout


def test_seed_004_gpu_a_holds_eight_pods_and_a_ninth_is_pending(release: Release) -> None:
    """Seed 004's arithmetic through the chart's plugin: 2 boards x 4 replicas on gpu-a, each board
    handed out exactly 4 times; the ninth pod waits with the scheduler's reason."""
    api = release.api
    namespace = f"fill-a-{secrets.token_hex(3)}"
    ns = new_namespace(api, namespace)
    names = [f"holder-{i}" for i in range(8)]
    for name in names:
        request_ok(api, "POST", f"{ns}/pods", gpu_pod(name, "gpu-a", SLEEP))
    for name in names:  # pods of earlier tests may still be releasing their replicas
        wait_running(api, namespace, name, timeout=120)
    records = [
        r for r in release.cluster.nodes["gpu-a"].container_records()
        if r["pod"]["namespace"] == namespace and not r.get("removed")
    ]  # fmt: skip
    boards = collections.Counter(iluvatar_paths(r) for r in records)
    board0, board1 = ("/dev/iluvatar0", "/dev/iluvatar1"), ("/dev/iluvatar2", "/dev/iluvatar3")
    assert boards == {board0: 4, board1: 4}, boards
    request_ok(api, "POST", f"{ns}/pods", gpu_pod("ninth", "gpu-a", SLEEP))
    event = scheduling_failure(api, namespace, "ninth")
    print(f"ninth pod: {event['reason']}: {event['message']}")
    assert "Insufficient iluvatar.com/gpu" in event["message"], event
    ninth = get_pod(api, namespace, "ninth")
    assert ninth is not None and ninth["status"]["phase"] == "Pending" and "nodeName" not in ninth["spec"]
    request_ok(api, "DELETE", ns)


def test_helm_uninstall_leaves_nothing_behind_and_gpu_pods_are_then_admitted_unmodified(
    release: Release,
) -> None:
    api = release.api
    # A label the operator set stays; the ones the plugins published go (the post-delete hook).
    operator_label = {"metadata": {"labels": {"ix-gpu.io/device-plugin.config": "custom"}}}
    status, reply = api.request(
        "PATCH", "/api/v1/nodes/gpu-b", operator_label, content_type="application/merge-patch+json"
    )
    assert status == 200, reply
    result = release.helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
    assert result.returncode == 0, result.stderr
    namespaced = (
        "/api/v1/namespaces/{ns}/configmaps",
        "/api/v1/namespaces/{ns}/secrets",
        "/api/v1/namespaces/{ns}/serviceaccounts",
        "/api/v1/namespaces/{ns}/services",
        "/api/v1/namespaces/{ns}/pods",
        "/apis/apps/v1/namespaces/{ns}/deployments",
        "/apis/apps/v1/namespaces/{ns}/replicasets",
        "/apis/apps/v1/namespaces/{ns}/daemonsets",
        "/apis/apps/v1/namespaces/{ns}/controllerrevisions",
        "/apis/batch/v1/namespaces/{ns}/jobs",
        "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    )
    cluster_wide = (
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    )
    # What every namespace has without us (kube-root-ca.crt, the default ServiceAccount).
    baseline = {"ConfigMap/kube-root-ca.crt", "ServiceAccount/default"}

    def left_behind() -> list[str]:
        left = []
        for path in namespaced:
            for ns in (NAMESPACE, "default"):
                for item in request_ok(api, "GET", path.format(ns=ns))["items"]:
                    name = item["metadata"]["name"]
                    kind = path.rsplit("/", 1)[-1]
                    ours = RELEASE in name or "ix-gpu" in name  # in "default": the helm test's
                    if (ns == NAMESPACE and f"{_kind(kind)}/{name}" not in baseline) or ours:
                        left.append(f"{ns}/{kind}/{name}")
        for path in cluster_wide:
            for item in request_ok(api, "GET", path)["items"]:
                if item["metadata"]["name"].startswith(f"{RELEASE}-"):
                    left.append(f"{path.rsplit('/', 1)[-1]}/{item['metadata']['name']}")
        return left

    wait_until(
        lambda: not left_behind(),
        "nothing of the release left",
        60,
        interval=1,
        details=lambda: str(left_behind()),
    )
    for node in ("gpu-a", "gpu-b"):
        node_labels = (release.cluster.nodes[node].node() or {})["metadata"]["labels"]
        assert not [k for k in node_labels if k.startswith("ix-gpu.io/gpu.")], (node, node_labels)
    assert (release.cluster.nodes["gpu-b"].node() or {})["metadata"]["labels"][
        "ix-gpu.io/device-plugin.config"
    ] == "custom"
    # The plugins said "all Unhealthy" on SIGTERM: nothing is allocatable any more.
    for node in ("gpu-a", "gpu-b"):
        wait_until(
            lambda node=node: (release.cluster.node_resource(node) or (0, 0))[1] == 0,
            f"nothing allocatable on {node}",
            60,
            interval=0.5,
        )
    namespace = f"after-{secrets.token_hex(3)}"
    new_namespace(api, namespace)
    status, created = dry_run(api, namespace, gpu_pod("unmodified", None, SLEEP))
    assert status == 201, created
    assert INJECTED not in (created["metadata"].get("annotations") or {})
    assert "LD_LIBRARY_PATH" not in container_env(created)
    request_ok(api, "DELETE", f"/api/v1/namespaces/{namespace}")


def _kind(collection: str) -> str:
    return {"configmaps": "ConfigMap", "serviceaccounts": "ServiceAccount"}.get(collection, collection)
