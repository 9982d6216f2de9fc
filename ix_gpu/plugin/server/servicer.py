"""The DevicePlugin gRPC service: a thin adapter from protobuf to :mod:`ix_gpu.plugin.offer.allocation`.

It knows nothing about libixml or NVML, only the current
:class:`~ix_gpu.plugin.offer.device_state.Snapshot`.

Served with grpclib (pure asyncio over h2) rather than grpcio: grpcio's C core costs the process
about 9 MiB more, and the kubelet's grpc-go client is the only one that calls us. Each call is
split in two: a method that maps a request message to a response message (``allocate``,
``preferred_allocation``; what the benchmark times alone), and the grpclib handler that reads the
request from the stream, sends the answer and turns a refusal into ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn, TypeVar

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ix_gpu.node.backends.base import Chip
from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2 as pb
from ix_gpu.plugin.api.deviceplugin_v1beta1_grpc import DevicePluginBase
from ix_gpu.plugin.offer.allocation import (
    AllocationError,
    allocate_container,
    check_container_count,
    clip,
    preferred_allocation,
)
from ix_gpu.plugin.offer.device_state import DeviceState, Snapshot
from ix_gpu.plugin.server.metrics import PluginMetrics
from ix_gpu.process.outcomes import ERROR, SUCCESS

if TYPE_CHECKING:
    from grpclib.server import Stream


log = logging.getLogger(__name__)

Request = TypeVar("Request")
Response = TypeVar("Response")

MAX_STATUS_DETAILS = 1024
"""Longest status message the plugin sends. Details travel in HTTP/2 headers that gRPC clients cap
(16 KiB in C-core, the kubelet's Go client similar); a longer one is not delivered at all, and the
kubelet sees RESOURCE_EXHAUSTED instead of the INVALID_ARGUMENT and the reason. Messages from
:mod:`~ix_gpu.plugin.offer.allocation` are already short; this bound holds whatever they become."""

OPTIONS = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)
"""What GetDevicePluginOptions answers, and what Register announces."""


def list_and_watch_response(snapshot: Snapshot) -> pb.ListAndWatchResponse:
    devices = []
    for device in snapshot.devices.devices:
        numa = device.physical.numa_node
        topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa)]) if numa is not None and numa >= 0 else None
        devices.append(pb.Device(ID=device.id, health=snapshot.health(device), topology=topology))
    return pb.ListAndWatchResponse(devices=devices)


def allocated_chips(request: pb.AllocateRequest, snapshot: Snapshot) -> list[Chip]:
    """The physical chips of every device ``request`` asks for (checked by :meth:`allocate` already),
    each once: both chips of a board that is one device."""
    by_id = {device.id: device for device in snapshot.devices.devices}
    chips: dict[str, Chip] = {}
    for container in request.container_requests:
        for device_id in container.devices_ids:
            for chip in by_id[device_id].physical.chips:
                chips.setdefault(chip.uuid, chip)
    return list(chips.values())


class Rejected(Exception):
    """A request the plugin refuses; the handler answers INVALID_ARGUMENT with ``details``."""

    def __init__(self, call: str, reason: AllocationError) -> None:
        self.details = clip(str(reason), MAX_STATUS_DETAILS)
        super().__init__(f"{call} rejected: {self.details}")


async def _request(stream: Stream[Request, Response]) -> Request:
    request = await stream.recv_message()
    if request is None:  # the client half-closed without a message; no gRPC client does that
        raise GRPCError(Status.INVALID_ARGUMENT, "no request message")
    return request


BeforeHandout = Callable[[list[Chip]], Awaitable[None]]
"""What runs on an allocation's chips after the allocation is checked and before it is answered
(the GPU reset of ``flags.reset_gpu``); raises :class:`AllocationError` to refuse it."""


@dataclass(frozen=True)
class Choice:
    """What :data:`ChooseDevices` answers: the device IDs to bind, per container request."""

    ids: list[list[str]]
    settle: Callable[[bool], Awaitable[None]] | None = None
    """Told whether the allocation was answered (True) or refused after the choice (False)."""


ChooseDevices = Callable[[list[list[str]], Snapshot], Awaitable[Choice]]
"""What may replace the kubelet's device IDs before the allocation is checked (Volcano's choice,
``flags.usevolcano``: :mod:`ix_gpu.plugin.server.volcano`); everything downstream (device nodes,
variables, CDI names, the reset's chips) then follows its IDs. Raises :class:`AllocationError`
to refuse the allocation."""


async def _settle(choice: Choice | None, answered: bool) -> None:
    if choice is not None and choice.settle is not None:
        await choice.settle(answered)


class DevicePluginServicer(DevicePluginBase):
    def __init__(
        self,
        state: DeviceState,
        metrics: PluginMetrics,
        before_handout: BeforeHandout | None = None,
        choose_devices: ChooseDevices | None = None,
    ) -> None:
        self.state = state
        self.metrics = metrics
        self.before_handout = before_handout
        self.kubelet_left: Callable[[], None] | None = None
        """Called when the kubelet ends a ListAndWatch stream while the plugin serves on."""
        self.choose_devices = choose_devices

    # -- the calls, message in and message out ------------------------------------------------

    def preferred_allocation(self, request: pb.PreferredAllocationRequest) -> pb.PreferredAllocationResponse:
        snapshot = self.state.snapshot
        try:
            check_container_count(len(request.container_requests), snapshot.devices)
        except AllocationError as exc:
            # preferred_allocation never fails a real request; this one no kubelet sends, and
            # answering it would take seconds of work.
            raise Rejected("GetPreferredAllocation", exc) from None
        responses = []
        for req in request.container_requests:
            ids = preferred_allocation(
                snapshot.devices,
                list(req.available_deviceIDs),
                list(req.must_include_deviceIDs),
                req.allocation_size,
                snapshot.config.replica_policy,
            )
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=responses)

    def allocate(self, request: pb.AllocateRequest) -> pb.AllocateResponse:
        started = time.perf_counter()
        snapshot = self.state.snapshot
        responses = []
        try:
            check_container_count(len(request.container_requests), snapshot.devices)
        except AllocationError as exc:
            self.metrics.allocations.labels(result=ERROR).inc()
            raise Rejected("Allocate", exc) from None
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
                raise Rejected("Allocate", exc) from None
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
                    cdi_devices=[pb.CDIDevice(name=name) for name in allocation.cdi_devices],
                )
            )
        self.metrics.allocate_seconds.observe(time.perf_counter() - started)
        return pb.AllocateResponse(container_responses=responses)

    # -- grpclib handlers ---------------------------------------------------------------------

    async def GetDevicePluginOptions(self, stream: Stream[pb.Empty, pb.DevicePluginOptions]) -> None:
        await _request(stream)
        await stream.send_message(OPTIONS)

    async def ListAndWatch(self, stream: Stream[pb.Empty, pb.ListAndWatchResponse]) -> None:
        # Never returns on its own: the kubelet marks every device Unhealthy when this stream
        # ends. It ends only at shutdown, after the all-Unhealthy snapshot has been sent (returning
        # then sends the OK trailers). A kubelet that goes away resets the stream, and grpclib
        # cancels this task: the watch's ``finally`` still runs.
        await _request(stream)
        log.info("kubelet opened ListAndWatch")
        try:
            async for snapshot in self.state.watch():
                await stream.send_message(list_and_watch_response(snapshot))
        finally:
            if not self.state.closed and self.kubelet_left is not None:
                self.kubelet_left()  # the kubelet ended it, not we
        log.info("ListAndWatch stream closed (shutting down)")

    async def GetPreferredAllocation(
        self, stream: Stream[pb.PreferredAllocationRequest, pb.PreferredAllocationResponse]
    ) -> None:
        await self._answer(stream, self.preferred_allocation)

    async def Allocate(self, stream: Stream[pb.AllocateRequest, pb.AllocateResponse]) -> None:
        request = await _request(stream)
        snapshot = self.state.snapshot
        choice = None
        try:
            if self.choose_devices is not None and snapshot.config.usevolcano:
                choice = await self._choose(self.choose_devices, request, snapshot)
                request = pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in choice.ids]
                )
            response = self.allocate(request)
            if self.before_handout is not None and snapshot.config.reset_gpu:
                try:
                    await self.before_handout(allocated_chips(request, snapshot))
                except AllocationError as exc:
                    self.metrics.allocations.labels(result=ERROR).inc()
                    raise Rejected("Allocate", exc) from None
        except Rejected as exc:
            await _settle(choice, answered=False)
            self._reject(exc)
        await _settle(choice, answered=True)
        await stream.send_message(response)

    async def _choose(self, choose: ChooseDevices, request: pb.AllocateRequest, snapshot: Snapshot) -> Choice:
        """The devices to bind instead of the kubelet's; a request too large to be real is refused
        first, as :meth:`allocate` would, before any choice is made for it."""
        try:
            check_container_count(len(request.container_requests), snapshot.devices)
            return await choose([list(c.devices_ids) for c in request.container_requests], snapshot)
        except AllocationError as exc:
            self.metrics.allocations.labels(result=ERROR).inc()
            raise Rejected("Allocate", exc) from None

    async def _answer(self, stream: Stream[Request, Response], handle: Callable[[Request], Response]) -> None:
        """One unary call: the request, ``handle``'s answer, or INVALID_ARGUMENT when it rejects."""
        request = await _request(stream)
        try:
            response = handle(request)
        except Rejected as exc:
            self._reject(exc)
        await stream.send_message(response)

    async def PreStartContainer(
        self, stream: Stream[pb.PreStartContainerRequest, pb.PreStartContainerResponse]
    ) -> None:
        await _request(stream)
        await stream.send_message(pb.PreStartContainerResponse())

    @staticmethod
    def _reject(exc: Rejected) -> NoReturn:
        """End the call with INVALID_ARGUMENT and the reason, bounded for the wire and the log."""
        log.warning("%s", exc)
        raise GRPCError(Status.INVALID_ARGUMENT, exc.details) from None
