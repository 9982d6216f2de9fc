"""The webhook arms of a burst (``bench/scale.py --webhook none|go|ix-gpu``): the same cluster and
the same burst with no webhook, with a Go reference webhook and with ix-gpu's, so what each webhook
adds to a burst is seen side by side (``burst_compare.py`` runs them in turn and compares).

- ``ix-gpu``: the chart itself (``burst_webhook.ChartWebhook``; ``HostWebhook`` on fake-cri).
- ``none``: no MutatingWebhookConfiguration at all. Each pod is created carrying what the ix-gpu
  webhook would have added to it: its mutation (``ix_gpu.webhook.core.mutation.mutate``, with the
  config the chart's ConfigMap renders for the burst's values, and the namespace's facts as the burst
  made them) is applied to the pod before its create, so opted-out namespaces' pods stay bare as
  they do under ix-gpu, and the kubelet and scheduler see the same pods. Checked afterwards: every
  stored pod outside the opted-out namespaces is one the webhook would leave unchanged.
- ``go``: ``bench/go-webhook`` (Go standard library), ``CGO_ENABLED=0``, in a scratch image built
  with buildah as ``tests/k8s/build-images.sh`` builds its images (cached under
  ``~/.cache/ix-gpu/images/go-webhook-<hash>.tar``) and imported into the real nodes' containerd;
  deployed as the chart deploys ix-gpu's: ``replicas`` replicas with the chart's resources, security
  contexts, node selector and preferred anti-affinity, behind a Service (443 to 8443), and a
  MutatingWebhookConfiguration that is the chart's own as rendered for the burst's values (rules,
  namespace and object selectors, matchConditions, failurePolicy Fail, timeout, reinvocation), its
  clientConfig pointed at the Go Service with a CA made here. Ready once a dry-run GPU pod comes
  back injected. The Go webhook does not read namespaces, so it does not honour opt-outs, and it
  adds no node affinity for ``ix-gpu.io/gpu-type`` (the burst's affinity pods are scheduled without
  one) and no record of injected items; its driver hostPath is its built-in ``/usr/local/corex``.
  Its ``/metrics`` is one counter of the reviews it answered, read from each replica as ix-gpu's
  histogram is, to see how the apiserver shared the burst among the replicas.
Only the ix-gpu arm installs the chart, so only it has the chart's device plugin DaemonSet and its
ValidatingAdmissionPolicy on Node writes.

The none and go arms need ``runtime="containerd"`` and have no ``webhook-kill``.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from ix_gpu.config.webhook_config import WebhookConfig, parse_config
from ix_gpu.devicemodel import labels
from ix_gpu.kube.kubeconfig import read_kubeconfig
from ix_gpu.webhook.certs.authority import generate_bundle
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import NamespaceFacts
from ix_gpu.webhook.core.mutation import mutate
from tests.k8s.burst_webhook import (
    CHART,
    RELEASE,
    ChartWebhook,
    HostWebhook,
    KilledReplicas,
    WebhookUnderTest,
    pod_metrics,
    webhook_values,
)
from tests.k8s.chart_values import real_node_chart_values
from tests.k8s.cluster import MiniCluster
from tests.k8s.histograms import added, buckets_of, buckets_quantile, ms
from tests.k8s.k8s_tier import KubeAPI, build_helm
from tests.k8s.pods import request_ok
from tests.k8s.real_nodes import container_pids
from tests.k8s.real_release import Release
from tests.support.paths import ROOT
from tests.support.waiting import wait_until

ARMS = ("none", "go", "ix-gpu")
GO_SOURCE = ROOT / "bench" / "go-webhook"
CACHE = Path(os.environ.get("IX_GPU_CACHE", Path.home() / ".cache" / "ix-gpu"))
GO_NAME = "go-webhook"
GO_PATH = f"/api/v1/namespaces/{GO_NAME}"
GO_PORT = 8443
GO_ARGS = ("-cert", "/certs/tls.crt", "-key", "/certs/tls.key", "-addr", f":{GO_PORT}")
GPU = "iluvatar.com/gpu"
"""The resource the burst's pods ask for (and the only one the Go webhook injects for)."""
MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
FactsOf = Callable[[str], NamespaceFacts]
"""A namespace's facts (labels, annotations) as the burst created it, by name."""


@dataclass
class ChartRender:
    """charts/ix-gpu as ``helm template`` renders it for the burst's values."""

    config: WebhookConfig
    """The webhook's config as its ConfigMap holds it."""
    webhook_configuration: dict[str, Any]
    deployment: dict[str, Any]
    """The webhook's Deployment."""


