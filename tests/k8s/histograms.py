"""Prometheus histograms as the burst reads them from /metrics text: cumulative buckets summed over
the series whose labels match, a quantile interpolated inside its bucket (as ``histogram_quantile``
does), and the buckets a burst added (after minus before)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Buckets = dict[float, float]
"""Cumulative counts by upper bound (``le``), ``inf`` the total."""


def buckets_of(text: str, family: str, match: dict[str, str]) -> Buckets:
    """A Prometheus histogram's cumulative buckets by upper bound, summed over the series whose
    labels include ``match`` (and over every copy of the family in ``text``)."""
    buckets: Buckets = {}
    for metric in text_string_to_metric_families(text):
        if metric.name != family:
            continue
        for sample in metric.samples:
            if sample.name != f"{family}_bucket":
                continue
            if any(sample.labels.get(k) != v for k, v in match.items()):
                continue
            bound = float(sample.labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return buckets


def buckets_quantile(buckets: Buckets, q: float) -> float | None:
    """``q`` of cumulative ``buckets``, interpolated linearly inside its bucket; None when empty."""
    if not buckets or buckets.get(float("inf"), 0) <= 0:
        return None
    total = buckets[float("inf")]
    rank, lower, below = q * total, 0.0, 0.0
    for bound in sorted(buckets):
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * ((rank - below) / max(count - below, 1e-9))
        lower, below = bound, count
    return None


def bucket_quantile(text: str, family: str, q: float, match: dict[str, str]) -> float | None:
    """``q`` of a Prometheus histogram, interpolated linearly inside its bucket, over the series
    whose labels include ``match``."""
    return buckets_quantile(buckets_of(text, family, match), q)


def added(before: Buckets, after: Buckets) -> Buckets:
    """What was counted between two reads of the same cumulative histogram."""
    return {bound: count - before.get(bound, 0.0) for bound, count in after.items()}


def ms(value: float | None) -> float | None:
    """Seconds as milliseconds, to 0.1 ms."""
    return None if value is None else round(value * 1000, 1)
