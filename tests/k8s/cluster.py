"""A mini Kubernetes cluster on loopback (Kubernetes ``k8s_tier.CURRENT_K8S_VERSION``), for the tier's
tests and by hand:

    .venv/bin/python -m tests.k8s.cluster up [--dir DIR]     # prints the kubeconfig path
    KUBECONFIG=DIR/kubeconfig kubectl get nodes               # any kubectl works with it
    .venv/bin/python -m tests.k8s.cluster down [--dir DIR]

It runs etcd, kube-apiserver, kube-controller-manager, kube-scheduler and two Nodes, ``gpu-a`` and
``gpu-b``: each a real kubelet on its own fake-cri (own pod CIDR, own device-plugin directory, own
private mount namespace; see ``k8s_tier.start_kubelet_node``) with the real ``ix-gpu plugin --backend
fake`` serving into that directory as a host process (``gpu-a``: two BI-V150 boards of two chips;
``gpu-b``: two single-chip BI-V100 boards), labelling its Node as the chart's plugin does. There is
no kube-proxy: the apiserver runs with ``--enable-aggregator-routing=true``, so it dials the
endpoints of a webhook's Service (its EndpointSlices), not the ClusterIP.

``up`` starts a detached supervisor (``python -m tests.k8s.cluster serve``, its own session) that owns
every process and stops them all on SIGTERM; ``DIR/state.json`` holds the pids, ports and paths,
``DIR/logs/`` each component's log. ``down`` signals the supervisor and, should it be gone, kills the
recorded pids and removes the nodes' directories.

In Python: ``with MiniCluster(log_dir) as cluster:`` gives ``.kubeconfig``, ``.api`` (``KubeAPI``),
``.nodes`` (name -> ``KubeletNode``), ``.plugins`` (name -> ``PluginProcess``), ``.stop()``.
Needs root (mount namespaces).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from tests.k8s.k8s_tier import (
    CURRENT_K8S_VERSION,
    Etcd,
    K8sBinaries,
    KubeAPI,
    KubeletNode,
    build_binaries,
    https_ok,
    start_etcd,
    start_kube_apiserver,
    start_kube_scheduler,
    start_kubelet_node,
)
from tests.k8s.real_nodes import RealNode, RealNodes
from tests.support.cli import ix_gpu
from tests.support.net import free_port
from tests.support.paths import ROOT
from tests.support.plugin_process import PluginProcess
from tests.support.processes import Process, start_process
from tests.support.waiting import wait_until
from tests.support.webhook_process import WebhookProcess

DEFAULT_DIR = Path("/tmp/ix-gpu-cluster")
RESOURCE = "iluvatar.com/gpu"
PLUGIN_DAEMONSET = "ix-gpu-device-plugin"
WEBHOOK_NAMESPACE = "ix-gpu-system"
WEBHOOK_SERVICE = "ix-gpu-webhook"
SEED_004_CONFIG = "flags:\n  splitboard: false\nsharing:\n  timeSlicing:\n      replicas: 4 \n"
"""The seed's ix-config (shared/seeds/004): one device per board, each shared by 4 (8 on gpu-a)."""
CLIENT_LIMITS = ("--kube-api-qps=500", "--kube-api-burst=1000")
"""The controllers' and the scheduler's client rate limits, as kwok's own clusters lift them: with the
defaults (20 and 50 a second) the ServiceAccounts of 2,000 new namespaces took 100 s and the
scheduler bound 23 pods a second; the apiserver here serves one machine's tests, not a fleet."""
CONTROLLERS = [
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "namespace-controller",
    "node-lifecycle-controller",  # removes the not-ready taint the kubelet registers with
    "garbage-collector-controller",
    "deployment-controller",
    "job-controller",  # the chart's post-delete hook Job
    "replicaset-controller",
    "daemonset-controller",
    "endpointslice-controller",
    "endpoints-controller",  # v1 Endpoints: Prometheus' endpoints discovery (the Operator's default)
    "endpointslice-mirroring-controller",
    "pod-garbage-collector-controller",
    "resource-claim-controller",  # a DRA pod's ResourceClaim from its ResourceClaimTemplate
]


