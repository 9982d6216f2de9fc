"""GPU reset between tenants (``flags.reset_gpu``): the chips a pod is about to get are reset first,
so no pod inherits another's memory, contexts or clock settings. The device plugin resets an
allocation's chips in Allocate, the DRA plugin a claim's whole chips and boards in prepare; both
through :class:`ChipResetter`, below both agents.

**One library, one user at a time.** The vendor's tool (``ixsmi -r``, ``nvidia-smi --gpu-reset``)
needs the chips idle, so the backend releases the management library for the reset and takes it
again after (:meth:`ix_gpu.node.backends.base.Backend.reset`). The agent's other users of the library
(discovery on each health interval, the telemetry reader thread) must not call it meanwhile:
:class:`SerializedBackend` puts every call of the agent's backend under one lock, and a reset holds
it throughout. Iluvatar's plugin coordinates with its exporter through a per-node ConfigMap for the
same reason; here the telemetry is the agent's own thread, so a lock is the whole protocol.

**Bounded.** The tool runs under ``gpuReset.timeoutSeconds`` (killed with everything it started when
it overruns), and a reset waits at most as long for the lock. A reset that fails or overruns fails
the allocation: the pod is refused with the reason (the kubelet reports it on the pod), and the
chips are not handed out unreset, because the point of the setting is that they never are.

**Identity.** A reset may give a chip another UUID (Iluvatar's plugin documents it). The chips are
discovered again after every reset; when a chip of the allocation is gone, the allocation is refused
(the device the kubelet chose no longer exists) and the agent publishes the new device list at once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from ix_gpu.node.backends.base import BackendError, Chip

if TYPE_CHECKING:
    from ix_gpu.config.plugin_runtime import RuntimeConfig
    from ix_gpu.devicemodel.vendors import Vendor
    from ix_gpu.node.backends.base import Backend

log = logging.getLogger(__name__)

RESET_OK = "ok"
RESET_FAILED = "failed"
"""The tool failed, overran its bound, or the library could not be had or taken again."""
RESET_CHANGED = "changed"
"""The reset worked, and a chip came back with another UUID: the allocation is refused."""


class ResetFailed(Exception):
    """The chips could not be reset, or are not the chips they were; the message says which and why,
    in words for the pod's events."""


def reset_problem(config: RuntimeConfig, backend: Backend) -> str | None:
    """Why ``config`` cannot run on ``backend`` (``flags.reset_gpu`` where it has no way to reset),
    or None: refused at start, and kept out on reload."""
    if config.reset_gpu and backend.reset_method is None:
        return f"flags.reset_gpu: true, but the {backend.name} backend cannot reset chips"
    return None


class SharedOrExclusive:
    """A lock many may hold at once, or one alone. Library calls share it, so a call that hangs in
    the library (a chip that stopped answering) holds up no other call; a reset takes it alone, so
    no call runs while the library is shut down, and gives up after its timeout when a hung call
    never lets it in. Whoever waits for a reset waits in a thread, never on an event loop."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._sharing = 0
        self._alone = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._alone)
            self._sharing += 1
        try:
            yield
        finally:
            with self._changed:
                self._sharing -= 1
                self._changed.notify_all()

    @contextlib.contextmanager
    def alone(self, timeout: float) -> Iterator[None]:
        """Held alone within ``timeout`` seconds, else :class:`BackendError`."""
        with self._changed:
            if not self._changed.wait_for(lambda: not (self._alone or self._sharing), timeout):
                raise BackendError(f"the management library stayed busy for {timeout:g}s")
            self._alone = True
        try:
            yield
        finally:
            with self._changed:
                self._alone = False
                self._changed.notify_all()


class SerializedBackend:
    """A backend no call of which runs during a reset (see the module docstring and
    :class:`SharedOrExclusive`). Every other attribute is the wrapped backend's."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self._lock = SharedOrExclusive()

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def vendor(self) -> Vendor:
        return self.inner.vendor

    @property
    def reset_method(self) -> str | None:
        return self.inner.reset_method

    def chips(self) -> list[Chip]:
        with self._lock.shared():
            return self.inner.chips()

    def control_nodes(self) -> tuple[str, ...]:
        return self.inner.control_nodes()

    def read_telemetry(self, chip: Chip) -> dict[str, float]:
        with self._lock.shared():
            return self.inner.read_telemetry(chip)

    def reset(self, chips: Sequence[Chip], timeout: float) -> None:
        """Reset with the library to itself, waiting for that no longer than ``timeout`` in all
        (a telemetry read that hangs in the library must not hold an allocation for ever)."""
        started = time.monotonic()
        with self._lock.alone(timeout):
            # Rounded to a tenth: the tool's bound is what is left, and errors quote it.
            self.inner.reset(chips, max(0.1, round(timeout - (time.monotonic() - started), 1)))

    def close(self) -> None:
        self.inner.close()


class ChipResetter:
    """Resets chips for a new tenant and says what came back (blocking: call it from a thread)."""

    def __init__(self, backend: Backend, record: Callable[[str, float], None]) -> None:
        """``record(result, seconds)`` counts each reset (:data:`RESET_OK` and the others)."""
        self.backend = backend
        self.record = record

    def reset(self, chips: Sequence[Chip], timeout: float) -> list[Chip]:
        """Reset ``chips`` within ``timeout`` seconds and discover every chip again: what is there
        now. Raises :class:`ResetFailed` when the reset fails or one of ``chips`` is gone after it."""
        names = ", ".join(chip.uuid for chip in chips)
        started = time.monotonic()
        try:
            self.backend.reset(chips, timeout)
            after = self.backend.chips()
        except BackendError as exc:
            self.record(RESET_FAILED, time.monotonic() - started)
            log.error("GPU reset of %s failed: %s", names, exc)
            raise ResetFailed(f"GPU reset of {names} failed ({exc}); the chips are not handed out") from None
        seconds = time.monotonic() - started
        present = {chip.uuid for chip in after}
        gone = [chip.uuid for chip in chips if chip.uuid not in present]
        if gone:
            self.record(RESET_CHANGED, seconds)
            log.warning("after its GPU reset, %s is no longer there (its UUID changed)", ", ".join(gone))
            raise ResetFailed(
                f"{', '.join(gone)} no longer exists after its GPU reset (its UUID changed); "
                "the kubelet may retry with the devices now advertised"
            )
        self.record(RESET_OK, seconds)
        log.info("GPU reset of %s done in %.1fs", names, seconds)
        return after
