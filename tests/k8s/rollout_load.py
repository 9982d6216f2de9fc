"""GPU work created steadily while the chart's release rolls (``helm upgrade``, ``helm rollback``),
and what it saw: the figures ``bench/rollout.py`` prints and the upgrade test on the real nodes
asserts.

A release rolls three things at once: the webhook's Deployment (every GPU pod's create goes
through it), the device plugin's DaemonSet (the kubelet's allocatable ``iluvatar.com/gpu``) and the
DRA plugin's DaemonSet (claims prepared on its node). What a user sees of each during the roll:

- **creates**: a one-GPU device-plugin pod, a pod with a DRA claim, a one-GPU pod in a namespace
  that opted out (``ix-gpu.io/inject: disabled``; by dry run, it only asks the webhook) and now and
  then a TFJob, one after another; each retried as a controller would (a refused webhook call, a
  5xx, a 429), its attempts counted; whether it was stored mutated; how its pod ended (the kubelet
  refuses a pod whose device is gone with ``UnexpectedAdmissionError``) and how long it took to
  start (for a claim pod, that includes its claim's prepare on the node);
- **capacity**, sampled every ``sample_s``: each node's allocatable ``iluvatar.com/gpu`` (what the
  scheduler fits device-plugin pods against) and the devices of our driver in its ResourceSlice
  (what it fits claims against);
- **holders**: GPU pods started before the upgrade that run through it: their restart count,
  container, device cgroup, device nodes, environment, mounts and, for a claim, its CDI spec, read
  before and after.

Nothing here waits on a rollout's own status to decide what a create saw: a rollout's window is
from the helm command to the last old pod gone, read from the pods themselves.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import itertools
import json
import os
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.k8s.k8s_tier import KubeAPI
from tests.k8s.pods import request_ok
from tests.k8s.real_nodes import TIER_ROOT, Images, container_cgroup, container_pids
from tests.k8s.real_release import NAMESPACE, RESOURCE, Release, image_pod
from tests.support.paths import ROOT
from tests.support.waiting import wait_until

INJECTED = "ix-gpu.io/injected"
OPT_OUT = "ix-gpu.io/inject"
DRIVER = "gpu.iluvatar.com"
RESOURCE_API = "/apis/resource.k8s.io/v1"
TEMPLATE = "one-gpu"
RETRIED = (429, 500, 502, 503, 504)
"""Statuses a controller creates again after; a refused webhook call is a 500."""
BACKOFF_S = (0.25, 0.5, 1.0, 2.0, 4.0)
"""The waits between attempts: six attempts over about 8 s, as a controller's requeue would."""


@dataclasses.dataclass
class Create:
    """One object created during the load, and what became of it."""

    kind: str
    """``device-plugin``, ``claim``, ``opted-out`` (dry run) or ``tfjob``."""
    name: str
    sent: float
    """time.monotonic() of the first attempt."""
    attempts: int = 0
    stored: float | None = None
    """When the apiserver answered 201; None when every attempt was refused."""
    refusals: list[str] = dataclasses.field(default_factory=list)
    mutated: bool | None = None
    marked: bool | None = None
    """Whether its first container was given the Load's ``marker`` variable (the config it met)."""
    ended: str = ""
    """How its pod ended: ``Succeeded``, ``Failed <reason>``, or ``not started`` (timed out)."""
    message: str = ""
    """The pod's status message where it failed (the kubelet's words)."""
    scheduled_s: float | None = None
    """From the create stored to the pod seen bound to its node."""
    started_s: float | None = None
    """From the create stored to its pod's container started (running or already done)."""

    @property
    def on_node_s(self) -> float | None:
        """From bound to started: for a claim pod its claim's prepare, then the container's start."""
        if self.started_s is None or self.scheduled_s is None:
            return None
        return self.started_s - self.scheduled_s


@dataclasses.dataclass
class Sample:
    at: float
    allocatable: dict[str, int | None]
    """Each node's allocatable iluvatar.com/gpu (None: not reported)."""
    devices: dict[str, int]
    """Each node's devices of our driver in its ResourceSlices."""
    agent_pods: dict[str, frozenset[tuple[str, str]]]
    """Each component (``webhook``, ``device-plugin``, ``dra-plugin``) → its pods, each as (UID,
    ``ready``, ``starting`` or ``terminating``)."""


