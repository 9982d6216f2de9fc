"""The kubelet's PodResources API (v1 ``List``), read for telemetry attribution
(:mod:`ix_gpu.node.attribution`): which container holds which device, device plugin and DRA alike.

Read by the plugin's own loop at most once per telemetry interval over the kubelet's socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``), with grpclib as the plugin's other gRPC, and a
2 s deadline. A socket that is missing or refuses leaves no holder (never a stale one: a pod that is
gone must not keep a chip), ``ix_gpu_pod_resources_up`` at 0 and one log line per distinct error;
the chips' own figures keep flowing.
"""

from __future__ import annotations

import logging
from pathlib import Path

from grpclib.client import Channel

from ix_gpu.node.attribution import ContainerDevices
from ix_gpu.plugin.api import podresources_v1_pb2 as pr
from ix_gpu.plugin.api.podresources_v1_grpc import PodResourcesListerStub

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEADLINE_S = 2.0


def containers(response: pr.ListPodResourcesResponse) -> list[ContainerDevices]:
    out = []
    for pod in response.pod_resources:
        for container in pod.containers:
            devices = {d.resource_name: tuple(d.device_ids) for d in container.devices if d.device_ids}
            claims = tuple(
                (f"{c.claim_namespace}/{c.claim_name}", r.driver_name, r.pool_name, r.device_name)
                for c in container.dynamic_resources
                for r in c.claim_resources
            )
            if devices or claims:
                out.append(ContainerDevices(pod.namespace, pod.name, container.name, devices, claims))
    return out


class PodResourcesReader:
    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.containers: list[ContainerDevices] = []
        self.up = False
        self._last_error = ""

    async def read(self) -> None:
        """One ``List``; on failure no holder is kept."""
        try:
            channel = Channel(path=str(self.socket))
            try:
                stub = PodResourcesListerStub(channel)
                answer = await stub.List(pr.ListPodResourcesRequest(), timeout=DEADLINE_S)
            finally:
                channel.close()
        except Exception as exc:
            # A missing or refusing socket (OSError), a deadline, a gRPC error, and whatever else a
            # misbehaving kubelet can cause: none may crash the loop, whose restarts fail /healthz.
            self.containers, self.up = [], False
            error = f"{type(exc).__name__}: {exc}"
            if error != self._last_error:
                log.warning(
                    "cannot read the kubelet's PodResources API at %s (%s): chips are shown without "
                    "their pods until it answers",
                    self.socket,
                    error,
                )
                self._last_error = error
            return
        if self._last_error:
            log.info("the kubelet's PodResources API at %s answers again", self.socket)
            self._last_error = ""
        self.containers, self.up = containers(answer), True
