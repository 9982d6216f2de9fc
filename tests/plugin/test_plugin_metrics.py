"""The plugin's hand-written /metrics text: what prometheus_client wrote before, and valid 0.0.4 text.

The plugin process does not import prometheus_client (it would cost every GPU node 1.9 MiB, see
the module's docstring); this test may, since tests are not the plugin process. It builds
prometheus_client metrics from the plugin's own definitions, replays the same updates on both, and
compares the text line for line, less prometheus_client's ``*_created`` series. Then
prometheus_client's parser reads ours back, for the plugin's series and for generated label
values, HELP texts, values and histograms.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Counter as ReferenceCounter
from prometheus_client import Gauge as ReferenceGauge
from prometheus_client import Histogram as ReferenceHistogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from ix_gpu.plugin.offer.volcano import RESULTS as VOLCANO_RESULTS
from ix_gpu.plugin.server.metrics import API_CALLS, LOOPS, RESET_RESULTS, PluginMetrics
from ix_gpu.serving.text_metrics import CONTENT_TYPE, Counter, Gauge, Histogram, format_value

Update = Callable[[Any], None]
"""One update, applied to a PluginMetrics or to its prometheus_client twin (same attribute names)."""

UPDATES: list[Update] = [
    lambda m: m.registrations.labels(result="success").inc(),
    lambda m: m.registrations.labels(result="error").inc(),
    lambda m: m.registrations.labels(result="success").inc(),
    lambda m: m.allocations.labels(result="success").inc(3),
    lambda m: m.allocate_seconds.observe(0.0003),
    lambda m: m.allocate_seconds.observe(0.0005),  # on a bucket bound: counted in that bucket
    lambda m: m.allocate_seconds.observe(0.0042),
    lambda m: m.allocate_seconds.observe(7.5),  # only +Inf
    lambda m: m.devices.labels(health="Healthy").set(16),
    lambda m: m.devices.labels(health="Unhealthy").set(2),
    lambda m: m.health_transitions.labels(to="Unhealthy").inc(),
    lambda m: m.backend_errors.inc(),
    lambda m: m.config_reloads.labels(result="error").inc(),
    lambda m: m.api_errors.labels(call="slice_list").inc(),
    lambda m: m.loop_crashes.labels(loop="health").inc(),
    lambda m: m.gpu_resets.labels(result="changed").inc(),
    lambda m: m.gpu_reset_seconds.observe(2.5),
    lambda m: m.volcano_allocations.labels(result="fallback").inc(),
]


class Reference:
    """prometheus_client metrics with the plugin's names, help, labels and buckets."""

    def __init__(self, ours: PluginMetrics) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        for attribute, family in vars(ours).items():
            if isinstance(family, Histogram):
                twin: Any = ReferenceHistogram(
                    family.name, family.documentation, buckets=family.bounds, registry=self.registry
                )
            else:
                kind = ReferenceCounter if isinstance(family, Counter) else ReferenceGauge
                assert isinstance(family, Counter | Gauge)
                twin = kind(family.name, family.documentation, family.labelnames, registry=self.registry)
            setattr(self, attribute, twin)
        for health in ("Healthy", "Unhealthy"):
            self.devices.labels(health=health).set(0)  # type: ignore[attr-defined]
        for call in API_CALLS:
            self.api_errors.labels(call=call)  # type: ignore[attr-defined]
        for loop in LOOPS:
            self.loop_crashes.labels(loop=loop)  # type: ignore[attr-defined]
        for result in RESET_RESULTS:
            self.gpu_resets.labels(result=result)  # type: ignore[attr-defined]
        for result in VOLCANO_RESULTS:
            self.volcano_allocations.labels(result=result)  # type: ignore[attr-defined]


def without_created(text: str) -> list[str]:
    return [line for line in text.splitlines() if "_created" not in line]


@pytest.mark.parametrize("updates", [0, 1, len(UPDATES)], ids=["fresh", "one-update", "all-updates"])
def test_text_is_what_prometheus_client_wrote(updates: int) -> None:
    ours = PluginMetrics()
    reference = Reference(ours)
    for update in UPDATES[:updates]:
        update(ours)
        update(reference)
    assert without_created(ours.render().decode()) == without_created(
        generate_latest(reference.registry).decode()
    )


def test_prometheus_parser_reads_every_series() -> None:
    metrics = PluginMetrics()
    for update in UPDATES:
        update(metrics)
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    assert {name: f.type for name, f in families.items()} == {
        "ix_gpu_plugin_devices": "gauge",
        "ix_gpu_plugin_registered": "gauge",
        "ix_gpu_plugin_registrations": "counter",
        "ix_gpu_plugin_allocations": "counter",
        "ix_gpu_plugin_allocate_duration_seconds": "histogram",
        "ix_gpu_plugin_health_transitions": "counter",
        "ix_gpu_plugin_backend_errors": "counter",
        "ix_gpu_plugin_config_reloads": "counter",
        "ix_gpu_plugin_api_errors": "counter",
        "ix_gpu_plugin_loop_crashes": "counter",
        "ix_gpu_plugin_gpu_resets": "counter",
        "ix_gpu_plugin_gpu_reset_duration_seconds": "histogram",
        "ix_gpu_plugin_volcano_allocations": "counter",
    }
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples
    }
    assert samples[("ix_gpu_plugin_registrations_total", (("result", "success"),))] == 2
    assert samples[("ix_gpu_plugin_registrations_total", (("result", "error"),))] == 1
    assert samples[("ix_gpu_plugin_devices", (("health", "Healthy"),))] == 16
    assert samples[("ix_gpu_plugin_allocate_duration_seconds_bucket", (("le", "0.0005"),))] == 2
    assert samples[("ix_gpu_plugin_allocate_duration_seconds_bucket", (("le", "+Inf"),))] == 4
    assert samples[("ix_gpu_plugin_allocate_duration_seconds_count", ())] == 4
    assert samples[("ix_gpu_plugin_allocate_duration_seconds_sum", ())] == pytest.approx(7.505)
    assert samples[("ix_gpu_plugin_backend_errors_total", ())] == 1


