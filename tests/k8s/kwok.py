"""Simulated GPU nodes for the tier: kwok (``sigs.k8s.io/kwok``, built from the module proxy by
``build-go-command.sh kwok``) against the tier's real apiserver, scheduler and controllers.

Each simulated node is a Node object kwok manages (the annotation ``kwok.x-k8s.io/node: fake``),
with what our agents would have given it, computed by the project's own code:

- ``iluvatar.com/gpu`` capacity and allocatable, and the ``ix-gpu.io/gpu.*`` labels the device
  plugin publishes (``node_labels`` of the device list the plugin would build), the products mixed
  (BI-V100, BI-V150, MR-V100);
- for every ``dra_every``-th node instead: the allocation label ``ix-gpu.io/gpu.allocation=dra``,
  no ``iluvatar.com/gpu``, and the ResourceSlice the DRA plugin writes, published by its own
  :class:`~ix_gpu.dra.slices.SlicePublisher`.

No kubelet runs there, so no device plugin or DRA plugin either: these are their effects on the
API, not the agents. kwok's stages, written here, make a node Ready and keep its allocatable, make
a bound pod Running (its containers ready) and delete a pod once it is marked for deletion. The
nodes carry kwok's taint :data:`TAINT`, so only pods that tolerate it (:data:`TOLERATION`) land
there: the chart's webhook replicas and DaemonSets stay on the real nodes, where their containers
really run.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ix_gpu.devicemodel.labels import GPU_ALLOCATION
from ix_gpu.devicemodel.vendors import ILUVATAR
from ix_gpu.dra.devices import dra_devices, slice_devices
from ix_gpu.dra.slices import SlicePublisher
from ix_gpu.kube.kubeconfig import read_kubeconfig
from ix_gpu.node.backends.base import Chip
from ix_gpu.node.devices.device_list import build_device_list
from ix_gpu.node.node_labels import node_labels
from tests.k8s.k8s_tier import KubeAPI, build_go_command
from tests.support.processes import Process, start_process

KWOK_VERSION = "v0.8.0"
ANNOTATION = "kwok.x-k8s.io/node"
DRIVER = "gpu.iluvatar.com"
PRODUCTS = (("Iluvatar BI-V100", 1, 32768), ("Iluvatar BI-V150", 2, 32768), ("Iluvatar MR-V100", 1, 16384))
"""(product, chips per board, MiB per chip), taken in turn by the simulated nodes."""
BOARDS = 4
"""Boards per simulated node (default)."""
TAINT = {"key": ANNOTATION, "value": "fake", "effect": "NoSchedule"}
TOLERATION = {"key": ANNOTATION, "operator": "Equal", "value": "fake", "effect": "NoSchedule"}
"""What a pod meant for the simulated nodes carries."""
REPLICAS = 4
"""Pods per board (time slicing, as the seed's ConfigMap has it): 16 ``iluvatar.com/gpu`` a node
with the default boards."""

STAGES = """\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  manageAllNodes: false
  manageNodesWithAnnotationSelector: kwok.x-k8s.io/node=fake
  nodeLeaseDurationSeconds: 40
  nodeLeaseParallelism: 4
  nodePlayStageParallelism: 4
  podPlayStageParallelism: 8
  podsOnNodeSyncParallelism: 4
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
  enableDebuggingHandlers: false
---
# A node kwok manages and that is not Ready yet: Ready, with an address, its allocatable and
# capacity as created (our GPUs), and the default sizes where it has none.
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: gpu-node-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: NotIn
      values: ['True']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - type: {{ .type | Quote }}
        status: {{ .status | Quote }}
        reason: {{ .reason | Quote }}
        message: {{ .message | Quote }}
        lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
      {{ end }}
      addresses:
      {{ with NodeIP }}
      - type: InternalIP
        address: {{ . | Quote }}
      {{ end }}
      - type: Hostname
        address: {{ NodeName | Quote }}
      allocatable:
      {{ with .status.allocatable }}{{ YAML . 1 }}{{ else }}
        cpu: "64"
        memory: 512Gi
        pods: "110"
      {{ end }}
      capacity:
      {{ with .status.capacity }}{{ YAML . 1 }}{{ else }}
        cpu: "64"
        memory: 512Gi
        pods: "110"
      {{ end }}
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
        containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
      phase: Running
---
# A pod bound to a simulated node and still Pending: Running, every container started and ready.
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: gpu-pod-running
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: .metadata.deletionTimestamp
      operator: DoesNotExist
    - key: .status.phase
      operator: In
      values: [Pending]
  next:
    statusTemplate: |
      {{ $now := Now }}
      phase: Running
      startTime: {{ $now | Quote }}
      conditions:
      {{ range list "PodScheduled" "Initialized" "ContainersReady" "Ready" }}
      - type: {{ . }}
        status: "True"
        lastTransitionTime: {{ $now | Quote }}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: true
        started: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      {{ with NodeIPWith .spec.nodeName }}
      hostIP: {{ . | Quote }}
      {{ end }}
      {{ with PodIPWith .spec.nodeName false .metadata.uid .metadata.name .metadata.namespace }}
      podIP: {{ . | Quote }}
      {{ end }}
---
# A pod marked for deletion: gone (no kubelet to wait for).
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: gpu-pod-gone
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: .metadata.deletionTimestamp
      operator: Exists
  next:
    delete: true
"""


def build_kwok() -> Path:
    """The kwok binary (built once from the module proxy, then cached; cold: about 2 minutes);
    ``IX_GPU_KWOK_BIN`` names a directory with one instead."""
    return build_go_command("kwok", KWOK_VERSION, "IX_GPU_KWOK_BIN")


def chips(node: str, product: str, per_board: int, memory_mib: int, boards: int = BOARDS) -> list[Chip]:
    """The chips the fake backend would report for a simulated node of ``product``."""
    found = []
    for board in range(boards):
        for position in range(per_board):
            index = board * per_board + position
            found.append(
                Chip(
                    uuid=f"GPU-{node}-{index:02d}",
                    index=index,
                    minor=index,
                    board_id=f"{node}-board{board}",
                    board_position=position,
                    product=product,
                    memory_mib=memory_mib,
                    numa_node=board % 2,
                )
            )
    return found


def node_body(
    name: str, index: int, *, dra: bool, replicas: int = REPLICAS, boards: int = BOARDS
) -> tuple[dict[str, Any], list[Chip]]:
    """A simulated GPU node and its chips: every third node of each product in turn, each board
    shared ``replicas`` times (the seed's ``sharing.timeSlicing.replicas``)."""
    product, per_board, memory = PRODUCTS[index % len(PRODUCTS)]
    node_chips = chips(name, product, per_board, memory, boards)
    devices = build_device_list(node_chips, splitboard=False, replicas=replicas)
    labels = {"kubernetes.io/hostname": name, "type": "kwok", **node_labels(devices)}
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    if dra:
        labels = {"kubernetes.io/hostname": name, "type": "kwok", GPU_ALLOCATION: "dra"}
    else:
        resources[ILUVATAR.resource_name] = str(len(devices.devices))
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {ANNOTATION: "fake"}},
        "spec": {"providerID": f"kwok://{name}", "taints": [TAINT]},
        "status": {"capacity": resources, "allocatable": resources},
    }
    return body, node_chips


