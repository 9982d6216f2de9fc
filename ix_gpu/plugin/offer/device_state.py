"""The advertised device set with health, and the fan-out to ListAndWatch streams.

Each ListAndWatch message replaces the kubelet's whole view, so a slow stream never needs the
intermediate states it missed: watchers read the *latest* snapshot, never a queue of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from functools import partial

from ix_gpu.config.plugin_runtime import RuntimeConfig
from ix_gpu.devicemodel.vendors import Vendor
from ix_gpu.node.devices.device_list import Device, DeviceList

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class Snapshot:
    devices: DeviceList
    unhealthy: Mapping[str, str]
    """Physical device ID → reason, for the devices advertised Unhealthy."""
    config: RuntimeConfig
    vendor: Vendor
    control_nodes: tuple[str, ...] = ()
    final: bool = field(default=False)
    """The shutdown snapshot: every device Unhealthy, streams end after it."""

    def health(self, device: Device) -> str:
        if self.final or device.physical.id in self.unhealthy:
            return UNHEALTHY
        return HEALTHY

    def advertised(self) -> tuple[tuple[str, str, int | None], ...]:
        """(ID, health, NUMA node) per device: what the kubelet sees, for change detection."""
        return tuple((d.id, self.health(d), d.physical.numa_node) for d in self.devices.devices)


class DeviceState:
    def __init__(self, initial: Snapshot) -> None:
        self._snapshot = initial
        self._version = 0
        self._closed = False
        self._changed = asyncio.Condition()
        self.active_streams = 0

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    @property
    def closed(self) -> bool:
        """The plugin is stopping: streams end because it ends them."""
        return self._closed

    async def publish(self, snapshot: Snapshot) -> bool:
        """Replace the snapshot; wake the streams only if what the kubelet sees changed."""
        changed = snapshot.advertised() != self._snapshot.advertised() or snapshot.final
        async with self._changed:
            self._snapshot = snapshot
            if changed:
                self._version += 1
                self._changed.notify_all()
        return changed

    async def close(self) -> None:
        """End every stream after it has sent the current snapshot."""
        async with self._changed:
            self._closed = True
            self._changed.notify_all()

    async def watch(self) -> AsyncIterator[Snapshot]:
        """Yield the current snapshot, then each newer one, until :meth:`close`."""
        seen = -1
        self.active_streams += 1
        try:
            while True:
                async with self._changed:
                    await self._changed.wait_for(partial(self._newer_or_closed, seen))
                    version, snapshot, closed = self._version, self._snapshot, self._closed
                if version != seen:
                    seen = version
                    yield snapshot
                    continue
                if closed:
                    return
        finally:
            self.active_streams -= 1

    def _newer_or_closed(self, seen: int) -> bool:
        return self._version != seen or self._closed

    async def wait_streams_done(self, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.active_streams and loop.time() < deadline:
            await asyncio.sleep(0.01)
        return self.active_streams == 0