def test_content_type_is_the_classic_text_format() -> None:
    """0.0.4, which every Prometheus reads. (prometheus_client 0.26 announces 1.0.0, the same text
    plus quoted UTF-8 names, which the plugin's ASCII names never need.)"""
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    assert CONTENT_TYPE_LATEST.startswith("text/plain; version=")


def test_label_values_and_help_are_escaped() -> None:
    family = Gauge("ix_gpu_test", 'help with \\ and\nnewline "quoted"', ["what"])
    family.labels(what='a "b" \\ c\nd').set(1)
    text = "\n".join(family.render()) + "\n"
    (parsed,) = text_string_to_metric_families(text)
    assert parsed.documentation == 'help with \\ and\nnewline "quoted"'
    assert parsed.samples[0].labels == {"what": 'a "b" \\ c\nd'}


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0.0"),
        (1, "1.0"),
        (2.5, "2.5"),
        (0.0005, "0.0005"),
        (123456.0, "123456.0"),
        (1234567.0, "1.234567e+06"),
        (1e20, "1e+20"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
        (math.nan, "NaN"),
    ],
)
def test_values_are_written_as_prometheus_client_writes_them(value: float, text: str) -> None:
    from prometheus_client.utils import floatToGoString

    assert format_value(value) == text == floatToGoString(value)


def test_labels_must_match_the_declared_names() -> None:
    metrics = PluginMetrics()
    with pytest.raises(ValueError, match="takes the labels"):
        metrics.allocations.labels(outcome="success")
    with pytest.raises(ValueError, match="needs its labels"):
        metrics.allocations.get()


LABEL_TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
"""Any label value a node could produce (a chip's product name, an error text): quotes, backslashes,
newlines and non-ASCII included."""

SAMPLE_VALUE = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=300, deadline=None)
@given(
    documentation=LABEL_TEXT.map(str.strip),  # the text format has no room for leading blanks
    series=st.dictionaries(st.tuples(LABEL_TEXT, LABEL_TEXT), SAMPLE_VALUE, max_size=6),
    counter=st.floats(min_value=0, allow_infinity=False, allow_nan=False),
)
def test_prometheus_parser_reads_back_any_label_value_help_and_value(
    documentation: str, series: dict[tuple[str, str], float], counter: float
) -> None:
    """What Prometheus reads is what was written: every label value, the HELP text and each value
    (bit for bit, ``NaN`` and infinities included), a counter as ``<name>_total``."""
    gauge = Gauge("ix_gpu_test_gauge", documentation, ["chip", "why"])
    for (chip, why), value in series.items():
        gauge.labels(chip=chip, why=why).set(value)
    total = Counter("ix_gpu_test_events", documentation)
    total.inc(counter)
    text = "\n".join([*gauge.render(), *total.render()]) + "\n"
    parsed = {family.name: family for family in text_string_to_metric_families(text)}
    assert {name: (f.type, f.documentation) for name, f in parsed.items()} == {
        "ix_gpu_test_gauge": ("gauge", documentation),
        "ix_gpu_test_events": ("counter", documentation),
    }
    read = {(s.labels["chip"], s.labels["why"]): s.value for s in parsed["ix_gpu_test_gauge"].samples}
    assert read.keys() == series.keys()
    for key, value in series.items():
        assert read[key] == value or (math.isnan(value) and math.isnan(read[key]))
    (sample,) = parsed["ix_gpu_test_events"].samples
    assert (sample.name, sample.value) == ("ix_gpu_test_events_total", counter)


@settings(max_examples=200, deadline=None)
@given(
    bounds=st.lists(st.floats(min_value=1e-6, max_value=1e6), min_size=1, max_size=8, unique=True),
    observations=st.lists(st.floats(min_value=0, max_value=1e7), max_size=30),
)
def test_prometheus_parser_reads_back_a_histogram(bounds: list[float], observations: list[float]) -> None:
    """Buckets cumulative and in order, ``le`` bounds as written, ``+Inf`` equal to ``_count``."""
    histogram = Histogram("ix_gpu_test_seconds", "time", bounds)
    for value in observations:
        histogram.observe(value)
    (family,) = text_string_to_metric_families("\n".join(histogram.render()) + "\n")
    assert family.type == "histogram"
    buckets = [(float(s.labels["le"]), s.value) for s in family.samples if s.name.endswith("_bucket")]
    assert [le for le, _ in buckets] == [*sorted(bounds), math.inf]
    assert [n for _, n in buckets] == [sum(1 for v in observations if v <= le) for le, _ in buckets]
    by_name = {s.name: s.value for s in family.samples if not s.name.endswith("_bucket")}
    assert by_name["ix_gpu_test_seconds_count"] == len(observations)
    assert by_name["ix_gpu_test_seconds_sum"] == pytest.approx(math.fsum(observations), rel=1e-9)