def create_nodes(
    api: KubeAPI,
    count: int,
    *,
    dra_every: int = 4,
    replicas: int = REPLICAS,
    boards: int = BOARDS,
    workers: int = 8,
) -> list[str]:
    """``count`` simulated GPU nodes ``kwok-gpu-<i>`` of ``boards`` boards each; every
    ``dra_every``-th (0: none) is a DRA node with its ResourceSlice. Returns their names."""
    server = read_kubeconfig(api.kubeconfig)
    names = [f"kwok-gpu-{i:05d}" for i in range(count)]

    def one(index: int) -> None:
        name = names[index]
        dra = dra_every > 0 and index % dra_every == dra_every - 1
        body, node_chips = node_body(name, index, dra=dra, replicas=replicas, boards=boards)
        status, reply = api.request("POST", "/api/v1/nodes", body)
        if status not in (201, 409):
            raise RuntimeError(f"node {name}: {status} {str(reply)[:300]}")
        if status == 201:
            # The apiserver ignores status on create: write capacity through the status subresource.
            patch = {"status": body["status"]}
            status, reply = api.request(
                "PATCH", f"/api/v1/nodes/{name}/status", patch, content_type="application/merge-patch+json"
            )
            if status != 200:
                raise RuntimeError(f"node {name} status: {status} {str(reply)[:300]}")
        if dra:
            devices = slice_devices(dra_devices(node_chips, splitboard=False), ILUVATAR, DRIVER)
            SlicePublisher(server, driver=DRIVER, node=name).publish(devices)

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(count)))
    return names


def start_kwok(kwok: Path, api: KubeAPI, work_dir: Path, log_dir: Path) -> Process:
    """kwok managing the nodes annotated ``kwok.x-k8s.io/node=fake``, with :data:`STAGES`."""
    work_dir.mkdir(parents=True, exist_ok=True)
    config = work_dir / "kwok.yaml"
    config.write_text(STAGES)
    return start_process(
        "kwok",
        [str(kwok), f"--kubeconfig={api.kubeconfig}", f"--config={config}", "--cidr=10.200.0.0/16",
         "--node-ip=10.199.0.1"],
        log_dir,
        # The tier's etcd (3.5.1) has no progress notifications the apiserver trusts, so it refuses
        # client-go's streaming lists; kwok's informers then fell back to lists every few seconds and
        # pods reached Running in batches 4.5 s apart. Plain list + watch, as before WatchList.
        env={**os.environ, "KUBE_FEATURE_WatchListClient": "false"},
    )  # fmt: skip


def ready_nodes(api: KubeAPI, names: Iterable[str]) -> int:
    """How many of ``names`` are Ready."""
    wanted = set(names)
    status, listed = api.request("GET", "/api/v1/nodes?labelSelector=type%3Dkwok")
    if status != 200:
        return 0
    ready = 0
    for node in listed.get("items", []):
        conditions = node.get("status", {}).get("conditions", [])
        if node["metadata"]["name"] in wanted and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
        ):
            ready += 1
    return ready