def render_chart(
    cluster: MiniCluster, work: Path, replicas: int, cpu_request: str | None = None
) -> ChartRender:
    assert cluster.real_nodes is not None and cluster.real_nodes.images is not None
    values = real_node_chart_values(cluster.real_nodes.images)
    values["webhook"] = webhook_values(replicas, cpu_request)
    release = Release(cluster, build_helm(), work, values)
    out = release.helm("template", RELEASE, str(CHART), "-f", str(release.values_file()), timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"helm template: {out.stdout}{out.stderr}")
    docs = [d for d in yaml.safe_load_all(out.stdout) if isinstance(d, dict)]

    def webhook_doc(kind: str) -> dict[str, Any]:
        (doc,) = [
            d
            for d in docs
            if d["kind"] == kind
            and (kind == "MutatingWebhookConfiguration" or d["metadata"]["name"].endswith("-webhook"))
        ]
        return doc

    config = parse_config(yaml.safe_load(webhook_doc("ConfigMap")["data"]["config.yaml"]), "chart")
    return ChartRender(config, webhook_doc("MutatingWebhookConfiguration"), webhook_doc("Deployment"))


class PreApplied:
    """The none arm's pods: each with the ix-gpu mutation for its namespace already applied."""

    def __init__(self, config: WebhookConfig, facts: FactsOf) -> None:
        self.compiled = CompiledConfig(config)
        self.facts = facts

    def __call__(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        result = mutate(pod, "CREATE", self.facts(namespace), self.compiled)
        if not result.allowed:
            raise RuntimeError(f"the ix-gpu mutation denies the burst's pod: {result.reason}")
        return jsonpatch.apply_patch(pod, result.ops) if result.ops else pod

    def lacking(self, pod: dict[str, Any]) -> bool:
        """The stored ``pod`` is one the webhook would still change (it lacks a pre-applied field)."""
        return bool(mutate(pod, "CREATE", self.facts(pod["metadata"]["namespace"]), self.compiled).ops)


class NoWebhook:
    """The none arm: nothing runs, nothing is counted."""

    def __init__(self) -> None:
        self.killed = KilledReplicas()

    def replica_pids(self) -> dict[str, list[int]]:
        return {}

    def metrics(self) -> list[str]:
        return []

    def kill_one(self) -> dict[str, Any]:
        raise RuntimeError("webhook-kill: no webhook in the none arm")


def go_image() -> tuple[Path, str]:
    """The Go webhook's scratch image as a docker archive, and its reference (built once per
    binary; ``go`` and ``buildah`` as the tier's images need them)."""
    binary = CACHE / "go-webhook-static"
    env = {**os.environ, "CGO_ENABLED": "0"}
    build = ["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(binary), "."]
    subprocess.run(build, cwd=GO_SOURCE, env=env, check=True)
    key = hashlib.sha256(binary.read_bytes()).hexdigest()[:16]
    ref, archive = f"localhost/{GO_NAME}:{key}", CACHE / "images" / f"{GO_NAME}-{key}.tar"
    if archive.exists():
        return archive, ref
    archive.parent.mkdir(parents=True, exist_ok=True)
    buildah = ["buildah", "--root", str(CACHE / "buildah"), "--runroot", "/run/ix-gpu-buildah"]
    buildah += ["--storage-driver", "overlay"]

    def run(*args: str) -> str:
        return subprocess.run([*buildah, *args], capture_output=True, text=True, check=True).stdout.strip()

    with open(CACHE / ".images.lock", "w") as lock:  # build-images.sh's lock on buildah's storage
        fcntl.flock(lock, fcntl.LOCK_EX)
        ctr = run("from", "scratch")
        run("copy", "--chmod", "0755", ctr, str(binary), f"/{GO_NAME}")
        run("config", "--entrypoint", f'["/{GO_NAME}"]', "--cmd", "", "--user", "65532:65532", ctr)
        run("commit", "-q", ctr, ref)
        run("rm", ctr)
        tmp = archive.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        run("push", "-q", ref, f"docker-archive:{tmp}:{ref}")
        tmp.rename(archive)
    for old in archive.parent.glob(f"{GO_NAME}-*.tar"):
        if old != archive:
            old.unlink()
    return archive, ref


def go_deployment(render: ChartRender, ref: str, replicas: int, digest: str) -> dict[str, Any]:
    """The Go webhook's Deployment: the chart's pod settings (security contexts, resources, node
    selector, tolerations, its default preferred anti-affinity) around the Go binary."""
    chart_pod = render.deployment["spec"]["template"]["spec"]
    chart_container = next(c for c in chart_pod["containers"] if c["name"] == "webhook")
    selector = {"app": GO_NAME}
    spread = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": selector}}
    preferred = {"weight": 100, "podAffinityTerm": spread}
    container = {
        "name": "webhook",
        "image": ref,
        "imagePullPolicy": "Never",
        "args": [*GO_ARGS, "-digest", digest],
        "ports": [{"name": "https", "containerPort": GO_PORT}],
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": GO_PORT, "scheme": "HTTPS"},
            "periodSeconds": 2,
        },
        "resources": chart_container.get("resources", {}),
        "securityContext": chart_container.get("securityContext", {}),
        "volumeMounts": [{"name": "certs", "mountPath": "/certs", "readOnly": True}],
    }
    spec: dict[str, Any] = {
        "securityContext": chart_pod.get("securityContext", {}),
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [preferred]}},
        "nodeSelector": chart_pod.get("nodeSelector", {}),
        "tolerations": chart_pod.get("tolerations", []),
        "containers": [container],
        "volumes": [{"name": "certs", "secret": {"secretName": f"{GO_NAME}-tls"}}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": GO_NAME},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": selector}, "spec": spec},
        },
    }


