"""Prometheus metrics kept in plain numbers and written as text by hand, for the node agents.

Why a second writer beside the webhook's prometheus_client: the node agents run on every GPU node,
so their memory is multiplied by the fleet, and the device plugin holds about 31 MiB at rest
against a 32 MiB target (``bench/plugin_bench.py``). Measured on the plugin's own imports,
prometheus_client (with its exposition module, writing seven series) takes a process from 30.3 to
32.2 MiB (+1.9 MiB, +6%, over the target); this module costs 0.6 MiB over what it imports. The
webhook keeps prometheus_client: it already holds FastAPI, where 2 MiB is noise.

What the agents need is small: counters, gauges and unlabelled histograms, and the text exposition
format (version 0.0.4). The metric names, labels and sample values are the ones prometheus_client
writes (``tests/plugin/test_plugin_metrics.py`` renders both and compares them line for line, less
its ``*_created`` series), and Prometheus' parser (prometheus_client's) reads back any label value,
HELP text, sample value and histogram written here.

Every instance owns its metrics (nothing process-global), so tests and the benchmarks can run
several agents in one process.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


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


def escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def labels_text(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    return "{" + ",".join(f'{n}="{escape_label(v)}"' for n, v in zip(names, values, strict=True)) + "}"


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


class Family:
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
        yield f"# HELP {name} {escape_help(self.documentation)}"
        yield f"# TYPE {name} {self.kind}"
        for key, child in list(self._children.items()):
            yield f"{name}{labels_text(self.labelnames, key)} {format_value(child.get())}"


class Counter(Family):
    """Exposed as ``<name>_total``, as prometheus_client names a counter."""

    kind = "counter"
    suffix = "_total"

    def inc(self, amount: float = 1.0) -> None:
        self._unlabelled().inc(amount)


class Gauge(Family):
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
        yield f"# HELP {self.name} {escape_help(self.documentation)}"
        yield f"# TYPE {self.name} histogram"
        cumulative = 0
        for bound, n in zip(self.bounds, counts, strict=True):
            cumulative += n
            yield f'{self.name}_bucket{{le="{format_value(bound)}"}} {format_value(cumulative)}'
        yield f"{self.name}_count {format_value(cumulative)}"
        yield f"{self.name}_sum {format_value(total)}"


def render(families: Iterable[Family | Histogram], extra: Iterable[str] = ()) -> bytes:
    """The text exposition format, version 0.0.4 (what ``/metrics`` serves); ``extra``: more
    families' lines, already written."""
    lines = [line for family in families for line in family.render()]
    lines.extend(extra)
    return ("\n".join(lines) + "\n").encode()
