"""The DevicePlugin gRPC service: a thin adapter from protobuf to :mod:`ix_gpu.plugin.devices.allocation`.

It knows nothing about libixml or NVML, only the current
:class:`~ix_gpu.plugin.devices.device_state.Snapshot`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import grpc

from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2 as pb
from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from ix_gpu.plugin.devices.allocation import (
    AllocationError,
    allocate_container,
    check_container_count,
    clip,
    preferred_allocation,
)
from ix_gpu.plugin.devices.device_state import DeviceState, Snapshot
from ix_gpu.plugin.server.metrics import PluginMetrics
from ix_gpu.runtime.outcomes import ERROR, SUCCESS

log = logging.getLogger(__name__)

MAX_STATUS_DETAILS = 1024
"""Longest status message the plugin sends. Details travel in HTTP/2 headers that gRPC clients cap
(16 KiB in C-core, the kubelet's Go client similar); a longer one is not delivered at all, and the
kubelet sees RESOURCE_EXHAUSTED instead of the INVALID_ARGUMENT and the reason. Messages from
:mod:`~ix_gpu.plugin.devices.allocation` are already short; this bound holds whatever they become."""


def list_and_watch_response(snapshot: Snapshot) -> pb.ListAndWatchResponse:
    devices = []
    for device in snapshot.devices.devices:
        numa = device.physical.numa_node
        topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa)]) if numa is not None and numa >= 0 else None
        devices.append(pb.Device(ID=device.id, health=snapshot.health(device), topology=topology))
    return pb.ListAndWatchResponse(devices=devices)


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    def __init__(self, state: DeviceState, metrics: PluginMetrics) -> None:
        self.state = state
        self.metrics = metrics

    async def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def ListAndWatch(self, request: pb.Empty, context: Any) -> AsyncIterator[pb.ListAndWatchResponse]:
        # Never returns on its own: the kubelet marks every device Unhealthy when this stream
        # ends. It ends only at shutdown, after the all-Unhealthy snapshot has been sent.
        log.info("kubelet opened ListAndWatch")
        async for snapshot in self.state.watch():
            yield list_and_watch_response(snapshot)
        log.info("ListAndWatch stream closed (shutting down)")

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        snapshot = self.state.snapshot
        try:
            check_container_count(len(request.container_requests), snapshot.devices)
        except AllocationError as exc:
            # preferred_allocation never fails a real request; this one no kubelet sends, and
            # answering it would take seconds of work.
            await self._reject(context, "GetPreferredAllocation", exc)
        responses = []
        for req in request.container_requests:
            ids = preferred_allocation(
                snapshot.devices,
                list(req.available_deviceIDs),
                list(req.must_include_deviceIDs),
                req.allocation_size,
                snapshot.config.allocation.replica_policy,
            )
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        started = time.perf_counter()
        snapshot = self.state.snapshot
        responses = []
        try:
            check_container_count(len(request.container_requests), snapshot.devices)
        except AllocationError as exc:
            self.metrics.allocations.labels(result=ERROR).inc()
            await self._reject(context, "Allocate", exc)
        for req in request.container_requests:
            try:
                allocation = allocate_container(
                    list(req.devices_ids),
                    snapshot.devices,
                    vendor=snapshot.vendor,
                    control_nodes=snapshot.control_nodes,
                    config=snapshot.config,
                )
            except AllocationError as exc:
                self.metrics.allocations.labels(result=ERROR).inc()
                await self._reject(context, "Allocate", exc)
            self.metrics.allocations.labels(result=SUCCESS).inc()
            responses.append(
                pb.ContainerAllocateResponse(
                    envs=allocation.envs,
                    devices=[
                        pb.DeviceSpec(
                            container_path=n.container_path, host_path=n.host_path, permissions=n.permissions
                        )
                        for n in allocation.device_nodes
                    ],
                )
            )
        self.metrics.allocate_seconds.observe(time.perf_counter() - started)
        return pb.AllocateResponse(container_responses=responses)

    @staticmethod
    async def _reject(context: Any, call: str, exc: AllocationError) -> NoReturn:
        """End the call with INVALID_ARGUMENT and the reason, bounded for the wire and the log."""
        details = clip(str(exc), MAX_STATUS_DETAILS)
        log.warning("%s rejected: %s", call, details)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, details)
        raise exc  # abort raises; this line is for type checkers

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def add_to_server(servicer: DevicePluginServicer, server: Any) -> None:
    pb_grpc.add_DevicePluginServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
