"""A burst of GPU pods through the real control plane onto simulated GPU nodes, with a fault on the way:
what ``bench/scale.py`` runs and reports, and ``test_scale_small.py`` checks.

The tier's mini cluster (``tests/k8s/cluster.py``: etcd, kube-apiserver, controller-manager and
scheduler of the current version) with ``--kwok-nodes`` simulated GPU nodes (``tests/k8s/kwok.py``:
16 ``iluvatar.com/gpu`` on each device-plugin node, every 4th a DRA node) and the real ``ix-gpu
webhook`` (failurePolicy Fail, behind a Service), in one of two forms (``burst_webhook.py``):
``runtime="fake-cri"`` runs one webhook host process beside two fake-cri kubelets;
``runtime="containerd"`` installs the chart itself with helm on the real-node tier's two nodes, its
webhook replicas in real containers behind the chart's Service and kube-proxy.

``--namespaces`` namespaces, every 20th opted out by annotation and the pod-security ``warn`` and
``audit`` levels mixed (``enforce`` stays privileged: the injected driver hostPaths are what
baseline refuses). Then ``--pods`` GPU pods, spread over the namespaces, are created at ``--rate``
pods/s; a quarter name ``ix-gpu.io/gpu-type: BI-V150``, which the webhook turns into a required
node affinity, so the scheduler's work with and without it is seen in one run. A create that fails
is retried for up to three minutes, as a client (a controller) would.

Half-way through the burst the fault happens (several, joined by ``+``, at evenly spaced points
of the burst, in their order): the apiserver stopped for 2 s and started again; the
webhook SIGKILLed (the host process, started again; or one of the chart's replicas, which its
kubelet restarts while the others serve on); etcd compacted to its current revision (watches from
before get 410 Gone); or 500 namespaces created each immediately followed by its pod. One fault
runs through the whole burst instead, beside the others: ``new-namespaces``
(``burst_fresh.py``), namespaces created at an even pace, each followed at once by its GPU pod
(every 4th through a ResourceClaim made just before it); unmutated pods are then counted apart for
the namespaces that existed before the burst and for those created during it.

Reported: pod-create latency p50/p99 as the client saw it (SLO: 1 s) and the creates that failed
before a retry; admission latency p50/p99 as the apiserver measured it
(``apiserver_admission_webhook_admission_duration_seconds``, interpolated in its buckets; the
burst's alone, what was counted after it less what was before it; read before each apiserver
restart too, whose histograms start from 0) and as the webhook did (the replicas running at the
end, and a SIGKILLed one's as read just before the kill); pod startup p50/p99, from the create's
answer to Running as seen by a watch (SLO: 5 s); scheduling (create to bound) p50/p99 and
throughput, with and without the injected affinity, and the scheduler's own pod scheduling SLI
p50/p99 and attempt p99 over the burst (``scheduler_pod_scheduling_sli_duration_seconds``,
``scheduler_scheduling_attempt_duration_seconds``); the webhook's CPU seconds per review and RSS;
GPU pods admitted unmutated; opted-out pods mutated. The webhook can be another than ix-gpu's, or
none (``arm``, ``burst_arms.py``).
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ix_gpu.devicemodel import labels
from ix_gpu.kube.kubeconfig import read_kubeconfig
from ix_gpu.webhook.core.decision import NamespaceFacts
from tests.k8s import host_quiet, kwok
from tests.k8s.burst_arms import scheduler_figures, scheduler_metrics, start_arm
from tests.k8s.burst_audit import OPT_OUT_EVERY, audit, fresh_figures
from tests.k8s.burst_fresh import RETRY_FOR_S, FreshNamespaces
from tests.k8s.burst_webhook import (
    WebhookUnderTest,
    admission_figures,
    cpu_by_replica,
    cpu_of,
    host_view_by_replica,
    host_view_figures,
    rss_by_replica,
    webhook_figures,
)
from tests.k8s.cluster import MiniCluster
from tests.k8s.dra_pools import create_device_classes
from tests.k8s.histograms import ms
from tests.k8s.host_cpu import control_plane_figures, process_clocks, set_cpu_shares
from tests.k8s.k8s_tier import K8sBinaries, KubeAPI
from tests.k8s.pod_watch import PodWatch, quantile

FAULTS = ("none", "apiserver-restart", "webhook-kill", "compact", "namespace-burst", "new-namespaces")
STREAMS = ("new-namespaces",)
"""Faults that run through the whole burst rather than at a point of it."""
LEVELS = ("privileged", "baseline", "restricted")
AFFINITY_EVERY = 4
BURST_NAMESPACES = 500
NEW_NAMESPACES = 100


def namespace_metadata(name: str) -> dict[str, Any]:
    """A burst namespace's metadata, from the index its name ends with: Pod Security ``warn`` and
    ``audit`` levels in turn, and every ``OPT_OUT_EVERY``-th opted out by annotation."""
    i = int(name.rsplit("-", 1)[1])
    level = LEVELS[i % len(LEVELS)]
    metadata: dict[str, Any] = {
        "name": name,
        "labels": {
            "pod-security.kubernetes.io/enforce": "privileged",
            "pod-security.kubernetes.io/warn": level,
            "pod-security.kubernetes.io/audit": level,
        },
    }
    if i % OPT_OUT_EVERY == 0:
        metadata["annotations"] = {labels.INJECT: labels.INJECT_DISABLED}
    return metadata


def namespace_facts(name: str) -> NamespaceFacts:
    """What the webhook knows of a burst namespace (the none arm's mutation is made with it)."""
    metadata = namespace_metadata(name)
    names = {"kubernetes.io/metadata.name": name}
    return NamespaceFacts(name, {**metadata["labels"], **names}, metadata.get("annotations", {}))


def opted_out(namespace: str) -> bool:
    return int(namespace.rsplit("-", 1)[1]) % OPT_OUT_EVERY == 0


def create_namespaces(api: KubeAPI, count: int, prefix: str = "scale", workers: int = 16) -> list[str]:
    names = [f"{prefix}-{i:05d}" for i in range(count)]

    def one(i: int) -> None:
        metadata = namespace_metadata(names[i])
        for _ in range(5):
            status, reply = api.request("POST", "/api/v1/namespaces", {"metadata": metadata})
            if status in (201, 409):
                return
            time.sleep(0.5)
        raise RuntimeError(f"namespace {names[i]}: {status} {str(reply)[:200]}")

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(count)))
    return names


