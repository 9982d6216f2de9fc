"""The DRA plugin's Prometheus metrics, written by :mod:`ix_gpu.serving.text_metrics` (the same
small writer as the device plugin's, for the same reason: this process runs on every DRA node).

Two kinds: counters of what happened between scrapes (claims prepared and unprepared, the failures
by reason, and how long a prepare took), kept in :class:`DraMetrics`; and gauges of the plugin's
state (registered with the kubelet, publishing, devices by health, API and loop failures), read off
the running plugin at each scrape (:class:`DraState`), so no second copy of that state can drift
from the first.

Every series exists from the start (counters at 0): an alert on ``rate()`` or ``increase()`` sees
the first failure, and "registered" reads 0 before the kubelet has answered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ix_gpu.dra.claims import FAILURE_REASONS, UNPREPARE_FAILURE_REASONS
from ix_gpu.node.gpu_reset import RESET_CHANGED, RESET_FAILED, RESET_OK
from ix_gpu.serving.text_metrics import Counter, Family, Gauge, Histogram, render

RESULTS = ("success", "error")
API_CALLS = ("node_read", "slice_write")
HEALTH = ("Healthy", "Unhealthy")


class DraMetrics:
    """The counters; the servicer counts each claim as it answers it."""

    def __init__(self) -> None:
        self.prepares = Counter(
            "ix_gpu_dra_prepares",
            "Claims the kubelet asked this driver to prepare (NodePrepareResources), by result",
            ["result"],
        )
        self.unprepares = Counter(
            "ix_gpu_dra_unprepares",
            "Claims the kubelet asked this driver to unprepare (NodeUnprepareResources), by result",
            ["result"],
        )
        self.prepare_seconds = Histogram(
            "ix_gpu_dra_prepare_duration_seconds",
            "Time to prepare one claim (read it, write its CDI spec and the checkpoint)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0),
        )
        self.prepare_failures = Counter(
            "ix_gpu_dra_prepare_failures",
            "Claims NodePrepareResources failed to prepare, by reason (each is also a prepares error)",
            ["reason"],
        )
        self.unprepare_failures = Counter(
            "ix_gpu_dra_unprepare_failures",
            "Claims NodeUnprepareResources failed to unprepare, by reason (each is also an unprepares error)",
            ["reason"],
        )
        self.gpu_resets = Counter(
            "ix_gpu_dra_gpu_resets",
            "GPU resets of a new claim's chips (flags.reset_gpu), by result: ok, failed (the claim "
            "was not prepared), changed (a chip came back with another UUID; not prepared)",
            ["result"],
        )
        for result in (RESET_OK, RESET_FAILED, RESET_CHANGED):
            self.gpu_resets.labels(result=result)
        for result in RESULTS:
            self.prepares.labels(result=result)
            self.unprepares.labels(result=result)
        for reason in FAILURE_REASONS:
            self.prepare_failures.labels(reason=reason)
        for reason in UNPREPARE_FAILURE_REASONS:
            self.unprepare_failures.labels(reason=reason)

    def record_reset(self, result: str, seconds: float) -> None:
        """:class:`ix_gpu.node.gpu_reset.ChipResetter`'s record (the reset's time is in the
        claim's prepare duration)."""
        self.gpu_resets.labels(result=result).inc()


@dataclass(frozen=True)
class DraState:
    """What a scrape reads off the running plugin."""

    registered: bool
    """The kubelet's last NotifyRegistrationStatus said registered."""
    publishing: bool
    """This node's GPUs are this driver's to hand out (its allocation verdict)."""
    devices: Mapping[str, int]
    """Devices known on the node, by health (Healthy, Unhealthy)."""
    api_errors: Mapping[str, int]
    loop_crashes: int


def _gauge(name: str, documentation: str, value: float) -> Gauge:
    gauge = Gauge(name, documentation)
    gauge.set(value)
    return gauge


def render_metrics(metrics: DraMetrics, state: DraState) -> bytes:
    devices = Gauge("ix_gpu_dra_devices", "Devices of this node known to the driver, by health", ["health"])
    for health in HEALTH:
        devices.labels(health=health).set(state.devices.get(health, 0))
    api_errors = Counter(
        "ix_gpu_dra_api_errors",
        "Requests to the API server that failed, by call (node_read, slice_write)",
        ["call"],
    )
    for call in (*API_CALLS, *sorted(set(state.api_errors) - set(API_CALLS))):
        api_errors.labels(call=call).inc(state.api_errors.get(call, 0))  # fresh: at 0 until now
    crashes = Counter(
        "ix_gpu_dra_loop_crashes",
        "Unexpected failures of the health loop, each restarted after a backoff",
    )
    crashes.inc(state.loop_crashes)
    families: tuple[Family | Histogram, ...] = (
        _gauge(
            "ix_gpu_dra_registered",
            "1 while the kubelet has this DRA driver registered (its claims can be prepared), else 0",
            1.0 if state.registered else 0.0,
        ),
        _gauge(
            "ix_gpu_dra_publishing",
            "1 while this node's GPUs are the DRA driver's to hand out (its slice lists them), else 0",
            1.0 if state.publishing else 0.0,
        ),
        devices,
        metrics.prepares,
        metrics.prepare_failures,
        metrics.unprepares,
        metrics.unprepare_failures,
        metrics.prepare_seconds,
        metrics.gpu_resets,
        api_errors,
        crashes,
    )
    return render(families)