def _board(index: int, product: str, chips: int, first_minor: int, node: str) -> dict[str, Any]:
    return {
        "id": f"board{index}",
        "product": product,
        "numaNode": 0,
        "chips": [
            {
                "uuid": f"GPU-{node}-{index:02d}{c:02d}-0000-4000-8000-000000000000",
                "minor": first_minor + c,
                "memoryMiB": 32768,
                "health": 0,
            }
            for c in range(chips)
        ],
    }


def fake_devices(product: str, boards: int, chips_per_board: int, node: str) -> str:
    """A devices file for the fake backend (schema of examples/fake-devices.yaml)."""
    data = {
        "vendor": "iluvatar",
        "controlNodes": ["/dev/itrctl"],
        "boards": [_board(b, product, chips_per_board, b * chips_per_board, node) for b in range(boards)],
    }
    return yaml.safe_dump(data, sort_keys=False)


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    name: str
    pod_cidr: str
    devices: str
    """The fake backend's devices file (schema of examples/fake-devices.yaml)."""


def node_specs(cidr_octet: int = 10) -> tuple[NodeSpec, ...]:
    """``gpu-a`` (two BI-V150 boards of two chips) with pods on 127.0.``cidr_octet``.0/24 and ``gpu-b``
    (two single-chip BI-V100 boards) on the next /24. Clusters running at once need their own."""
    return (
        NodeSpec("gpu-a", f"127.0.{cidr_octet}.0/24", fake_devices("Iluvatar BI-V150", 2, 2, "a")),
        NodeSpec("gpu-b", f"127.0.{cidr_octet + 1}.0/24", fake_devices("Iluvatar BI-V100", 2, 1, "b")),
    )


DEFAULT_NODES = node_specs(10)
CLI_CIDR_OCTET = 20
"""The command-line cluster's pods are on 127.0.20-21.x, the tests' on 127.0.10-13.x."""


def _apply(api: KubeAPI, collection: str, body: dict[str, Any]) -> None:
    """Create ``body`` in ``collection`` (an existing object of that name is fine)."""
    status, reply = api.request("POST", collection, body)
    if status not in (201, 409):
        raise RuntimeError(f"POST {collection}: {status} {reply}")


def with_node_labels(plugin_config: str) -> str:
    """``plugin_config`` with ``labels.enabled: true``, as the chart runs the plugin (``plugin.nodeLabels``):
    each node's plugin labels its Node (``ix-gpu.io/gpu.product`` ...), which the webhook's GPU-type
    affinity selects on."""
    data = yaml.safe_load(plugin_config) or {}
    data.setdefault("labels", {})["enabled"] = True
    return yaml.safe_dump(data, sort_keys=False)


def host_address() -> str | None:
    """This machine's first global-scope IPv4 address (an EndpointSlice may name it), or None."""
    try:
        out = subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        return None
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    return None