def wait_service_accounts(api: KubeAPI, count: int, timeout: float = 300) -> None:
    """ServiceAccount admission refuses pods until their namespace has its ``default`` account.
    Each check lists every such account, so checks are spaced by the count (10 s at 50,000)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, listed = api.request("GET", "/api/v1/serviceaccounts?fieldSelector=metadata.name%3Ddefault")
        if status == 200 and len(listed.get("items", [])) >= count:
            return
        time.sleep(max(1.0, count / 5000))
    raise RuntimeError("the default ServiceAccounts were not all created")


def gpu_pod(name: str, affinity: bool) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if affinity:
        metadata["annotations"] = {labels.GPU_TYPE: "BI-V150"}
    container = {"name": "main", "image": "busybox", "resources": {"limits": {"iluvatar.com/gpu": "1"}}}
    spec = {"containers": [container], "tolerations": [kwok.TOLERATION]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


class Burst:
    """Creates pods at a rate from a pool of client threads; a failed create is retried."""

    def __init__(
        self, api: KubeAPI, prepare: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None
    ) -> None:
        self.api = api
        self.prepare = prepare
        """What is done to each pod before its create (the none arm's pre-applied mutation)."""
        self.latency: list[float] = []
        self.created: dict[str, float] = {}
        self.first_try_errors: list[str] = []
        self.failed: list[str] = []
        self.affinity: set[str] = set()
        self.refused_first: dict[str, str] = {}
        """The pods whose first create failed, with its error."""
        self.offered_s = 0.0
        """Seconds it took to send every first create (the offered rate's duration)."""
        self._lock = threading.Lock()

    def create(self, namespace: str, name: str, affinity: bool, body: dict[str, Any] | None = None) -> None:
        """Create a pod (``body``, or a GPU pod asking for ``iluvatar.com/gpu``) until it is
        stored, for up to ``RETRY_FOR_S``; its first try's error is recorded."""
        key = f"{namespace}/{name}"
        if affinity:
            self.affinity.add(key)
        body = body if body is not None else gpu_pod(name, affinity)
        if self.prepare is not None:
            body = self.prepare(namespace, body)
        deadline = time.monotonic() + RETRY_FOR_S
        attempt = 0
        while attempt == 0 or time.monotonic() < deadline:
            started = time.monotonic()
            try:
                status, reply = self.api.request(
                    "POST", f"/api/v1/namespaces/{namespace}/pods", body, timeout=30
                )
            except OSError as exc:
                status, reply = 0, str(exc)
            done = time.monotonic()
            with self._lock:
                if status in (201, 409):
                    self.latency.append(done - started)
                    self.created.setdefault(key, done)
                    return
                if attempt == 0:
                    message = reply.get("message", reply) if isinstance(reply, dict) else reply
                    self.first_try_errors.append(f"{status} {str(message)[:400]}")
                    self.refused_first[key] = self.first_try_errors[-1]
            time.sleep(min(0.2 * 2**attempt, 2.0))
            attempt += 1
        with self._lock:
            message = reply.get("message", reply) if isinstance(reply, dict) else reply
            self.failed.append(f"{key}: {status} {str(message)[:300]}")

    def run(self, targets: list[tuple[str, str, bool]], rate: float, marks: list[threading.Event]) -> float:
        """Offer every create at ``rate``; ``marks`` are set at evenly spaced points of the burst
        (one: half-way; two: a third and two thirds of the way)."""
        start = time.monotonic()
        at = {len(targets) * (k + 1) // (len(marks) + 1): mark for k, mark in enumerate(marks)}
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            futures = []
            for i, target in enumerate(targets):
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                if i in at:
                    at[i].set()
                futures.append(pool.submit(self.create, *target))
            self.offered_s = time.monotonic() - start
            for future in futures:
                future.result()
        return time.monotonic() - start


def etcd_compact(url: str) -> int:
    """Compact etcd to its current revision (through its JSON gateway); returns the revision."""

    def call(path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer

    revision = int(call("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
    call("/v3/kv/compaction", {"revision": revision, "physical": True})
    return revision


def run(
    work: Path,
    *,
    kwok_nodes: int,
    namespaces: int,
    pods: int,
    rate: float,
    fault: str,
    binaries: K8sBinaries | None = None,
    log_dir: Path | None = None,
    runtime: str = "fake-cri",
    replicas: int = 3,
    kwok_boards: int = 4,
    new_namespaces: int = NEW_NAMESPACES,
    arm: str = "ix-gpu",
    settle_max_s: float = 0.0,
    webhook_routing: str | None = None,
    webhook_cpu_request: str | None = None,
    node_cpu_shares: int | None = None,
) -> dict[str, Any]:
    """One run; the figures as a dict (see the module doc). ``binaries``: the tier's current
    Kubernetes (default: ``build.sh``'s cache); ``log_dir``: the components' logs. ``runtime``:
    ``fake-cri`` runs one webhook host process; ``containerd`` installs the chart on the real
    nodes with ``replicas`` webhook replicas in real containers (root, and the real-node tier's
    images). ``kwok_boards``: boards per simulated node (4 time-sliced GPUs each).
    ``new_namespaces``: how many the ``new-namespaces`` fault creates over the burst. ``arm``: the
    webhook, ``ix-gpu``, ``go`` or ``none`` (``burst_arms.py``; the last two on containerd only).
    ``settle_max_s``: wait up to this long for the machine to settle before the burst
    (``host_quiet.settle``; 0: start at once), and report how busy it was when the burst began.
    ``webhook_routing``: how the apiserver reaches the webhook (``MiniCluster``'s; None: the
    runtime's default). ``webhook_cpu_request``: the replicas' CPU request in place of the
    chart's (containerd; either webhook). ``node_cpu_shares``: the CPU weight of every real node's
    cgroup root (containerd; ``host_cpu.py``)."""
    faults = [f for f in fault.split("+") if f != "none"]
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise ValueError(f"fault {unknown[0]!r}: one of {', '.join(FAULTS)}, or several joined by '+'")
    result: dict[str, Any] = {
        "kwok_nodes": kwok_nodes,
        "namespaces": namespaces,
        "pods": pods,
        "rate": rate,
        "fault": fault,
        "runtime": runtime,
        "arm": arm,
        "kwok_boards": kwok_boards,
        "webhook_routing": webhook_routing or ("service" if runtime == "containerd" else "endpoints"),
        "webhook_cpu_request": webhook_cpu_request,
    }
    if node_cpu_shares is not None and runtime != "containerd":
        raise ValueError("node_cpu_shares: the real nodes' cgroups exist with runtime containerd only")
    points = [f for f in faults if f not in STREAMS]
    with MiniCluster(
        work,
        binaries=binaries,
        log_dir=log_dir,
        plugin_config=None,
        kwok_nodes=kwok_nodes,
        kwok_boards=kwok_boards,
        runtime=runtime,
        webhook_routing=webhook_routing,
    ) as cluster:
        result["cluster_up_s"] = cluster.timings.get("total")
        if node_cpu_shares is not None and cluster.real_nodes is not None:
            roots = [spec.netns for spec in cluster.real_nodes.specs]
            result["node_cpu_shares"] = set_cpu_shares(roots, node_cpu_shares)
        webhook_arm = start_arm(arm, cluster, work, runtime, replicas, namespace_facts, webhook_cpu_request)
        webhook: WebhookUnderTest = webhook_arm.webhook
        result.update(webhook_arm.info)
        api = cluster.api
        t = time.monotonic()
        existing = len(api.request("GET", "/api/v1/namespaces")[1]["items"])
        names = create_namespaces(api, namespaces)
        wait_service_accounts(api, namespaces + existing, timeout=300 + namespaces / 100)
        result["namespaces_s"] = round(time.monotonic() - t, 1)
        targets = [(names[i % namespaces], f"gpu-{i:06d}", i % AFFINITY_EVERY == 1) for i in range(pods)]
        watch = PodWatch(read_kubeconfig(cluster.kubeconfig)).start()
        burst = Burst(api, webhook_arm.prepare)
        marks = [threading.Event() for _ in points]
        fresh: FreshNamespaces | None = None
        if "new-namespaces" in faults:
            create_device_classes(api)  # for the fresh namespaces' claims
            fresh = FreshNamespaces(
                api, new_namespaces, lambda ns, name, body: burst.create(ns, name, False, body), OPT_OUT_EVERY
            )
        fault_info: dict[str, dict[str, Any]] = {}
        before_restarts: list[str] = []  # the apiserver's /metrics before each restart, which zeroes them

        def inject(fault: str, mark: threading.Event) -> None:
            """One fault at its mark, in a thread of its own: the next one's mark does not wait
            for this one's recovery (a killed replica coming back, say)."""
            mark.wait()
            at, info = time.monotonic(), fault_info.setdefault(fault, {})
            if fault == "apiserver-restart":
                status, text = api.request("GET", "/metrics")
                info["admissions_before_kept"] = status == 200 and isinstance(text, str)
                if info["admissions_before_kept"]:
                    before_restarts.append(str(text))
                api.process.stop()
                info["stop_s"] = round(time.monotonic() - at, 2)
                time.sleep(2.0)
                started = time.monotonic()
                api.start_again()
                info["start_to_ready_s"] = round(time.monotonic() - started, 2)
            elif fault == "webhook-kill":
                info.update(webhook.kill_one())
            elif fault == "compact":
                assert cluster.etcd is not None
                info["revision"] = etcd_compact(cluster.etcd.url)
            elif fault == "namespace-burst":
                burst_names = create_namespaces(api, BURST_NAMESPACES, prefix="burst")
                for i, namespace in enumerate(burst_names):
                    burst.create(namespace, f"burst-{i:05d}", False)
            info["seconds"] = round(time.monotonic() - at, 2)

        if settle_max_s > 0:
            settled = host_quiet.settle(max_s=settle_max_s)
            result["settle_s"], result["settle_reason"] = settled.waited_s, settled.reason
            result["busy_at_start"] = settled.busy_at_start
        cpu_before, shares_before = cpu_of(webhook), cpu_by_replica(webhook)
        host_before = host_view_by_replica(webhook)
        plane_before = process_clocks(cluster.processes())
        # The histograms are read before and after: the burst's figures are their difference.
        apiserver_before = str(api.request("GET", "/metrics")[1])
        scheduler_before = scheduler_metrics(cluster)
        injectors = [
            threading.Thread(target=inject, args=pair, daemon=True)
            for pair in zip(points, marks, strict=True)
        ]
        for injector in injectors:
            injector.start()
        if fresh is not None:
            fresh.start(pods / rate)
        result["burst_s"] = round(burst.run(targets, rate, marks), 1)
        for injector in injectors:
            injector.join(timeout=300)
        if fresh is not None:
            fresh.join(timeout=300)
            result.update(fresh_figures(fresh, burst))
        result["fault_info"] = fault_info
        result["offered_rate"] = round(pods / burst.offered_s, 1)
        result["stored_rate"] = round(pods / result["burst_s"], 1)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and len(watch.running.keys() & burst.created.keys()) < len(
            burst.created
        ):
            time.sleep(0.5)
        watch.stop()
        rss = rss_by_replica(webhook)
        result["webhook_rss_mib"] = max(rss.values(), default=0.0)
        if len(rss) > 1:
            result["webhook_rss_mib_by_replica"] = rss
        reviews = len(burst.created)
        # A killed replica's CPU up to its kill included, and its restart's start-up.
        result["webhook_cpu_ms_per_review"] = round((cpu_of(webhook) - cpu_before) / reviews * 1000, 2)
        # Each replica's share of the burst's CPU (a replica restarted in it: its new process's).
        shares = cpu_by_replica(webhook)
        result["webhook_cpu_s_by_replica"] = sorted(
            (round(cpu - shares_before.get(name, 0.0), 2) for name, cpu in shares.items()), reverse=True
        )
        result.update(host_view_figures(host_before, host_view_by_replica(webhook), reviews))
        result.update(control_plane_figures(plane_before, process_clocks(cluster.processes()), reviews))

        startup = [watch.running[k] - burst.created[k] for k in burst.created if k in watch.running]
        scheduling = {
            group: [
                watch.bound[k] - burst.created[k] for k in burst.created if k in watch.bound and member(k)
            ]
            for group, member in (
                ("with_affinity", lambda k: k in burst.affinity),
                ("without_affinity", lambda k: k not in burst.affinity),
            )
        }
        metrics_status, metrics_text = api.request("GET", "/metrics")
        # With the histograms from before each restart: their buckets add up (admission_figures).
        text = "\n".join([*before_restarts, metrics_text if isinstance(metrics_text, str) else ""])
        result.update(
            {
                "pods_created": len(burst.created),
                "create_failed_after_retries": len(burst.failed),
                "create_failed_examples": burst.failed[:5],
                "create_errors_first_try": len(burst.first_try_errors),
                "create_error_examples": sorted(set(burst.first_try_errors))[:3],
                "create_p50_ms": ms(quantile(burst.latency, 0.5)),
                "create_p99_ms": ms(quantile(burst.latency, 0.99)),
                **admission_figures(apiserver_before, text),
                **webhook_figures(webhook),
                "running": len(startup),
                "startup_p50_ms": ms(quantile(startup, 0.5)),
                "startup_p99_ms": ms(quantile(startup, 0.99)),
                **watch.figures(set(burst.created)),
                **scheduler_figures(scheduler_before, scheduler_metrics(cluster)),
            }
        )
        for group, values in scheduling.items():
            result[f"scheduled_{group}"] = len(values)
            result[f"scheduling_{group}_p50_ms"] = ms(quantile(values, 0.5))
            result[f"scheduling_{group}_p99_ms"] = ms(quantile(values, 0.99))
        bound_times = sorted(watch.bound[k] for k in burst.created if k in watch.bound)
        if len(bound_times) > 1:
            result["scheduler_pods_per_s"] = round(len(bound_times) / (bound_times[-1] - bound_times[0]), 1)
        result.update(audit(api, set(burst.created), fresh.claim_pods if fresh else set()))
        result.update(webhook_arm.checks(api, set(burst.created), opted_out))
        result["metrics_scraped"] = metrics_status == 200
    return result
