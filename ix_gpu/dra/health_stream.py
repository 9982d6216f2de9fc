"""Device health for the kubelet's DRA health stream (``NodeWatchResources``, KEP-4680), which puts
it into the status of the pods using each device (``allocatedResourcesStatus``).

The health loop reads the chips every ``--health-interval`` and hands the result to
:class:`HealthReports`; each open stream (one per kubelet connection) sends the whole pool's health
at once, again on every change, and at least every interval. Every report carries the time of the
read it comes from and a timeout of three intervals (at least 15 s): if the loop stops reading (a
wedged library call), the kubelet turns the devices' health to Unknown on its own instead of
showing a stale Healthy. A pool's devices are at most a few dozen, so whole reports are cheap.

Served as ``v1.DRAResourceHealth`` (the 1.37 kubelet's first choice) and ``v1alpha1`` (what 1.35 and
1.36 ask for), from one implementation: the messages are the same, field for field.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from grpclib.server import Stream

from ix_gpu.dra.api import dra_health_v1_pb2 as health_v1
from ix_gpu.dra.api import dra_health_v1alpha1_pb2 as health_v1alpha1
from ix_gpu.dra.api.dra_health_v1_grpc import DRAResourceHealthBase as V1Base
from ix_gpu.dra.api.dra_health_v1alpha1_grpc import DRAResourceHealthBase as V1alpha1Base
from ix_gpu.dra.devices import DraDevice

log = logging.getLogger(__name__)

HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
"""What GetInfo adds to ``supported_versions`` for the health stream."""
MESSAGE_LIMIT = 1024
"""The kubelet keeps at most this many characters of a message."""


@dataclass(frozen=True)
class DeviceHealth:
    device: str
    healthy: bool
    message: str


class HealthReports:
    """The latest health of this node's pool, and a wake-up for the streams when it changes."""

    def __init__(self, pool: str, interval: float) -> None:
        self.pool = pool
        self.interval = interval
        self.timeout_s = max(15, int(3 * interval + 0.999))
        self.devices: tuple[DeviceHealth, ...] = ()
        self.read_at = 0
        self.version = 0
        self._changed = asyncio.Condition()

    async def update(self, devices: Iterable[DraDevice], read_at: float) -> None:
        """The health read at ``read_at`` (Unix seconds); wakes the streams when it differs."""
        found = tuple(DeviceHealth(d.name, d.healthy, d.unhealthy_reason[:MESSAGE_LIMIT]) for d in devices)
        self.read_at = int(read_at)
        if found != self.devices:
            self.devices = found
            async with self._changed:
                self.version += 1
                self._changed.notify_all()

    async def next_change(self, seen: int) -> None:
        """Return once the version passes ``seen`` or an interval has gone by."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait_for(lambda: self.version > seen), self.interval)

    def response(self, messages: Any) -> Any:
        """The current report as ``messages``' ``NodeWatchResourcesResponse``."""
        return messages.NodeWatchResourcesResponse(
            devices=[
                messages.DeviceHealth(
                    device=messages.DeviceIdentifier(pool_name=self.pool, device_name=d.device),
                    health=messages.HEALTHY if d.healthy else messages.UNHEALTHY,
                    last_updated_time=self.read_at,
                    health_check_timeout_seconds=self.timeout_s,
                    message=d.message,
                )
                for d in self.devices
            ]
        )

    async def serve(self, stream: Stream[Any, Any], messages: Any) -> None:
        """One kubelet's stream, until it goes away (a send fails) or the server closes."""
        await stream.recv_message()
        log.info("the kubelet watches device health (%s)", messages.DESCRIPTOR.package)
        while True:
            seen = self.version
            await stream.send_message(self.response(messages))
            await self.next_change(seen)


class HealthV1Servicer(V1Base):
    def __init__(self, reports: HealthReports) -> None:
        self.reports = reports

    async def NodeWatchResources(
        self, stream: Stream[health_v1.NodeWatchResourcesRequest, health_v1.NodeWatchResourcesResponse]
    ) -> None:
        await self.reports.serve(stream, health_v1)


class HealthV1alpha1Servicer(V1alpha1Base):
    def __init__(self, reports: HealthReports) -> None:
        self.reports = reports

    async def NodeWatchResources(
        self,
        stream: Stream[health_v1alpha1.NodeWatchResourcesRequest, health_v1alpha1.NodeWatchResourcesResponse],
    ) -> None:
        await self.reports.serve(stream, health_v1alpha1)
