"""The device plugin's CDI spec (``deviceListStrategy: cdi``), written before the devices in it are
advertised: a device the kubelet hands out must resolve in the spec, or the container fails to
start. When the spec cannot be written, the new device list is not advertised (pods wait instead of
failing), and the reason is logged once until it changes."""

from __future__ import annotations

import asyncio
import logging

from ix_gpu.config.plugin_runtime import RuntimeConfig
from ix_gpu.node.backends.base import Backend
from ix_gpu.node.devices.cdi import CdiError, cdi_spec, spec_path, write_spec
from ix_gpu.node.devices.device_list import DeviceList

log = logging.getLogger("ix_gpu.plugin.server.app")


class CdiSpecWriter:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.error: str | None = None
        """Why the last write failed; None after a good one."""

    async def write(self, devices: DeviceList, config: RuntimeConfig) -> bool:
        """Write the spec for ``devices`` (atomically, only when it changed); False when it could
        not be written, and then the list must not be advertised."""
        vendor = self.backend.vendor
        path = spec_path(config.cdi_spec_dir, vendor)
        try:
            control = self.backend.control_nodes()
            spec = cdi_spec(devices, vendor, control, driver_root=config.cdi_driver_root)
            changed = await asyncio.to_thread(write_spec, spec, path)
        except (OSError, CdiError) as exc:
            message = str(exc)
            if message != self.error:
                log.error(
                    "cannot write the CDI spec %s; the device list is not advertised until it can: %s",
                    path,
                    message,
                )
            self.error = message
            return False
        if changed:
            log.info("wrote the CDI spec %s (%d devices)", path, len(devices.devices))
        self.error = None
        return True