def go_configuration(render: ChartRender, ca: bytes) -> dict[str, Any]:
    """The chart's MutatingWebhookConfiguration, each webhook's clientConfig pointed at the Go
    Service (port 443, as the chart's servicePort) with ``ca``; everything else as rendered."""
    configuration = {k: v for k, v in render.webhook_configuration.items() if k != "metadata"}
    configuration["metadata"] = {"name": GO_NAME}
    service = {"name": GO_NAME, "namespace": GO_NAME, "path": "/mutate", "port": 443}
    for webhook in configuration["webhooks"]:
        webhook["clientConfig"] = {"service": service, "caBundle": base64.b64encode(ca).decode()}
    return configuration


def dry_run_injected(api: KubeAPI, resource: str) -> bool:
    """A GPU pod created with ``dryRun=All`` in ``default`` comes back injected."""
    container = {"name": "main", "image": "busybox", "resources": {"limits": {resource: "1"}}}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "arm-probe"},
        "spec": {"containers": [container]},
    }
    status, reply = api.request("POST", "/api/v1/namespaces/default/pods?dryRun=All", pod, timeout=10)
    annotations = (reply.get("metadata") or {}).get("annotations") or {} if isinstance(reply, dict) else {}
    return status == 201 and labels.INJECTED in annotations


class GoWebhook:
    """``bench/go-webhook`` deployed as the chart deploys ix-gpu's (see the module doc)."""

    def __init__(self, cluster: MiniCluster, render: ChartRender, replicas: int) -> None:
        assert cluster.real_nodes is not None
        started = time.monotonic()
        self.api = cluster.api
        self.killed = KilledReplicas()
        archive, self.image = go_image()
        for node in cluster.real_nodes.nodes.values():
            node.import_image(archive)
        bundle = generate_bundle([f"{GO_NAME}.{GO_NAME}.svc", f"{GO_NAME}.{GO_NAME}.svc.cluster.local"], [])
        secret_data = {"tls.crt": bundle.cert, "tls.key": bundle.key}
        secret = {
            "metadata": {"name": f"{GO_NAME}-tls"},
            "type": "kubernetes.io/tls",
            "data": {k: base64.b64encode(v).decode() for k, v in secret_data.items()},
        }
        service = {
            "metadata": {"name": GO_NAME},
            "spec": {"selector": {"app": GO_NAME}, "ports": [{"port": 443, "targetPort": GO_PORT}]},
        }
        request_ok(self.api, "POST", "/api/v1/namespaces", {"metadata": {"name": GO_NAME}})
        request_ok(self.api, "POST", f"{GO_PATH}/secrets", secret)
        request_ok(self.api, "POST", f"{GO_PATH}/services", service)
        deployment = go_deployment(render, self.image, replicas, render.config.digest())
        request_ok(self.api, "POST", f"/apis/apps/v1/namespaces/{GO_NAME}/deployments", deployment)
        wait_until(
            lambda: len(self.replica_pids()) == replicas, "Go webhook replicas Ready", 180, interval=0.5
        )
        request_ok(self.api, "POST", MWC_PATH, go_configuration(render, bundle.ca_cert))
        wait_until(lambda: dry_run_injected(self.api, GPU), "Go webhook injects", 120, interval=0.5)
        self.install_s = round(time.monotonic() - started, 1)

    def pods(self) -> list[dict[str, Any]]:
        listed = request_ok(self.api, "GET", f"{GO_PATH}/pods?labelSelector=app%3D{GO_NAME}")
        return [p for p in listed["items"] if "deletionTimestamp" not in p["metadata"]]

    def replica_pids(self) -> dict[str, list[int]]:
        return {p["metadata"]["name"]: container_pids(p, "webhook") for p in self.pods() if _ready(p)}

    def metrics(self) -> list[str]:
        return [pod_metrics(pod, GO_PORT) for pod in self.pods()]  # its review counter

    def kill_one(self) -> dict[str, Any]:
        raise RuntimeError("webhook-kill: only the ix-gpu arm")


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@dataclass
class Arm:
    """One arm as a burst runs it: its webhook, what it does to each pod before its create (the
    none arm's pre-applied mutation), and what it adds to the run's figures."""

    name: str
    webhook: WebhookUnderTest
    prepare: PreApplied | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def checks(self, api: KubeAPI, created: set[str], opted_out: Callable[[str], bool]) -> dict[str, Any]:
        """The arm's own checks, read from the stored pods: for none, the pods outside opted-out
        namespaces that lack a pre-applied field (must be 0); for go, that its opt-out check is
        skipped."""
        if self.name == "go":
            return {
                "opt_out_check": "skipped: the Go webhook does not read namespaces, so honours no opt-out"
            }
        if self.prepare is None:
            return {}
        lacking, token = [], ""
        while True:
            listed = request_ok(
                api, "GET", "/api/v1/pods?limit=500" + (f"&continue={token}" if token else "")
            )
            for pod in listed["items"]:
                meta = pod["metadata"]
                key = f"{meta['namespace']}/{meta['name']}"
                if key in created and not opted_out(meta["namespace"]) and self.prepare.lacking(pod):
                    lacking.append(key)
            token = listed["metadata"].get("continue") or ""
            if not token:
                return {"preapplied_pods_lacking": len(lacking), "preapplied_lacking_examples": lacking[:3]}


