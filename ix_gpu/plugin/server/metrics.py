"""The device plugin's Prometheus metrics, written by :mod:`ix_gpu.serving.text_metrics` (why not
prometheus_client: that module's doc), and the chips' telemetry series beside them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

from ix_gpu.node.attribution import Holder
from ix_gpu.node.backends.base import IXML_HEALTH_BITS
from ix_gpu.node.gpu_reset import RESET_CHANGED, RESET_FAILED, RESET_OK
from ix_gpu.node.telemetry import FIGURES, HEALTH_MASK, LABELS, ChipTelemetry, chip_labels
from ix_gpu.plugin.offer.device_state import HEALTHY, UNHEALTHY
from ix_gpu.plugin.offer.volcano import RESULTS as VOLCANO_RESULTS
from ix_gpu.serving.text_metrics import (
    Counter,
    Family,
    Gauge,
    Histogram,
    escape_help,
    format_value,
    labels_text,
    render,
)

API_CALLS = ("node_read", "slice_list", "label_write", "pod_watch", "pod_patch")
ALLOCATION_LABELS = (*LABELS, "namespace", "pod", "container", "claim")
LOOPS = ("health", "registration", "telemetry")
RESET_RESULTS = (RESET_OK, RESET_FAILED, RESET_CHANGED)


class PluginMetrics:
    def __init__(self) -> None:
        self.devices = Gauge(
            "ix_gpu_plugin_devices",
            "Devices advertised to the kubelet, by health",
            ["health"],
        )
        self.registered = Gauge(
            "ix_gpu_plugin_registered",
            "1 while the plugin is registered with the kubelet (its devices can be allocated), else 0",
        )
        self.registrations = Counter(
            "ix_gpu_plugin_registrations",
            "Register calls to the kubelet, by result",
            ["result"],
        )
        self.allocations = Counter(
            "ix_gpu_plugin_allocations",
            "Allocate container requests, by result",
            ["result"],
        )
        self.allocate_seconds = Histogram(
            "ix_gpu_plugin_allocate_duration_seconds",
            "Time to answer one Allocate call",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1),
        )
        self.volcano_allocations = Counter(
            "ix_gpu_plugin_volcano_allocations",
            "Allocate container requests under flags.usevolcano, by result: volcano (the devices of the "
            "pod's iluvatar.com/DevVolcano bound), fallback (a pod matched, but its devices were not on "
            "this node, Healthy and free: the kubelet's choice bound), unmatched (no pod waited with a "
            "DevVolcano of that size: the kubelet's choice bound), refused (the kubelet's choice holds a "
            "chip another pod holds), unavailable (this node's pods cannot be watched: the kubelet's choice)",
            ["result"],
        )
        self.health_transitions = Counter(
            "ix_gpu_plugin_health_transitions",
            "Chip health transitions, by the state entered",
            ["to"],
        )
        self.backend_errors = Counter(
            "ix_gpu_plugin_backend_errors",
            "Health checks in which the management library failed",
        )
        self.config_reloads = Counter(
            "ix_gpu_plugin_config_reloads",
            "Config file changes seen, by result (success, error)",
            ["result"],
        )
        self.api_errors = Counter(
            "ix_gpu_plugin_api_errors",
            "Requests to the API server that failed, by call (node_read, slice_list, label_write, "
            "pod_watch, pod_patch)",
            ["call"],
        )
        self.loop_crashes = Counter(
            "ix_gpu_plugin_loop_crashes",
            "Unexpected failures of a background loop, each restarted, by loop (health, registration)",
            ["loop"],
        )
        for health in (HEALTHY, UNHEALTHY):
            self.devices.labels(health=health).set(0)
        self.registered.set(0)
        # Every series from the start, at 0: an alert on rate() sees the first failure.
        for call in API_CALLS:
            self.api_errors.labels(call=call)
        for loop in LOOPS:
            self.loop_crashes.labels(loop=loop)
        self.gpu_resets, self.gpu_reset_seconds = _reset_families()
        for result in VOLCANO_RESULTS:
            self.volcano_allocations.labels(result=result)

    def families(self) -> tuple[Family | Histogram, ...]:
        return (
            self.devices,
            self.registered,
            self.registrations,
            self.allocations,
            self.allocate_seconds,
            self.volcano_allocations,
            self.health_transitions,
            self.backend_errors,
            self.config_reloads,
            self.api_errors,
            self.loop_crashes,
            self.gpu_resets,
            self.gpu_reset_seconds,
        )

    def render(self, extra: Iterable[str] = ()) -> bytes:
        """The text exposition format, version 0.0.4 (what ``/metrics`` serves); ``extra``: more
        families' lines (the chips' telemetry)."""
        return render(self.families(), extra)


def _reset_families() -> tuple[Counter, Histogram]:
    """The GPU reset's count and time (``flags.reset_gpu``), every result's series from the start."""
    resets = Counter(
        "ix_gpu_plugin_gpu_resets",
        "GPU resets before a handout (flags.reset_gpu), by result: ok, failed (the tool failed or "
        "overran gpuReset.timeoutSeconds; the allocation was refused), changed (a chip came back with "
        "another UUID; the allocation was refused)",
        ["result"],
    )
    for result in RESET_RESULTS:
        resets.labels(result=result)
    seconds = Histogram(
        "ix_gpu_plugin_gpu_reset_duration_seconds",
        "Time one GPU reset took, the chips' rediscovery included",
        buckets=(0.5, 1, 2, 5, 10, 30, 60, 120),
    )
    return resets, seconds


def telemetry_lines(
    node: str,
    items: Sequence[ChipTelemetry],
    holders: Mapping[str, Sequence[Holder]] | None = None,
    pod_resources_up: bool | None = None,
) -> Iterator[str]:
    """The chips' figures as gauges, or counters for the library's counts (a figure no chip has is
    left out whole), each chip's decoded health bits where its reading has the mask, every chip's
    staleness, one series per holder of a chip (``holders``: chip UUID → the containers the kubelet
    gave it to), and whether the kubelet's PodResources API answered (``None``: not asked)."""
    labelled = [(labels_text(LABELS, chip_labels(node, item.chip)), item) for item in items]
    for figure in FIGURES:
        key = figure.key
        present = [(labels, item.reading[key]) for labels, item in labelled if key in item.reading]
        if present:
            yield f"# HELP {figure.metric} {escape_help(figure.help)}"
            yield f"# TYPE {figure.metric} {figure.kind}"
            yield from (f"{figure.metric}{labels} {format_value(value)}" for labels, value in present)
    masks = [(item, int(item.reading[HEALTH_MASK])) for _, item in labelled if HEALTH_MASK in item.reading]
    if masks:
        name = "ix_gpu_chip_health_problem"
        yield f"# HELP {name} 1 while ixmlDeviceGetHealth reports this problem for the chip, else 0"
        yield f"# TYPE {name} gauge"
        for item, mask in masks:
            values = chip_labels(node, item.chip)
            for bit, problem in IXML_HEALTH_BITS:
                labels = labels_text((*LABELS, "problem"), (*values, problem))
                yield f"{name}{labels} {format_value(1.0 if mask & bit else 0.0)}"
    if labelled:
        name = "ix_gpu_chip_telemetry_stale"
        yield f"# HELP {name} 1 while the chip's last telemetry read is missing or older than two intervals"
        yield f"# TYPE {name} gauge"
        yield from (f"{name}{labels} {format_value(1.0 if item.stale else 0.0)}" for labels, item in labelled)
    held = [(item, holder) for item in items for holder in (holders or {}).get(item.chip.uuid, ())]
    if held:
        name = "ix_gpu_chip_allocation"
        yield f"# HELP {name} 1 for each container the kubelet gave the chip to (claim: its DRA claim)"
        yield f"# TYPE {name} gauge"
        for item, holder in held:
            who = (holder.namespace, holder.pod, holder.container, holder.claim)
            values = (*chip_labels(node, item.chip), *who)
            yield f"{name}{labels_text(ALLOCATION_LABELS, values)} 1.0"
    if pod_resources_up is not None:
        name = "ix_gpu_pod_resources_up"
        yield f"# HELP {name} 1 while the kubelet's PodResources API answers (chips' holders are shown)"
        yield f"# TYPE {name} gauge"
        yield f"{name} {format_value(1.0 if pod_resources_up else 0.0)}"
