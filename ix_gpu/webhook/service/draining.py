"""Graceful shutdown: SIGTERM starts a drain, not an exit.

Why: the webhook is on the path of every GPU pod create with ``failurePolicy: Fail``. When the
kubelet stops a replica (``helm upgrade``, a node drain, a scale-down), it sends SIGTERM at the same
moment as the pod leaves the Service's endpoints, and the apiserver learns of the new endpoints a
moment later. A replica that stopped listening at once would refuse the reviews sent to it meanwhile,
and each one is a pod create that fails ("connection refused"). So on SIGTERM the server keeps
serving for ``delay`` seconds (``--shutdown-delay``) with ``/readyz`` failing, and every answer it
gives closes its connection (``Connection: close``): the apiserver's keep-alive connections to this
replica end one answer at a time, and its next connection goes to a replica still in the endpoints.
Then uvicorn's own shutdown runs: stop listening, close idle connections, finish the reviews in
flight. The process exits 0 (uvicorn would re-raise SIGTERM and die of it: exit 143, which
Kubernetes shows as an error).

A second SIGTERM, or SIGINT (Ctrl-C at a terminal), skips what is left of the delay.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from types import FrameType

import uvicorn

log = logging.getLogger("ix_gpu.webhook")


class Drain:
    """Whether this replica is leaving; read by ``/readyz`` and by every answer."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.since: float | None = None
        """``time.monotonic()`` of the SIGTERM that started the drain; None while serving normally."""

    @property
    def active(self) -> bool:
        return self.since is not None


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with SIGTERM starting a :class:`Drain` of ``drain.delay`` seconds before
    its shutdown."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The signal handler (main thread, between two bytecodes of whatever runs): it only sets
        flags and hands the rest to the loop, which runs callbacks where locks are safe to take."""
        assert self._loop is not None  # the handler is installed by serve()
        if sig == signal.SIGTERM and self.drain.delay > 0 and not self.drain.active:
            self.drain.since = time.monotonic()
            self._loop.call_soon_threadsafe(self._begin, sig)
            return
        if self.drain.active and not self.should_exit:
            name = signal.Signals(sig).name
            self._loop.call_soon_threadsafe(log.info, "%s during the drain: stopping now", name)
        self._stop(sig, frame)

    def _begin(self, sig: int) -> None:
        log.info(
            "SIGTERM: draining; /readyz fails and every answer closes its connection, so the "
            "apiserver moves to other replicas; serving on until the delay is over",
            extra={"fields": {"shutdownDelaySeconds": self.drain.delay}},
        )
        assert self._loop is not None
        self._loop.call_later(self.drain.delay, self._end, sig)

    def _end(self, sig: int) -> None:
        if not self.should_exit:
            log.info("drain over: no new connections; finishing the reviews in flight")
            self._stop(sig, None)

    def _stop(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if sig == signal.SIGTERM:
            # uvicorn re-raises the signals it caught once it has shut down; a drained stop is a
            # clean exit (0), not a death by SIGTERM (143).
            self._captured_signals[:] = [s for s in self._captured_signals if s != signal.SIGTERM]