@dataclasses.dataclass
class Rollout:
    """One helm command's roll, with the creates sent and the samples taken in its window."""

    label: str
    started: float
    rolled: float
    """When the last old pod of every component was gone."""
    command_s: float
    """How long the helm command took (``--wait``)."""
    creates: list[Create]
    samples: list[Sample]
    windows: dict[str, tuple[float, float]]
    """Each component → from its pods' first change (one added, or an old one going) until none of
    the old ones is left and every new one is ready (seconds from ``started``)."""
    roles: dict[str, str]

    def admission_gaps(self) -> list[float]:
        stored = sorted(c.stored for c in self.creates if c.stored is not None)
        marks = [self.started, *stored, self.rolled]
        return [b - a for a, b in itertools.pairwise(marks)]

    def on_node_during(self, component: str, kind: str = "claim") -> list[Create]:
        """The ``kind`` pods that were on their node, bound but not started, at some time within
        ``component``'s roll."""
        if component not in self.windows:
            return []
        start, end = (self.started + t for t in self.windows[component])
        return [
            c
            for c in self.creates
            if c.kind == kind
            and c.stored is not None
            and c.scheduled_s is not None
            and c.started_s is not None
            and c.stored + c.scheduled_s <= end
            and c.stored + c.started_s >= start
        ]

    def last_stored_marked(self) -> bool | None:
        """Whether the last GPU pod or TFJob stored in the window met the config with the marker
        variable (an opted-out pod never gets it)."""
        stored = sorted(
            (c for c in self.creates if c.stored is not None and c.kind != "opted-out"),
            key=lambda c: c.stored or 0,
        )
        return stored[-1].marked if stored else None

    def figures(self) -> dict[str, Any]:
        by_kind = collections.Counter(c.kind for c in self.creates)
        claims = [c.on_node_s for c in self.creates if c.kind == "claim" and c.on_node_s is not None]
        claim_starts = [c.started_s for c in self.creates if c.kind == "claim" and c.started_s is not None]
        plugin = [c.on_node_s for c in self.creates if c.kind == "device-plugin" and c.on_node_s is not None]
        capacity: dict[str, int | None] = {}
        for node, role in self.roles.items():
            seen = [
                (s.allocatable.get(node) if role == "device-plugin" else s.devices.get(node, 0))
                for s in self.samples
            ]
            capacity[node] = min((v or 0 for v in seen), default=None)
        return {
            "rollout": self.label,
            "rollSeconds": round(self.rolled - self.started, 1),
            "helmSeconds": round(self.command_s, 1),
            "rollWindows": {k: [round(a, 1), round(b, 1)] for k, (a, b) in self.windows.items()},
            "creates": dict(by_kind),
            "retried": sum(c.attempts > 1 for c in self.creates),
            "failedAfterRetry": sum(c.stored is None for c in self.creates),
            "storedUnmutated": sum(c.mutated is False for c in self.creates if c.kind != "opted-out"),
            "optedOutMutated": sum(c.mutated is True for c in self.creates if c.kind == "opted-out"),
            "marked": sum(bool(c.marked) for c in self.creates),
            "lastStoredMarked": self.last_stored_marked(),
            "podEnds": dict(collections.Counter(c.ended for c in self.creates if c.ended)),
            "podFailures": sorted({c.message for c in self.creates if c.ended.startswith("Failed")}),
            "longestAdmissionGapSeconds": round(max(self.admission_gaps()), 2),
            "longestPrepareSeconds": round(max(claims, default=0.0), 2),
            "claimPrepareSeconds": sorted(round(s, 1) for s in claims),
            "longestClaimPodStartSeconds": round(max(claim_starts, default=0.0), 2),
            "longestDevicePluginPodStartSeconds": round(max(plugin, default=0.0), 2),
            "minCapacity": capacity,
            "samples": len(self.samples),
        }


def pod_started(pod: dict[str, Any]) -> str | None:
    """How the pod stands once its container started (``Running``, ``Succeeded``) or it was refused
    (``Failed <reason>``); None before."""
    status = pod.get("status", {})
    phase = status.get("phase")
    if phase in ("Succeeded", "Failed"):
        return " ".join(filter(None, [phase, status.get("reason")]))
    if phase == "Running":
        return "Running"
    return None