def start_arm(
    name: str,
    cluster: MiniCluster,
    work: Path,
    runtime: str,
    replicas: int,
    facts: FactsOf,
    cpu_request: str | None = None,
) -> Arm:
    """The arm ``name`` on ``cluster``, its webhook serving (or, for none, its pods' mutation
    ready). ``cpu_request``: the replicas' CPU request in place of the chart's, both webhooks."""
    if name == "ix-gpu":
        if runtime != "containerd":
            return Arm(name, HostWebhook(cluster))
        chart = ChartWebhook(cluster, work, replicas, cpu_request)
        return Arm(name, chart, info={"replicas": replicas, "helm_install_s": chart.install_s})
    if name not in ARMS:
        raise ValueError(f"webhook {name!r}: one of {', '.join(ARMS)}")
    if runtime != "containerd":
        raise ValueError(f"the {name} arm needs runtime containerd")
    render = render_chart(cluster, work, replicas, cpu_request)
    if name == "none":
        return Arm(name, NoWebhook(), PreApplied(render.config, facts))
    go = GoWebhook(cluster, render, replicas)
    return Arm(name, go, info={"replicas": replicas, "go_install_s": go.install_s, "go_image": go.image})


SCHEDULER_SLI = "scheduler_pod_scheduling_sli_duration_seconds"
SCHEDULER_ATTEMPT = "scheduler_scheduling_attempt_duration_seconds"


def scheduler_metrics(cluster: MiniCluster) -> str:
    """kube-scheduler's /metrics, read with the cluster's admin credentials ("" if unreadable)."""
    assert cluster.scheduler is not None
    args = [str(a) for a in cluster.scheduler.popen.args]  # type: ignore[union-attr]
    port = next(a.split("=", 1)[1] for a in args if a.startswith("--secure-port="))
    server = read_kubeconfig(cluster.kubeconfig)
    context = server.ssl_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the scheduler's self-signed serving cert
    headers = {"Authorization": f"Bearer {server.token}"} if isinstance(server.token, str) else {}
    request = urllib.request.Request(f"https://127.0.0.1:{port}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, context=context, timeout=15) as answer:
            return str(answer.read().decode())
    except OSError:
        return ""


def scheduler_figures(before: str, after: str) -> dict[str, Any]:
    """The scheduler's own view of the burst: its pod scheduling SLI (queue to bound, gating left
    out) p50/p99 and its scheduling attempts' p99, from the difference of its histograms."""
    sli = added(buckets_of(before, SCHEDULER_SLI, {}), buckets_of(after, SCHEDULER_SLI, {}))
    match = {"result": "scheduled"}
    attempt = added(buckets_of(before, SCHEDULER_ATTEMPT, match), buckets_of(after, SCHEDULER_ATTEMPT, match))
    return {
        "scheduler_metrics_read": bool(after),
        "scheduling_sli_counted": int(sli.get(float("inf"), 0)),
        "scheduling_sli_p50_ms": ms(buckets_quantile(sli, 0.5)),
        "scheduling_sli_p99_ms": ms(buckets_quantile(sli, 0.99)),
        "scheduling_attempt_p99_ms": ms(buckets_quantile(attempt, 0.99)),
    }
