"""What a restart on a busy real node may not change, read where a restart could change
it: each running container's own view of its GPUs, read from the host through its first process,
and what the node's kubelet says it allocated, through its PodResources API. The API objects a
restart leaves alone (a pod's spec, its claim's allocation) prove nothing about either.

- **A container's view** (:class:`ContainerView`): its container ID and restart count, its first
  process's host PID (the shim's child: it survives only if the container does), the GPU device
  nodes in its ``/dev`` with their numbers, its device cgroup's allow-list (what it may open, the
  kernel's say), its GPU environment (the device plugin's variable, the webhook's library path)
  and the driver mounts (the webhook's and a claim's CDI spec's).
- **PodResources** (``/var/lib/kubelet/pod-resources/kubelet.sock`` in the node's mount namespace,
  which is ``<node root>/kubelet/pod-resources/kubelet.sock`` on the host): every device-plugin
  device ID and every DRA device, each with the pods holding it. Two pods on one ID, or two claims
  on one DRA device (this release shares no chip), is a double allocation.
- **The kubelet's log** (klog, ``--v=2``): when its device-plugin registration server started,
  i.e. when a plugin can register again, and when a plugin's Register reached it.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc

from ix_gpu.node.attribution import ContainerDevices
from ix_gpu.plugin.api import podresources_v1_pb2 as pr
from ix_gpu.plugin.api.podresources_v1_pb2_grpc import PodResourcesListerStub
from ix_gpu.plugin.server.pod_resources import containers
from tests.k8s.real_nodes import DRIVER_ROOT, TIER_ROOT, container_cgroup, container_pids

GPU_ENV = ("IX_", "NVIDIA_", "CUDA_", "LD_LIBRARY_PATH")
"""Prefixes of the environment variables a container's GPUs are told to it by."""
REGISTRATION_SERVER = "Starting device plugin registration server"
REGISTER_REQUEST = "Got registration request from device plugin with resource"


@dataclasses.dataclass(frozen=True)
class ContainerView:
    """One running container's GPUs as it has them (the module's docstring)."""

    container_id: str
    restarts: int
    first_pid: int
    devices: tuple[str, ...]
    """``/dev/iluvatar<n> <major>:<minor>`` of each GPU device node in its ``/dev``."""
    allowed: tuple[str, ...]
    """Its device cgroup's ``devices.list``."""
    env: tuple[str, ...]
    mounts: tuple[str, ...]

    @property
    def numbers(self) -> set[str]:
        """The ``major:minor`` of its GPUs: which physical chips (stand-ins) it holds."""
        return {entry.rsplit(" ", 1)[1] for entry in self.devices}


def container_view(pod: dict[str, Any]) -> ContainerView:
    """The view of ``pod``'s one container, read now from the host (root)."""
    (status,) = pod["status"]["containerStatuses"]
    pid = container_pids(pod, status["name"])[0]
    proc = Path(f"/proc/{pid}")
    devices = []
    for path in sorted((proc / "root" / "dev").glob("iluvatar*")):
        number = os.stat(path).st_rdev
        devices.append(f"/dev/{path.name} {os.major(number)}:{os.minor(number)}")
    environ = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
    mounts = [line.split()[4] for line in (proc / "mountinfo").read_text().splitlines()]
    allowed = (container_cgroup(pod, status["name"], "devices") / "devices.list").read_text()
    return ContainerView(
        container_id=status["containerID"],
        restarts=int(status["restartCount"]),
        first_pid=pid,
        devices=tuple(devices),
        allowed=tuple(sorted(allowed.split("\n"))),
        env=tuple(sorted(e for e in environ if e.startswith(GPU_ENV))),
        mounts=tuple(
            sorted(m for m in mounts if m.startswith((DRIVER_ROOT, "/usr/local/corex", "/etc/ld.so")))
        ),
    )


def pod_resources_socket(node: str) -> Path:
    return TIER_ROOT / node / "kubelet" / "pod-resources" / "kubelet.sock"


def pod_resources(node: str) -> list[ContainerDevices]:
    """The containers of ``node`` that hold devices, as its kubelet's PodResources ``List`` says
    (the parsing is the device plugin's own, :mod:`ix_gpu.plugin.server.pod_resources`)."""
    with grpc.insecure_channel(f"unix://{pod_resources_socket(node)}") as channel:
        answer = PodResourcesListerStub(channel).List(pr.ListPodResourcesRequest(), timeout=5)
    return containers(answer)


def holders(found: Iterable[ContainerDevices]) -> dict[str, set[str]]:
    """Each device → who holds it: a device-plugin ID (``<resource> <id>``) → the pods whose
    containers have it; a DRA device (``<driver> <pool>/<device>``) → the claims that have it (a
    claim shared by pods is one holder)."""
    held: dict[str, set[str]] = {}
    for entry in found:
        for resource, ids in entry.devices.items():
            for device_id in ids:
                held.setdefault(f"{resource} {device_id}", set()).add(f"pod {entry.namespace}/{entry.pod}")
        for claim, driver, pool, device in entry.claims:
            held.setdefault(f"{driver} {pool}/{device}", set()).add(f"claim {claim}")
    return held


def double_allocations(found: Iterable[ContainerDevices]) -> dict[str, list[str]]:
    """The devices of :func:`holders` with more than one holder."""
    return {device: sorted(who) for device, who in holders(found).items() if len(who) > 1}


def shared_chips(views: dict[str, ContainerView]) -> dict[str, list[str]]:
    """The chips (device numbers) more than one of ``views`` (pod → view, one node's) can reach."""
    reaching: dict[str, list[str]] = {}
    for pod, view in sorted(views.items()):
        for number in view.numbers:
            reaching.setdefault(number, []).append(pod)
    return {number: pods for number, pods in reaching.items() if len(pods) > 1}


def klog_time(line: str, year: int) -> datetime.datetime | None:
    """The time of a klog line (``I1207 01:53:30.123456 ...``); None for another line."""
    if len(line) < 21 or line[0] not in "IWEF" or not line[1:5].isdigit():
        return None
    try:
        return datetime.datetime.strptime(f"{year}{line[1:21]}", "%Y%m%d %H:%M:%S.%f")
    except ValueError:
        return None


def first_after(
    log: str, needle: str, year: int, since: datetime.datetime | None = None
) -> datetime.datetime | None:
    """When the first line of ``log`` holding ``needle`` (at or after ``since``) was written."""
    for line in log.splitlines():
        if needle in line and (at := klog_time(line, year)) is not None and (since is None or at >= since):
            return at
    return None


def registration_delay(log: str, resource: str, year: int) -> tuple[float, datetime.datetime] | None:
    """Seconds from the kubelet's device-plugin registration server starting (the earliest a
    plugin can register) to the first Register of ``resource`` after it, and when it started;
    None until both are in ``log`` (the kubelet's log since its restart)."""
    started = first_after(log, REGISTRATION_SERVER, year)
    if started is None:
        return None
    registered = first_after(log, f'{REGISTER_REQUEST}" resourceName="{resource}"', year, started)
    if registered is None:
        return None
    return (registered - started).total_seconds(), started
