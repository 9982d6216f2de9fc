"""What the device plugin does to an allocation's chips between checking it and answering it: the
GPU reset of ``flags.reset_gpu`` (:mod:`ix_gpu.node.gpu_reset`), off the event loop.

The reset blocks for seconds, so it runs in a thread while ListAndWatch, registration and the other
calls go on. A reset that fails refuses the allocation; one after which a chip is gone also wakes
the health loop, which publishes the device list as it now is (the kubelet's next choice is then
among the devices that exist).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ix_gpu.node.backends.base import Backend, Chip
from ix_gpu.node.gpu_reset import ChipResetter, ResetFailed
from ix_gpu.plugin.offer.allocation import AllocationError
from ix_gpu.plugin.server.metrics import PluginMetrics


class ResetBeforeHandout:
    """The servicer's ``before_handout`` when ``flags.reset_gpu`` is on."""

    def __init__(
        self,
        backend: Backend,
        metrics: PluginMetrics,
        timeout: Callable[[], float],
        rediscover: Callable[[], None],
    ) -> None:
        """``timeout``: the config's ``gpuReset.timeoutSeconds`` now; ``rediscover``: wakes the
        health loop."""
        self.resetter = ChipResetter(backend, record=self._record)
        self.metrics = metrics
        self.timeout = timeout
        self.rediscover = rediscover

    def _record(self, result: str, seconds: float) -> None:
        self.metrics.gpu_resets.labels(result=result).inc()
        self.metrics.gpu_reset_seconds.observe(seconds)

    async def __call__(self, chips: list[Chip]) -> None:
        try:
            await asyncio.to_thread(self.resetter.reset, chips, self.timeout())
        except ResetFailed as exc:
            self.rediscover()
            raise AllocationError(str(exc)) from None
