"""Prometheus metrics of the device plugin, kept in plain numbers and written as text by hand.

Why a second writer beside the webhook's prometheus_client: the plugin runs on every GPU node, so
its memory is multiplied by the fleet, and it holds about 31 MiB at rest against a 32 MiB target
(``bench/plugin_bench.py``). Measured on the plugin's own imports, prometheus_client (with its
exposition module, writing seven series) takes a process from 30.3 to 32.2 MiB (+1.9 MiB, +6%,
over the target); this module costs 0.6 MiB over what it imports. The webhook keeps
prometheus_client: it already holds the kubernetes client and FastAPI, where 2 MiB is noise.

What the plugin needs is small: counters, two gauges and one histogram, and the text exposition
format (version 0.0.4). The metric names, labels and sample values are the ones prometheus_client
writes (``tests/plugin/test_plugin_metrics.py`` renders both and compares them line for line, less
its ``*_created`` series), and Prometheus' parser (prometheus_client's) reads back any label value,
HELP text, sample value and histogram written here.

Every instance owns its metrics (nothing process-global), so tests and the benchmark can run
several plugins in one process.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence

from ix_gpu.node.attribution import Holder
from ix_gpu.node.backends.base import IXML_HEALTH_BITS
from ix_gpu.node.telemetry import FIGURES, HEALTH_MASK, LABELS, ChipTelemetry, chip_labels
from ix_gpu.plugin.devices.device_state import HEALTHY, UNHEALTHY

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
API_CALLS = ("node_read", "slice_list", "label_write")
ALLOCATION_LABELS = (*LABELS, "namespace", "pod", "container", "claim")
LOOPS = ("health", "registration", "attribution")


def format_value(value: float) -> str:
    """A sample value as Go and prometheus_client write it (``1.0``, ``+Inf``, ``1e+06``)."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:  # Go switches to an exponent sooner than Python's repr
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _labels_text(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    return "{" + ",".join(f'{n}="{_escape_label(v)}"' for n, v in zip(names, values, strict=True)) + "}"


class Value:
    """One series' number. A lock, because the config file is polled (and its reload counted) in a
    worker thread while the loop counts Allocates."""

    __slots__ = ("_lock", "_value")

    def __init__(self) -> None:
        self._value = 0.0
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self._value += amount

    def set(self, value: float) -> None:
        with self._lock:
            self._value = float(value)

    def get(self) -> float:
        return self._value


class _Family:
    kind = ""
    suffix = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Value] = {}
        if not self.labelnames:
            self._children[()] = Value()

    def labels(self, **values: str) -> Value:
        """The series for these label values, created at zero on first use (as prometheus_client)."""
        if set(values) != set(self.labelnames):
            raise ValueError(f"{self.name} takes the labels {self.labelnames}, not {tuple(values)}")
        key = tuple(values[n] for n in self.labelnames)
        child = self._children.get(key)
        if child is None:
            child = self._children.setdefault(key, Value())
        return child

    def _unlabelled(self) -> Value:
        if self.labelnames:
            raise ValueError(f"{self.name} needs its labels {self.labelnames}")
        return self._children[()]

    def get(self) -> float:
        return self._unlabelled().get()

    def render(self) -> Iterator[str]:
        name = self.name + self.suffix
        yield f"# HELP {name} {_escape_help(self.documentation)}"
        yield f"# TYPE {name} {self.kind}"
        for key, child in list(self._children.items()):
            yield f"{name}{_labels_text(self.labelnames, key)} {format_value(child.get())}"


class Counter(_Family):
    """Exposed as ``<name>_total``, as prometheus_client names a counter."""

    kind = "counter"
    suffix = "_total"

    def inc(self, amount: float = 1.0) -> None:
        self._unlabelled().inc(amount)


class Gauge(_Family):
    kind = "gauge"

    def set(self, value: float) -> None:
        self._unlabelled().set(value)


class Histogram:
    """Cumulative buckets, ``_count`` and ``_sum``; unlabelled (the plugin's one histogram is)."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = (*sorted(float(b) for b in buckets), math.inf)
        self._counts = [0] * len(self.bounds)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, amount: float) -> None:
        with self._lock:
            self._sum += amount
            for i, bound in enumerate(self.bounds):
                if amount <= bound:
                    self._counts[i] += 1
                    break

    @property
    def count(self) -> int:
        return sum(self._counts)

    def render(self) -> Iterator[str]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        yield f"# HELP {self.name} {_escape_help(self.documentation)}"
        yield f"# TYPE {self.name} histogram"
        cumulative = 0
        for bound, n in zip(self.bounds, counts, strict=True):
            cumulative += n
            yield f'{self.name}_bucket{{le="{format_value(bound)}"}} {format_value(cumulative)}'
        yield f"{self.name}_count {format_value(cumulative)}"
        yield f"{self.name}_sum {format_value(total)}"


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
            "Requests to the API server that failed, by call (node_read, slice_list, label_write)",
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

    def families(self) -> tuple[_Family | Histogram, ...]:
        return (
            self.devices,
            self.registered,
            self.registrations,
            self.allocations,
            self.allocate_seconds,
            self.health_transitions,
            self.backend_errors,
            self.config_reloads,
            self.api_errors,
            self.loop_crashes,
        )

    def render(self, extra: Iterable[str] = ()) -> bytes:
        """The text exposition format, version 0.0.4 (what ``/metrics`` serves); ``extra``: more
        families' lines (the chips' telemetry)."""
        lines = [line for family in self.families() for line in family.render()]
        lines.extend(extra)
        return ("\n".join(lines) + "\n").encode()


def telemetry_lines(
    node: str,
    items: Sequence[ChipTelemetry],
    holders: Mapping[str, Sequence[Holder]] | None = None,
    pod_resources_up: bool | None = None,
) -> Iterator[str]:
    """The chips' figures as gauges (a figure no chip has is left out whole), each chip's decoded
    health bits where its reading has the mask, every chip's staleness, one series per holder of a
    chip (``holders``: chip UUID → the containers the kubelet gave it to), and whether the
    kubelet's PodResources API answered (``None``: not asked)."""
    labelled = [(_labels_text(LABELS, chip_labels(node, item.chip)), item) for item in items]
    for figure in FIGURES:
        key = figure.key
        present = [(labels, item.reading[key]) for labels, item in labelled if key in item.reading]
        if present:
            yield f"# HELP {figure.metric} {_escape_help(figure.help)}"
            yield f"# TYPE {figure.metric} gauge"
            yield from (f"{figure.metric}{labels} {format_value(value)}" for labels, value in present)
    masks = [(item, int(item.reading[HEALTH_MASK])) for _, item in labelled if HEALTH_MASK in item.reading]
    if masks:
        name = "ix_gpu_chip_health_problem"
        yield f"# HELP {name} 1 while ixmlDeviceGetHealth reports this problem for the chip, else 0"
        yield f"# TYPE {name} gauge"
        for item, mask in masks:
            values = chip_labels(node, item.chip)
            for bit, problem in IXML_HEALTH_BITS:
                labels = _labels_text((*LABELS, "problem"), (*values, problem))
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
            yield f"{name}{_labels_text(ALLOCATION_LABELS, values)} 1.0"
    if pod_resources_up is not None:
        name = "ix_gpu_pod_resources_up"
        yield f"# HELP {name} 1 while the kubelet's PodResources API answers (chips' holders are shown)"
        yield f"# TYPE {name} gauge"
        yield f"{name} {format_value(1.0 if pod_resources_up else 0.0)}"
