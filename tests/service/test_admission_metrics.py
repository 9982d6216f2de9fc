"""The admission series as a scrape shows them: counted by :class:`AdmissionTally` without
prometheus_client's per-event machinery, they must read exactly as its Counter and Histogram
would, and stay bounded whatever kinds and operations requests carry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

from ix_gpu.webhook.service.metrics import _DURATION_BUCKETS, ServiceMetrics

REQUESTS = "ix_gpu_admission_requests_total"
DURATION = "ix_gpu_admission_duration_seconds"


def _samples(metrics: ServiceMetrics, family: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    scraped = text_string_to_metric_families(metrics.render().decode())
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in scraped
        if metric.name == family
        for sample in metric.samples
    }


def test_requests_are_counted_by_kind_operation_and_result() -> None:
    metrics = ServiceMetrics()
    for _ in range(3):
        metrics.count_request("Pod", "CREATE", "mutated")
    metrics.count_request("TFJob", "CREATE", "denied")
    metrics.count_request("unknown", "unknown", "error")
    get = metrics.registry.get_sample_value
    assert get(REQUESTS, {"kind": "Pod", "operation": "CREATE", "result": "mutated"}) == 3
    assert get(REQUESTS, {"kind": "TFJob", "operation": "CREATE", "result": "denied"}) == 1
    assert get(REQUESTS, {"kind": "unknown", "operation": "unknown", "result": "error"}) == 1
    assert get(REQUESTS, {"kind": "Pod", "operation": "CREATE", "result": "skipped"}) is None
    created = {"kind": "Pod", "operation": "CREATE", "result": "mutated"}
    assert get("ix_gpu_admission_requests_created", created)


def test_made_up_kinds_and_operations_collapse_to_other() -> None:
    """Kinds and operations come from whoever reaches the port: past 32 kinds, and for any
    operation that is not an admission operation, the label is ``other``, so a flood of made-up
    values adds at most a handful of series."""
    metrics = ServiceMetrics()
    for i in range(500):
        metrics.count_request(f"Kind{i}", f"OP{i % 7}", "skipped")
    metrics.count_request("Kind0", "UPDATE", "skipped")
    series = _samples(metrics, "ix_gpu_admission_requests")
    totals = {labels: value for (name, labels), value in series.items() if name == REQUESTS}
    kinds = {dict(labels)["kind"] for labels in totals}
    assert len(kinds) == 33 and "other" in kinds
    assert {dict(labels)["operation"] for labels in totals} == {"other", "UPDATE"}
    assert sum(totals.values()) == 501
    other = (("kind", "other"), ("operation", "other"), ("result", "skipped"))
    assert totals[other] == 500 - 32


def test_durations_read_as_prometheus_clients_histogram_would() -> None:
    observed = [0.0001, 0.0005, 0.0007, 0.001, 0.0031, 0.02, 0.3, 1.0, 2.5, 2.6, 40.0]
    metrics = ServiceMetrics()
    registry = CollectorRegistry()
    reference = Histogram(DURATION, "reference", buckets=_DURATION_BUCKETS, registry=registry)
    for seconds in observed:
        metrics.observe_duration(seconds)
        reference.observe(seconds)
    ours = _samples(metrics, DURATION)
    theirs = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in registry.collect()
        for sample in metric.samples
        if not sample.name.endswith("_created")  # a family of its own in the text format
    }
    assert ours == theirs
    assert ours[(DURATION + "_bucket", (("le", "0.0005"),))] == 2
    assert ours[(DURATION + "_bucket", (("le", "+Inf"),))] == len(observed)