class Load:
    """Creates GPU work one object after another while ``running()``; see the module docstring.

    ``device_plugin_node`` takes the device-plugin pods and TFJob workers, ``dra_node`` the claim
    pods (None: no claims, the release has no DRA node). ``tfjobs`` is the TFJob collection path
    (None: no TFJobs: the training operator is not installed)."""

    def __init__(
        self,
        api: KubeAPI,
        image: str,
        *,
        device_plugin_node: str,
        dra_node: str | None,
        tfjobs: str | None,
        interval_s: float = 0.5,
        tfjob_every: int = 8,
        in_flight: int = 1,
        marker: str = "IX_GPU_RELEASE",
        sample_s: float = 0.2,
        component_path: str = "/api/v1/namespaces/ix-gpu-system/pods",
    ) -> None:
        self.api, self.image = api, image
        self.device_plugin_node, self.dra_node, self.tfjobs = device_plugin_node, dra_node, tfjobs
        self.interval_s, self.tfjob_every, self.sample_s = interval_s, tfjob_every, sample_s
        self.in_flight, self.marker = in_flight, marker
        self.component_path = component_path
        suffix = secrets.token_hex(3)
        self.namespace, self.opted_out = f"load-{suffix}", f"load-out-{suffix}"
        self.creates: list[Create] = []
        self.samples: list[Sample] = []
        self.skipped: collections.Counter[str] = collections.Counter()
        """Turns a kind let pass because its last pod had not ended."""
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="load-track")
        self._tracking: list[Future[None]] = []
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []

    @property
    def roles(self) -> dict[str, str]:
        roles = {self.device_plugin_node: "device-plugin"}
        if self.dra_node:
            roles[self.dra_node] = "dra"
        return roles

    # ------------------------------------------------------------------ setup

    def prepare(self) -> None:
        """The load's namespace (with the claim template) and its opted-out namespace, once the
        webhook leaves a pod there alone (it learns namespaces through its watch)."""
        api = self.api
        request_ok(api, "POST", "/api/v1/namespaces", {"metadata": {"name": self.namespace}})
        annotations = {OPT_OUT: "disabled"}
        request_ok(
            api,
            "POST",
            "/api/v1/namespaces",
            {"metadata": {"name": self.opted_out, "annotations": annotations}},
        )
        for namespace in (self.namespace, self.opted_out):
            wait_until(
                lambda ns=namespace: (
                    api.request("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")[0] == 200
                ),
                f"{namespace}'s default ServiceAccount",
                60,
            )
        if self.dra_node:
            template = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": TEMPLATE},
                "spec": {
                    "spec": {
                        "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
                    }
                },
            }
            request_ok(
                api, "POST", f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaimtemplates", template
            )
        probe = self.gpu_pod("probe")

        def left_alone() -> bool:
            created = request_ok(api, "POST", f"/api/v1/namespaces/{self.opted_out}/pods?dryRun=All", probe)
            return INJECTED not in (created["metadata"].get("annotations") or {})

        wait_until(left_alone, "the webhook leaving the opted-out namespace alone", 30, interval=0.5)

    def close(self) -> None:
        for namespace in (self.namespace, self.opted_out):
            self.api.request("DELETE", f"/api/v1/namespaces/{namespace}")

    # ------------------------------------------------------------------ objects

    def gpu_pod(self, name: str, command: tuple[str, ...] = ("true",)) -> dict[str, Any]:
        pod = image_pod(
            name,
            self.image,
            list(command),
            gpus=1,
            nodeSelector={"kubernetes.io/hostname": self.device_plugin_node},
        )
        pod["spec"]["restartPolicy"] = "Never"
        return pod

    def claim_pod(self, name: str, command: tuple[str, ...] = ("true",)) -> dict[str, Any]:
        assert self.dra_node is not None
        pod = image_pod(
            name,
            self.image,
            list(command),
            resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}],
            nodeSelector={"kubernetes.io/hostname": self.dra_node},
            restartPolicy="Never",
        )
        pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
        return pod

    def tfjob(self, name: str) -> dict[str, Any]:
        worker = self.gpu_pod("worker")["spec"]
        worker["containers"][0]["name"] = "tensorflow"
        return {
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "metadata": {"name": name},
            "spec": {
                "tfReplicaSpecs": {
                    "Worker": {"replicas": 1, "restartPolicy": "Never", "template": {"spec": worker}}
                }
            },
        }

    # ------------------------------------------------------------------ creating

    def create(self, record: Create, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """POST ``body``, again after each refusal a controller would retry; the stored object."""
        for wait in (*BACKOFF_S, None):
            record.attempts += 1
            try:
                status, reply = self.api.request("POST", path, body, timeout=15)
            except OSError as err:
                status, reply = 0, str(err)
            if status == 201:
                record.stored = time.monotonic()
                return dict(reply)
            message = reply.get("message", "") if isinstance(reply, dict) else str(reply)
            record.refusals.append(f"{status} {message}"[:300])
            if wait is None or (status not in RETRIED and status != 0):
                return None
            time.sleep(wait)
        return None

    def _one(self, kind: str, n: int) -> Future[None] | None:
        name = f"{kind.split('-')[0][:5]}-{n}"
        record = Create(kind, name, time.monotonic())
        self.creates.append(record)
        ns = f"/api/v1/namespaces/{self.namespace}"
        if kind == "device-plugin":
            stored = self.create(record, f"{ns}/pods", self.gpu_pod(name))
        elif kind == "claim":
            stored = self.create(record, f"{ns}/pods", self.claim_pod(name))
        elif kind == "opted-out":
            stored = self.create(
                record, f"/api/v1/namespaces/{self.opted_out}/pods?dryRun=All", self.gpu_pod(name)
            )
        else:
            assert self.tfjobs is not None
            stored = self.create(
                record, f"{self.tfjobs}/namespaces/{self.namespace}/tfjobs", self.tfjob(name)
            )
        if stored is None:
            return None
        if kind == "tfjob":
            template = stored["spec"]["tfReplicaSpecs"]["Worker"]["template"]
            record.mutated = INJECTED in (template.get("metadata", {}).get("annotations") or {})
        else:
            template = stored
            record.mutated = INJECTED in (stored["metadata"].get("annotations") or {})
        env = template["spec"]["containers"][0].get("env") or []
        record.marked = any(e["name"] == self.marker for e in env)
        if kind == "opted-out":
            return None
        tracking = self._pool.submit(self._track, record)
        self._tracking.append(tracking)
        return tracking

    def _track(self, record: Create) -> None:
        """Wait for the pod to start or be refused, then delete it (a TFJob: the job)."""
        ns = f"/api/v1/namespaces/{self.namespace}"
        pod = f"{record.name}-worker-0" if record.kind == "tfjob" else record.name
        assert record.stored is not None
        deadline = record.stored + 120
        while time.monotonic() < deadline:
            status, found = self.api.request("GET", f"{ns}/pods/{pod}")
            outcome = pod_started(found) if status == 200 else None
            if status == 200 and record.scheduled_s is None and found["spec"].get("nodeName"):
                record.scheduled_s = time.monotonic() - record.stored
            if outcome:
                record.started_s = time.monotonic() - record.stored
                if outcome == "Running":
                    outcome, found = self._ended(f"{ns}/pods/{pod}", deadline)
                record.ended = outcome
                record.message = str(found.get("status", {}).get("message", ""))[:500]
                break
            time.sleep(0.1)
        else:
            record.ended = "not started"
        if record.kind == "tfjob":
            assert self.tfjobs is not None
            self.api.request("DELETE", f"{self.tfjobs}/namespaces/{self.namespace}/tfjobs/{record.name}")
        self.api.request("DELETE", f"{ns}/pods/{pod}")
        # Gone, its devices (and a claim's) given back, before this kind's next pod is created.
        deadline = time.monotonic() + 60
        while self.api.request("GET", f"{ns}/pods/{pod}")[0] != 404 and time.monotonic() < deadline:
            time.sleep(0.2)

    def _ended(self, path: str, deadline: float) -> tuple[str, dict[str, Any]]:
        found: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status, found = self.api.request("GET", path)
            outcome = pod_started(found) if status == 200 else "gone"
            if outcome != "Running":
                return outcome or "Pending", found if status == 200 else {}
            time.sleep(0.2)
        return "Running", found

    def _creating(self) -> None:
        """Each kind in turn, ``interval_s`` apart; a kind with ``in_flight`` pods not ended yet lets
        its turn pass (the load stays within the nodes' GPUs, so no pod waits for another's GPU, and
        a pod's times are its own)."""
        kinds = ["device-plugin", *(["claim"] if self.dra_node else []), "opted-out"]
        pending: dict[str, list[Future[None]]] = collections.defaultdict(list)
        for n in itertools.count():
            if self._stop.is_set():
                return
            due = [*kinds, *(["tfjob"] if self.tfjobs and n % self.tfjob_every == 0 else [])]
            for kind in due:
                pending[kind] = [f for f in pending[kind] if not f.done()]
                if len(pending[kind]) >= self.in_flight:
                    self.skipped[kind] += 1
                    continue
                tracking = self._one(kind, n)
                if tracking is not None:
                    pending[kind].append(tracking)
                self._stop.wait(self.interval_s)

    # ------------------------------------------------------------------ sampling

    def sample(self) -> Sample:
        allocatable: dict[str, int | None] = {}
        for node in self.roles:
            found = request_ok(self.api, "GET", f"/api/v1/nodes/{node}")["status"].get("allocatable", {})
            allocatable[node] = int(found[RESOURCE]) if RESOURCE in found else None
        devices: collections.Counter[str] = collections.Counter()
        if self.dra_node:
            for piece in request_ok(self.api, "GET", f"{RESOURCE_API}/resourceslices")["items"]:
                if piece["spec"]["driver"] == DRIVER and piece["spec"].get("nodeName"):
                    devices[piece["spec"]["nodeName"]] += len(piece["spec"].get("devices") or [])
        pods: dict[str, set[tuple[str, str]]] = {
            "device-plugin": set(),
            "dra-plugin": set(),
            "webhook": set(),
        }
        for pod in request_ok(self.api, "GET", self.component_path)["items"]:
            component = pod["metadata"].get("labels", {}).get("app.kubernetes.io/component")
            if component in pods:
                ready = any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in pod["status"].get("conditions", [])
                )
                state = (
                    "terminating"
                    if "deletionTimestamp" in pod["metadata"]
                    else "ready"
                    if ready
                    else "starting"
                )
                pods[component].add((pod["metadata"]["uid"], state))
        return Sample(
            time.monotonic(), allocatable, dict(devices), {k: frozenset(v) for k, v in pods.items()}
        )

    def _sampling(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            self._stop.wait(self.sample_s)

    def _guarded(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as err:  # surfaced by running()'s exit
                self._errors.append(err)
                self._stop.set()

        return run

    @contextlib.contextmanager
    def running(self) -> Iterator[Load]:
        """Create and sample until the block ends, then wait for every pod's end."""
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._guarded(self._creating), name="load-create", daemon=True),
            threading.Thread(target=self._guarded(self._sampling), name="load-sample", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            for thread in self._threads:
                thread.join(60)
            for future in self._tracking:
                future.result(timeout=180)
            self._pool.shutdown(wait=True)
        if self._errors:
            raise self._errors[0]

    # ------------------------------------------------------------------ a rollout

    def window(self, label: str, started: float, rolled: float, command_s: float) -> Rollout:
        creates = [c for c in self.creates if started <= c.sent <= rolled]
        samples = [s for s in self.samples if started <= s.at <= rolled]
        windows = {}
        if samples:
            for agent in ("webhook", "device-plugin", "dra-plugin"):
                first = samples[0].agent_pods[agent]
                old = {uid for uid, _ in first}
                moved = [s.at for s in samples if s.agent_pods[agent] != first]
                done = [
                    s.at
                    for s in samples
                    if moved
                    and s.at >= moved[0]
                    and not {uid for uid, _ in s.agent_pods[agent]} & old
                    and all(state == "ready" for _, state in s.agent_pods[agent])
                ]
                if moved:
                    windows[agent] = (moved[0] - started, (done[0] if done else rolled) - started)
        return Rollout(label, started, rolled, command_s, creates, samples, windows, self.roles)


def rolled(api: KubeAPI, namespace: str, release: str) -> bool:
    """Every Deployment and DaemonSet of ``release`` runs its current template on all its pods and no
    pod of an older one is left (a terminating one still counts: it may still serve)."""
    selector = f"app.kubernetes.io/instance%3D{release}"
    pods = request_ok(api, "GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")["items"]
    for kind in ("deployments", "daemonsets"):
        for found in request_ok(
            api, "GET", f"/apis/apps/v1/namespaces/{namespace}/{kind}?labelSelector={selector}"
        )["items"]:
            status = found["status"]
            if status.get("observedGeneration") != found["metadata"]["generation"]:
                return False
            component = found["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/component")
            own = [
                p
                for p in pods
                if p["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
            ]
            if kind == "deployments":
                want = found["spec"].get("replicas", 1)
                done = status.get("updatedReplicas") == status.get("availableReplicas") == want
            else:
                want = status.get("desiredNumberScheduled", 0)
                done = status.get("updatedNumberScheduled") == status.get("numberAvailable") == want
            if not done or len(own) != want:
                return False
    return True


def helm_roll(
    load: Load,
    label: str,
    command: Callable[[], subprocess.CompletedProcess[str]],
    is_rolled: Callable[[], bool],
    settle_s: float = 2.0,
    timeout_s: float = 300,
) -> Rollout:
    """Run one helm command while ``load`` runs; the rollout from its start to ``is_rolled()``."""
    started = time.monotonic()
    result = command()
    command_s = time.monotonic() - started
    assert result.returncode == 0, f"{label}: {result.stdout}{result.stderr}"
    wait_until(is_rolled, f"{label} rolled", timeout_s, interval=0.5)
    done = time.monotonic()
    time.sleep(settle_s)  # the creates sent just before the end have stored or not
    return load.window(label, started, done, command_s)


# ---------------------------------------------------------------------------- holders


@dataclasses.dataclass
class Holder:
    """A GPU pod that runs through the rollouts, sleeping on its devices."""

    namespace: str
    name: str
    node: str
    claim: bool

    def snapshot(self, api: KubeAPI) -> dict[str, Any]:
        """What the pod's one container has of its GPUs, read on the host: its pod and container,
        restarts, device cgroup, device nodes, environment, the driver's mounts and, for a claim,
        the CDI spec the DRA plugin wrote for it."""
        pod = request_ok(api, "GET", f"/api/v1/namespaces/{self.namespace}/pods/{self.name}")
        (status,) = pod["status"]["containerStatuses"]
        pid = container_pids(pod, "main")[0]
        devices = (container_cgroup(pod, "main", "devices") / "devices.list").read_text().splitlines()
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        nodes = sorted(os.listdir(f"/proc/{pid}/root/dev"))
        mounts = [line.split()[4] for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()]
        found = {
            "pod": pod["metadata"]["uid"],
            "container": status.get("containerID"),
            "restarts": status.get("restartCount"),
            "devices.list": sorted(devices),
            "device nodes": [n for n in nodes if n.startswith(("iluvatar", "itr"))],
            "env": sorted(e.decode(errors="replace") for e in environ if e),
            "mounts": sorted(m for m in mounts if "corex" in m or m.startswith("/dev")),
        }
        if self.claim:
            (claim_status,) = pod["status"]["resourceClaimStatuses"]
            claim = request_ok(
                api,
                "GET",
                f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaims/{claim_status['resourceClaimName']}",
            )
            found["claim allocation"] = claim["status"].get("allocation")
            found["claim reserved for"] = [r["uid"] for r in claim["status"].get("reservedFor", [])]
            found["cdi spec"] = self.cdi_spec(claim["metadata"]["uid"])
        return found

    def cdi_spec(self, claim_uid: str) -> str | None:
        specs = list((TIER_ROOT / self.node / "cdi").glob(f"*claim-{claim_uid}.json"))
        return specs[0].read_text() if specs else None


def start_holders(load: Load) -> list[Holder]:
    """A device-plugin pod and (with a DRA node) a claim pod that sleep on their GPUs, running."""
    holders = [Holder(load.namespace, "hold-plugin", load.device_plugin_node, claim=False)]
    pods = [load.gpu_pod("hold-plugin", ("sleep", "3600"))]
    if load.dra_node:
        holders.append(Holder(load.namespace, "hold-claim", load.dra_node, claim=True))
        pods.append(load.claim_pod("hold-claim", ("sleep", "3600")))
    for pod in pods:
        pod["spec"]["restartPolicy"] = "Always"
        request_ok(load.api, "POST", f"/api/v1/namespaces/{load.namespace}/pods", pod)
    for holder in holders:
        wait_until(
            lambda h=holder: (
                pod_started(request_ok(load.api, "GET", f"/api/v1/namespaces/{h.namespace}/pods/{h.name}"))
                == "Running"
            ),
            f"{holder.name} running",
            120,
            interval=0.5,
        )
    return holders


def claim_released(api: KubeAPI, holder: Holder, timeout_s: float = 60) -> float:
    """Delete the claim holder; seconds until its claim's CDI spec is gone from the node: the DRA
    plugin running now unprepared a claim that its predecessors prepared."""
    pod = request_ok(api, "GET", f"/api/v1/namespaces/{holder.namespace}/pods/{holder.name}")
    (claim_status,) = pod["status"]["resourceClaimStatuses"]
    path = f"{RESOURCE_API}/namespaces/{holder.namespace}/resourceclaims/{claim_status['resourceClaimName']}"
    uid = request_ok(api, "GET", path)["metadata"]["uid"]
    assert holder.cdi_spec(uid) is not None, "the claim is not prepared"
    started = time.monotonic()
    request_ok(api, "DELETE", f"/api/v1/namespaces/{holder.namespace}/pods/{holder.name}")
    wait_until(lambda: holder.cdi_spec(uid) is None, f"{holder.name}'s claim unprepared", timeout_s)
    return time.monotonic() - started


# ---------------------------------------------------------------------------- the upgrade


def next_image(images: Images) -> tuple[str, str, Path]:
    """(repository, tag, docker archive) of the project's second image: the same Dockerfile built
    with another version label beside the first (build-images.sh, ``ix-gpu-next`` in its
    images.json), for an upgrade to a different image."""
    data = json.loads((images.project_archive.parent / "images.json").read_text())
    found = data["ix-gpu-next"]
    return found["repository"], found["tag"], Path(found["archive"])


def import_next_image(release: Release) -> tuple[str, str]:
    """Import the second image on every node (each at once); its (repository, tag)."""
    nodes = release.cluster.real_nodes
    assert nodes is not None and nodes.images is not None
    repository, tag, archive = next_image(nodes.images)
    with ThreadPoolExecutor() as pool:
        list(pool.map(lambda n: n.import_image(archive), nodes.nodes.values()))
    return repository, tag


@dataclasses.dataclass
class UpgradeRun:
    """An upgrade then a rollback under load, and what the pods that ran through both kept."""

    before: Rollout
    """The load's first seconds, before the upgrade: what a create takes when nothing rolls."""
    rollouts: list[Rollout]
    holders: list[Holder]
    skipped: dict[str, int]
    held_before: dict[str, dict[str, Any]]
    held_after: dict[str, dict[str, Any]]
    creates: list[Create]

    def changed(self) -> dict[str, dict[str, tuple[Any, Any]]]:
        """Each holder → what differs in its snapshot after the rollouts: (before, after)."""
        changes = {
            name: {
                key: (before.get(key), self.held_after[name].get(key))
                for key in before.keys() | self.held_after[name].keys()
                if before.get(key) != self.held_after[name].get(key)
            }
            for name, before in self.held_before.items()
        }
        return {name: changed for name, changed in changes.items() if changed}

    def figures(self) -> dict[str, Any]:
        return {
            "skippedTurns": dict(self.skipped),
            "before": self.before.figures(),
            "rollouts": [r.figures() for r in self.rollouts],
            "holdersChanged": self.changed(),
        }


def upgrade_then_rollback(
    release: Release,
    name: str,
    load: Load,
    upgrade: Callable[[dict[str, Any]], None],
    before_s: float = 5.0,
) -> UpgradeRun:
    """``helm upgrade name`` to the release's values changed by ``upgrade`` (in place on a copy),
    then ``helm rollback name``, each with ``--wait``, while ``load`` runs; the holders are started
    before and read before and after. ``release.values`` is left as it was (the rollback's)."""
    chart = str(ROOT / "charts" / "ix-gpu")
    load.prepare()
    holders = start_holders(load)
    held_before = {h.name: h.snapshot(release.api) for h in holders}
    original = copy.deepcopy(release.values)
    changed = copy.deepcopy(release.values)
    upgrade(changed)

    def is_rolled() -> bool:
        return rolled(release.api, NAMESPACE, name)

    def helm_upgrade() -> subprocess.CompletedProcess[str]:
        release.values = changed
        try:
            values = str(release.values_file())
        finally:
            release.values = original
        return release.helm("upgrade", name, chart, "-f", values, "--wait", "--timeout", "5m")

    rollouts = []
    started = time.monotonic()
    with load.running():
        time.sleep(before_s)
        before = load.window("before", started, time.monotonic(), 0.0)
        rollouts.append(helm_roll(load, "upgrade", helm_upgrade, is_rolled))
        rollouts.append(
            helm_roll(
                load,
                "rollback",
                lambda: release.helm("rollback", name, "--wait", "--timeout", "5m"),
                is_rolled,
            )
        )
    held_after = {h.name: h.snapshot(release.api) for h in holders}
    return UpgradeRun(
        before, rollouts, holders, dict(load.skipped), held_before, held_after, list(load.creates)
    )