class MiniCluster:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and two kubelet Nodes with the
    fake-backend plugin; started by ``start()`` (or ``with``), stopped by ``stop()``."""

    def __init__(
        self,
        work_dir: Path,
        *,
        binaries: K8sBinaries | None = None,
        nodes: tuple[NodeSpec, ...] = DEFAULT_NODES,
        plugin_config: str | None = SEED_004_CONFIG,
        containers_path: str | None = None,
        log_dir: Path | None = None,
        plugin_mode: str = "process",
        node_ip: str = "127.0.0.1",
        kubelet_config: dict[str, Any] | None = None,
        runtime: str = "fake-cri",
        kwok_nodes: int = 0,
        kwok_dra_every: int = 4,
        kwok_boards: int = 4,
        webhook_routing: str | None = None,
    ) -> None:
        """``plugin_config``: the plugins' ix-config (None: start no plugin). ``containers_path``: the
        containers' PATH (default: this interpreter's directory, then the system's). ``log_dir``:
        the components' logs (default ``work_dir/logs``). ``plugin_mode``: ``process`` runs each
        node's plugin as a host process (``plugins``); ``daemonset`` runs it as the pods of a
        DaemonSet in kube-system (``plugin_pods``), through the kubelets and fake-cri. ``node_ip``:
        the kubelets' address and the Nodes' InternalIP (``host_address()`` lets hostNetwork pods be
        Service endpoints; see ``start_kubelet_node``). ``kubelet_config``: KubeletConfiguration keys
        for every node (e.g. a shorter ``syncFrequency``, which bounds how soon a changed ConfigMap
        reaches a pod's volume). ``runtime``: ``fake-cri`` (pods are host processes; the nodes of
        ``nodes``) or ``containerd`` (real containers on the real nodes of tests/k8s/real_nodes.py,
        kube-proxy included; no plugin is started there, the chart installs it: ``plugin_config``
        must be None). ``kwok_nodes``: that many simulated GPU nodes besides (tests/k8s/kwok.py),
        every ``kwok_dra_every``-th a DRA node with its ResourceSlice, each of ``kwok_boards``
        boards. ``webhook_routing``: how the apiserver reaches a webhook's Service. ``service``
        (containerd's default): it dials the ClusterIP, kube-proxy picks a replica per connection,
        as in most clusters. ``endpoints`` (fake-cri's, which has no kube-proxy):
        ``--enable-aggregator-routing=true``, the apiserver picks an endpoint itself; from
        v1.37 on each request anew (the ``WebhookRoundTripLoadBalancing`` gate, on by default),
        before that per connection."""
        if runtime not in ("fake-cri", "containerd"):
            raise ValueError(f"runtime: {runtime!r}")
        if runtime == "containerd" and plugin_config is not None:
            raise ValueError("real nodes get their device plugin from the chart: plugin_config=None")
        self.runtime = runtime
        self.webhook_routing = webhook_routing or ("service" if runtime == "containerd" else "endpoints")
        if self.webhook_routing not in ("service", "endpoints") or (
            runtime == "fake-cri" and self.webhook_routing == "service"
        ):
            raise ValueError(f"webhook_routing {webhook_routing!r}: endpoints, or service with containerd")
        self.real_nodes: RealNodes | None = RealNodes() if runtime == "containerd" else None
        self.kubelet_config = kubelet_config
        self.node_ip = node_ip
        if plugin_mode not in ("process", "daemonset"):
            raise ValueError(f"plugin_mode: {plugin_mode!r}")
        self.plugin_mode = plugin_mode
        self.work_dir = work_dir
        self.log_dir = log_dir or work_dir / "logs"
        self.binaries = binaries
        self.node_specs = nodes
        self.plugin_config = plugin_config
        self.containers_path = containers_path or (
            f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        )
        self.etcd: Etcd | None = None
        self.api_server: KubeAPI | None = None
        self.controller_manager: Process | None = None
        self.scheduler: Process | None = None
        self.nodes: dict[str, KubeletNode | RealNode] = {}
        self.plugins: dict[str, PluginProcess] = {}
        self.webhook: WebhookProcess | None = None
        self.timings: dict[str, float] = {}
        self.kwok_nodes = kwok_nodes
        self.kwok_dra_every = kwok_dra_every
        self.kwok_boards = kwok_boards
        self.kwok: Process | None = None
        self.kwok_node_names: list[str] = []

    # ---------------------------------------------------------------- accessors

    @property
    def api(self) -> KubeAPI:
        assert self.api_server is not None, "the cluster is not started"
        return self.api_server

    @property
    def kubeconfig(self) -> Path:
        return self.api.kubeconfig

    def processes(self) -> dict[str, Process]:
        out: dict[str, Process] = {}
        if self.etcd is not None:
            out["etcd"] = self.etcd.process
        if self.api_server is not None:
            out["kube-apiserver"] = self.api_server.process
        if self.controller_manager is not None:
            out["kube-controller-manager"] = self.controller_manager
        if self.scheduler is not None:
            out["kube-scheduler"] = self.scheduler
        for name, node in self.nodes.items():
            if isinstance(node, KubeletNode):
                out[f"fake-cri-{name}"] = node.fake_cri
            elif node.containerd is not None:
                out[f"containerd-{name}"] = node.containerd
            if isinstance(node, RealNode) and node.kube_proxy is not None:
                out[f"kube-proxy-{name}"] = node.kube_proxy
            if node.kubelet is not None:
                out[f"kubelet-{name}"] = node.kubelet
        if self.real_nodes is not None and self.real_nodes.host_proxy is not None:
            out["kube-proxy-control-plane"] = self.real_nodes.host_proxy
        for name, plugin in self.plugins.items():
            if plugin.process is not None:
                out[f"ix-gpu-plugin-{name}"] = plugin.process
        if self.webhook is not None and self.webhook.process is not None:
            out["ix-gpu-webhook"] = self.webhook.process
        if self.kwok is not None:
            out["kwok"] = self.kwok
        return out

    def state(self) -> dict[str, Any]:
        """What ``down`` needs, and what a person wants to see."""
        return {
            "version": CURRENT_K8S_VERSION,
            "runtime": self.runtime,
            "kube_proxy": str(self.binaries.kube_proxy) if self.binaries else None,
            "images": (
                {
                    k: str(v) if isinstance(v, Path) else v
                    for k, v in dataclasses.asdict(self.real_nodes.images).items()
                }
                if self.real_nodes and self.real_nodes.images
                else None
            ),
            "kubeconfig": str(self.kubeconfig) if self.api_server else None,
            "apiserver": self.api_server.url if self.api_server else None,
            "logs": str(self.log_dir),
            "pids": {name: p.pid for name, p in self.processes().items()},
            "node_roots": {
                name: str(node.root if isinstance(node, KubeletNode) else node.spec.root)
                for name, node in self.nodes.items()
            },
            "etcd_data": str(self.etcd.data_root) if self.etcd else None,
            "webhook": self.webhook.url if self.webhook else None,
            "kwok_nodes": len(self.kwok_node_names),
            "timings_s": self.timings,
        }

    # ---------------------------------------------------------------- start

    def __enter__(self) -> MiniCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _timed(self, what: str, start: float) -> None:
        self.timings[what] = round(time.monotonic() - start, 2)

    def start(self) -> MiniCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        begin = time.monotonic()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.binaries is None:
            self.binaries = build_binaries()
        binaries = self.binaries
        self._timed("binaries", begin)
        if self.real_nodes is not None:
            t = time.monotonic()
            self.real_nodes.prepare()  # images, and the host network the apiserver advertises on
            self._timed("images+network", t)
        t = time.monotonic()
        self.etcd = start_etcd(binaries, self.log_dir)
        self.api_server = start_kube_apiserver(
            binaries,
            self.etcd,
            self.work_dir / "kube-apiserver",
            self.log_dir,
            service_account_admission=True,
            extra_args=["--enable-aggregator-routing=true"] if self.webhook_routing == "endpoints" else [],
            **(RealNodes.apiserver_args if self.real_nodes is not None else {}),
        )
        self._timed("etcd+apiserver", t)
        t = time.monotonic()
        self.controller_manager = self._start_controller_manager(binaries)
        self.scheduler = self._start_scheduler(binaries)
        self._timed("controller-manager+scheduler", t)
        t = time.monotonic()
        if self.real_nodes is not None:
            labels = {"ix-gpu.io/test-node": "true"}
            self.nodes.update(self.real_nodes.start(binaries, self.api, self.log_dir, labels))
        for spec in self.node_specs if self.real_nodes is None else ():
            self.nodes[spec.name] = start_kubelet_node(
                binaries,
                self.api,
                self.log_dir,
                name=spec.name,
                pod_cidr=spec.pod_cidr,
                path=self.containers_path,
                image_dirs=(ROOT, Path(sys.prefix)),  # the ix-gpu installation every image runs
                ignore_run_as_user=True,  # this machine's Python lives under /root, mode 700
                labels={"ix-gpu.io/test-node": "true"},
                node_ip=self.node_ip,
                kubelet_config=self.kubelet_config,
            )
        for node in self.nodes.values():
            if isinstance(node, KubeletNode):
                node.wait_ready()
        self._timed("nodes Ready", t)
        t = time.monotonic()
        if self.plugin_config is not None and self.plugin_mode == "daemonset":
            self._start_plugin_daemonset(self.plugin_config)
            for spec in self.node_specs:
                self.wait_allocatable(spec.name, lambda n: n > 0)
        elif self.plugin_config is not None:
            for spec in self.node_specs:
                node = self.nodes[spec.name]
                self.plugins[spec.name] = PluginProcess(
                    self.work_dir / "plugins" / spec.name,
                    node.plugin_dir,
                    spec.devices,
                    with_node_labels(self.plugin_config),
                    self.log_dir,
                    name=f"ix-gpu-plugin-{spec.name}",
                    kubeconfig=self.kubeconfig,
                    node=spec.name,
                ).start()
            for spec in self.node_specs:
                self.wait_allocatable(spec.name, lambda n: n > 0)
        self._timed("plugins registered", t)
        if self.kwok_nodes:
            t = time.monotonic()
            self._start_kwok()
            self._timed(f"{self.kwok_nodes} kwok nodes Ready", t)
        # The namespace the pods go to needs its ServiceAccount (ServiceAccount admission).
        wait_until(
            lambda: self.api.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
            "the default ServiceAccount",
            60,
            interval=0.25,
            process=self.controller_manager,
        )
        self._timed("total", begin)

    def _start_kwok(self) -> None:
        """The simulated GPU nodes, and kwok making them Ready (tests/k8s/kwok.py)."""
        from tests.k8s import kwok

        binary = kwok.build_kwok()
        self.kwok_node_names = kwok.create_nodes(
            self.api, self.kwok_nodes, dra_every=self.kwok_dra_every, boards=self.kwok_boards
        )
        self.kwok = kwok.start_kwok(binary, self.api, self.work_dir / "kwok", self.log_dir)
        names = self.kwok_node_names
        wait_until(
            lambda: kwok.ready_nodes(self.api, names) == len(names),
            f"{len(names)} kwok nodes Ready",
            120 + len(names) / 50,
            interval=1,
            process=self.kwok,
            details=lambda: f"{kwok.ready_nodes(self.api, names)} Ready",
        )

    def _start_plugin_daemonset(self, plugin_config: str) -> None:
        """The plugin as DaemonSet ``PLUGIN_DAEMONSET`` in kube-system: image ``ix-gpu`` (fake-cri runs
        the host's ``ix-gpu``), the device-plugin directory by hostPath (each node's own: the hostPath
        is resolved in the node's mount namespace), the ix-config and each node's fake devices file
        (``/fake/$(NODE_NAME).yaml``) from ConfigMaps. ``--metrics-port=0``: all pods share the host's
        network namespace, and the plugin binds [::]:PORT (every address), so a second node's plugin
        would fail with EADDRINUSE."""
        api = self.api
        ns = "/api/v1/namespaces/kube-system"
        wait_until(
            lambda: api.request("GET", f"{ns}/serviceaccounts/default")[0] == 200,
            "the default ServiceAccount of kube-system",
            60,
            interval=0.25,
            process=self.controller_manager,
        )
        _apply(
            api, f"{ns}/configmaps", {"metadata": {"name": "ix-config"}, "data": {"ix-config": plugin_config}}
        )
        devices = {f"{spec.name}.yaml": spec.devices for spec in self.node_specs}
        _apply(api, f"{ns}/configmaps", {"metadata": {"name": "ix-gpu-fake-devices"}, "data": devices})
        labels = {"app.kubernetes.io/name": PLUGIN_DAEMONSET}
        container = {
            "name": "device-plugin",
            "image": "registry.example/ix-gpu:dev",
            "args": [
                "plugin",
                "--backend=fake",
                "--fake-devices=/fake/$(NODE_NAME).yaml",
                "--config=/ixconfig/ix-config",
                "--device-plugin-dir=/var/lib/kubelet/device-plugins",
                "--metrics-port=0",
            ],
            "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
            "securityContext": {"privileged": True, "runAsUser": 0},
            "volumeMounts": [
                {"name": "device-plugin", "mountPath": "/var/lib/kubelet/device-plugins"},
                {"name": "fake-devices", "mountPath": "/fake", "readOnly": True},
                {"name": "ix-config", "mountPath": "/ixconfig", "readOnly": True},
            ],
        }
        daemonset = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": PLUGIN_DAEMONSET, "labels": labels},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "enableServiceLinks": False,
                        "automountServiceAccountToken": False,
                        "containers": [container],
                        "volumes": [
                            {
                                "name": "device-plugin",
                                "hostPath": {"path": "/var/lib/kubelet/device-plugins"},
                            },
                            {"name": "fake-devices", "configMap": {"name": "ix-gpu-fake-devices"}},
                            {"name": "ix-config", "configMap": {"name": "ix-config"}},
                        ],
                    },
                },
            },
        }
        _apply(api, "/apis/apps/v1/namespaces/kube-system/daemonsets", daemonset)

    def plugin_pods(self) -> list[dict[str, Any]]:
        """The plugin DaemonSet's pods (``plugin_mode="daemonset"``)."""
        status, reply = self.api.request(
            "GET",
            f"/api/v1/namespaces/kube-system/pods?labelSelector=app.kubernetes.io/name%3D{PLUGIN_DAEMONSET}",
        )
        assert status == 200, reply
        items: list[dict[str, Any]] = reply["items"]
        return items

    def _component_kubeconfig(self) -> Path:
        return self.api.kubeconfig

    def _start_controller_manager(self, binaries: K8sBinaries) -> Process:
        pki = self.work_dir / "kube-apiserver" / "pki"
        port = free_port()
        kubeconfig = self._component_kubeconfig()
        proc = start_process(
            "kube-controller-manager",
            [
                str(binaries.kube_controller_manager),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.work_dir / 'kube-controller-manager'}",
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                "--controllers=" + ",".join(CONTROLLERS),
                "--concurrent-deployment-syncs=5",
                *CLIENT_LIMITS,
                "--v=1",
            ],
            self.log_dir,
        )
        wait_until(
            lambda: https_ok(f"https://127.0.0.1:{port}/healthz"),
            "kube-controller-manager /healthz",
            120,
            interval=0.25,
            process=proc,
        )
        return proc

    def _start_scheduler(self, binaries: K8sBinaries) -> Process:
        return start_kube_scheduler(
            binaries, self._component_kubeconfig(), self.work_dir, self.log_dir, CLIENT_LIMITS
        )

    def node_resource(self, name: str, resource: str = RESOURCE) -> tuple[int, int] | None:
        """(capacity, allocatable) of ``resource`` on Node ``name``; None before the kubelet reports it."""
        status = (self.nodes[name].node() or {}).get("status", {})
        capacity, allocatable = status.get("capacity", {}), status.get("allocatable", {})
        if resource not in capacity or resource not in allocatable:
            return None
        return int(capacity[resource]), int(allocatable[resource])

    def wait_allocatable(self, name: str, predicate: Callable[[int], bool], timeout_s: float = 60) -> int:
        """Wait until the Node's allocatable ``iluvatar.com/gpu`` satisfies ``predicate``; returns it."""
        plugin = self.plugins.get(name)

        def check() -> int | None:
            value = self.node_resource(name)
            return value[1] if value is not None and predicate(value[1]) else None

        result: int = wait_until(
            check,
            f"{RESOURCE} allocatable on {name}",
            timeout_s,
            interval=0.25,
            process=self.nodes[name].kubelet,
            details=(lambda: plugin.log_tail()) if plugin else None,
        )
        return result

    # ---------------------------------------------------------------- the webhook

    def install_webhook(
        self,
        config: dict[str, Any] | None = None,
        *,
        namespace: str = WEBHOOK_NAMESPACE,
        service: str = WEBHOOK_SERVICE,
        failure_policy: str = "Fail",
    ) -> WebhookProcess:
        """Run the real ``ix-gpu webhook`` as a host process and route the apiserver to it the way the
        chart does, through a Service: Service ``namespace/service`` (no selector) whose EndpointSlice
        names ADDRESS:PORT, and a MutatingWebhookConfiguration for Pods that refers to that Service.
        The apiserver (``--enable-aggregator-routing=true``, no kube-proxy) dials the endpoint,
        checking the certificate for ``service.namespace.svc``. ADDRESS is this machine's first
        global IPv4 address (``host_address``), because EndpointSlice validation refuses loopback
        addresses ("may not be in the loopback range"); RuntimeError when there is none.

        ``config``: the webhook's config (default: the built-in one, its Iluvatar driver root a
        directory under ``work_dir``, ``corex/``, with a ``lib64``, mounted at /usr/local/corex)."""
        address = host_address()
        if address is None:
            raise RuntimeError("no global IPv4 address: an EndpointSlice may not name a loopback address")
        work = self.work_dir / "webhook"
        work.mkdir(parents=True, exist_ok=True)
        dns = f"{service}.{namespace}.svc"
        certs = work / "certs"
        ix_gpu("certs", "generate", "--out", str(certs), "--dns", dns, "--ip", address, check=True)
        if config is None:
            config = yaml.safe_load(ix_gpu("config", "default", check=True).stdout)
            driver_root = self.work_dir / "corex"
            (driver_root / "lib64").mkdir(parents=True, exist_ok=True)
            for profile in config["profiles"]:
                for volume in profile["volumes"]:
                    if volume["hostPath"] == "/usr/local/corex":
                        volume["hostPath"] = str(driver_root)
        config_path = work / "webhook.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        ix_gpu("config", "validate", str(config_path), check=True)
        self.webhook = WebhookProcess(
            self.log_dir,
            certs,
            name="ix-gpu-webhook",
            config=config_path,
            kubeconfig=self.kubeconfig,
            host=address,
        ).start(ready=True)
        port = self.webhook.port
        api = self.api
        _apply(api, "/api/v1/namespaces", {"metadata": {"name": namespace}})
        _apply(
            api,
            f"/api/v1/namespaces/{namespace}/services",
            {
                "metadata": {"name": service},
                "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port, "protocol": "TCP"}]},
            },
        )
        _apply(
            api,
            f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
            {
                "metadata": {"name": f"{service}-host", "labels": {"kubernetes.io/service-name": service}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            },
        )
        ca_bundle = base64.b64encode((certs / "ca.crt").read_bytes()).decode()
        skipped = ["kube-system", "kube-public", "kube-node-lease", namespace]
        _apply(
            api,
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            {
                "metadata": {"name": "ix-gpu"},
                "webhooks": [
                    {
                        "name": "pods.ix-gpu.io",
                        "clientConfig": {
                            "service": {
                                "namespace": namespace,
                                "name": service,
                                "path": "/mutate",
                                "port": 443,
                            },
                            "caBundle": ca_bundle,
                        },
                        "rules": [
                            {
                                "apiGroups": [""],
                                "apiVersions": ["v1"],
                                "operations": ["CREATE"],
                                "resources": ["pods"],
                                "scope": "Namespaced",
                            }
                        ],
                        "namespaceSelector": {
                            "matchExpressions": [
                                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": skipped}
                            ]
                        },
                        "failurePolicy": failure_policy,
                        "sideEffects": "None",
                        "admissionReviewVersions": ["v1"],
                        "timeoutSeconds": 10,
                    }
                ],
            },
        )
        # The apiserver's webhook and endpoint caches are informers: wait until a dry-run GPU pod
        # comes back injected.
        probe = {
            "metadata": {"name": "ix-gpu-webhook-probe"},
            "spec": {
                "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {RESOURCE: "1"}}}]
            },
        }
        last: list[Any] = []

        def injected() -> bool:
            status, reply = api.request("POST", "/api/v1/namespaces/default/pods?dryRun=All", probe)
            last[:] = [status, reply]
            annotations = reply.get("metadata", {}).get("annotations", {}) if isinstance(reply, dict) else {}
            return status == 201 and "ix-gpu.io/injected" in annotations

        wait_until(
            injected,
            "a dry-run GPU pod injected through the webhook's Service",
            60,
            interval=0.5,
            process=self.webhook.process,
            details=lambda: f"last reply: {last}",
        )
        return self.webhook

    # ---------------------------------------------------------------- stop

    def stop(self) -> None:
        """Stop everything, newest first; never fails."""
        if self.webhook is not None:
            with contextlib.suppress(Exception):
                self.webhook.stop()
        for plugin in self.plugins.values():
            with contextlib.suppress(Exception):
                plugin.stop()
        if self.kwok is not None:
            with contextlib.suppress(Exception):
                self.kwok.stop()
        for node in self.nodes.values():
            if isinstance(node, KubeletNode):
                with contextlib.suppress(Exception):
                    node.close()
        if self.real_nodes is not None:
            with contextlib.suppress(Exception):
                self.real_nodes.close()
        for proc in (self.scheduler, self.controller_manager):
            if proc is not None:
                with contextlib.suppress(Exception):
                    proc.stop()
        if self.api_server is not None:
            with contextlib.suppress(Exception):
                self.api_server.stop()
        if self.etcd is not None:
            with contextlib.suppress(Exception):
                self.etcd.stop()
        self.plugins.clear()
        self.nodes.clear()


if __name__ == "__main__":
    # ``python -m tests.k8s.cluster up|down|serve|status|chart-values`` is the documented entry point.
    from tests.k8s.cluster_cli import main

    sys.exit(main())
