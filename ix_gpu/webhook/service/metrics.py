"""Prometheus metrics of the webhook service (``ix_gpu_*``).

Each service instance owns its registry rather than using prometheus_client's global one, so a
test process can run several services and a scrape shows exactly this service's numbers.

Label values are bounded: ``kind`` and ``operation`` come from requests, i.e. from anyone who can
reach the port, so unknown values collapse to ``other`` instead of creating a time series each.
The two series every admission touches (the request counter and the duration histogram) are
plain numbers in :class:`AdmissionTally`, read by a collector at scrape time: prometheus_client's
``inc()`` and ``observe()`` take a lock and run interpreted code per event, about 3 µs of a small
review's CPU. Only the event loop's thread counts admissions and serves ``/metrics``, so the tally
needs no lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric

from ix_gpu.process.outcomes import ERROR, SUCCESS

RESULTS = ("mutated", "unchanged", "skipped", "denied", "error")
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
OTHER = "other"
UNKNOWN = "unknown"
_MAX_KINDS = 32

# Admission latency is dominated by JSON work; buckets resolve the sub-millisecond range.
_DURATION_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.25, 0.5, 1.0, 2.5)

_BUCKET_LABELS = (*(repr(bound) for bound in _DURATION_BUCKETS), "+Inf")
"""Each bucket's ``le`` as prometheus_client writes it."""

CONTENT_TYPE = CONTENT_TYPE_LATEST

Labels = tuple[str, str, str]
"""An admission's (kind, operation, result)."""


class AdmissionTally:
    """``ix_gpu_admission_requests`` by (kind, operation, result) and the histogram
    ``ix_gpu_admission_duration_seconds``, as plain counts (see the module's docstring for why).

    Label values that come from requests are bounded as before: past ``_MAX_KINDS`` kinds, and for
    an operation not in ``OPERATIONS``, the value is ``other``.
    """

    def __init__(self) -> None:
        self._slot_of: dict[Labels, int] = {}
        """An admission's labels as given → its slot; bounded, so a flood of made-up kinds only
        costs the slow path (:meth:`_slot`)."""
        self._slot_of_series: dict[Labels, int] = {}
        """A series' labels (bounded values) → its slot."""
        self._series: list[Labels] = []
        self._created: list[float] = []
        self._counts: list[int] = []
        self._kinds: set[str] = set()
        self._buckets = [0] * (len(_DURATION_BUCKETS) + 1)
        """Observations per bucket, not cumulative (the last one: over every bound)."""
        self._sum = 0.0
        self._since = time.time()

    def count(self, kind: str, operation: str, result: str) -> None:
        slot = self._slot_of.get((kind, operation, result))
        if slot is None:
            slot = self._slot(kind, operation, result)
        self._counts[slot] += 1

    def observe(self, seconds: float) -> None:
        index = 0
        for bound in _DURATION_BUCKETS:
            if seconds <= bound:
                break
            index += 1
        self._buckets[index] += 1
        self._sum += seconds

    def _slot(self, kind: str, operation: str, result: str) -> int:
        given = (kind, operation, result)
        if operation not in OPERATIONS and operation != UNKNOWN:
            operation = OTHER
        if kind not in self._kinds and kind != UNKNOWN:
            if len(self._kinds) >= _MAX_KINDS:
                kind = OTHER
            else:
                self._kinds.add(kind)
        series = (kind, operation, result)
        slot = self._slot_of_series.get(series)
        if slot is None:
            slot = len(self._series)
            self._slot_of_series[series] = slot
            self._series.append(series)
            self._created.append(time.time())
            self._counts.append(0)
        if len(self._slot_of) < 4 * _MAX_KINDS * len(RESULTS):
            self._slot_of[given] = slot
        return slot

    def collect(self) -> Iterator[Metric]:
        """The two families as a scrape shows them (the registry calls this)."""
        requests = CounterMetricFamily(
            "ix_gpu_admission_requests",
            "AdmissionReview requests answered, by kind, operation and result.",
            labels=("kind", "operation", "result"),
        )
        for series, created, count in zip(self._series, self._created, self._counts, strict=True):
            requests.add_metric(series, count, created=created)
        yield requests
        duration = HistogramMetricFamily(
            "ix_gpu_admission_duration_seconds", "Time from request start to response body, for /mutate."
        )
        cumulative, buckets = 0, []
        for label, count in zip(_BUCKET_LABELS, self._buckets, strict=True):
            cumulative += count
            buckets.append((label, float(cumulative)))
        duration.add_metric((), buckets, self._sum)
        duration.add_sample("ix_gpu_admission_duration_seconds_created", {}, self._since)
        yield duration

    def describe(self) -> Iterator[Metric]:
        """The families' names, so the registry can refuse a clash when this is registered."""
        return self.collect()


class ServiceMetrics:
    """The webhook's own registry, by subject: admissions, reloads and certificates, connection
    limits, the namespace and claim caches. Every labelled series that can be known in advance is
    made at start, so a rate() over it starts from 0 rather than from its first event."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._admissions()
        self._reloads()
        self._limits()
        self._lookups()
        for result in (SUCCESS, ERROR):
            self.config_reloads.labels(result)
            self.cert_reloads.labels(result)
        for lookup in ("namespace", "claim"):
            self.allowed_unmodified.labels(lookup)
        for result in ("hit", "fetched", "absent", "failed", "retried"):
            self.namespace_lookups.labels(result)
        for outcome in ("arrived", "missing"):
            self.claim_waits.labels(outcome)

    def _admissions(self) -> None:
        self.admissions = AdmissionTally()
        self.registry.register(self.admissions)
        self.internal_errors = Counter(
            "ix_gpu_admission_internal_errors",
            "Admissions that hit a bug in the webhook (answered with a denial); should stay 0.",
            registry=self.registry,
        )
        self.unchecked_pod_security = Counter(
            "ix_gpu_admission_pod_security_unchecked",
            "GPU objects given hostPath volumes while their namespace's Pod Security level was unknown",
            registry=self.registry,
        )
        self.allowed_unmodified = Counter(
            "ix_gpu_admission_allowed_unmodified",
            "GPU objects admitted without their injection because a namespace or a claim could not be "
            "read and policy.namespaceLookupFailure or claimLookupFailure is allow-unmodified.",
            ("lookup",),
            registry=self.registry,
        )

    def _reloads(self) -> None:
        self.config_reloads = Counter(
            "ix_gpu_config_reloads",
            "Webhook config reload attempts; result=error keeps the last good config.",
            ("result",),
            registry=self.registry,
        )
        self.cert_reloads = Counter(
            "ix_gpu_cert_reloads",
            "Serving certificate reload attempts; result=error keeps the certificate being served.",
            ("result",),
            registry=self.registry,
        )
        self.certificate_expiry = Gauge(
            "ix_gpu_serving_certificate_expiry_timestamp_seconds",
            "Unix time the serving certificate in use stops being valid (its notAfter)",
            registry=self.registry,
        )
        self.config_info = Gauge(
            "ix_gpu_config_info",
            "1 for the digest of the config being served.",
            ("digest",),
            registry=self.registry,
        )

    def _limits(self) -> None:
        self.over_budget = Counter(
            "ix_gpu_admission_over_budget",
            "Large reviews answered 503 because they could not be served within --request-budget",
            registry=self.registry,
        )
        self.connections_refused = Counter(
            "ix_gpu_connections_refused",
            "Connections closed by a limit, by reason: connections, connections_per_address, "
            "header_size, header_timeout, request_line",
            ("reason",),
            registry=self.registry,
        )
        self.connections_evicted = Counter(
            "ix_gpu_connections_evicted",
            "Idle connections closed to make room for a new one at the connection cap",
            registry=self.registry,
        )

    def _lookups(self) -> None:
        self.namespace_lookups = Counter(
            "ix_gpu_namespace_lookups",
            "Namespace fact lookups: hit (cache), fetched (direct GET on a miss), absent (404), failed "
            "(its budget spent), retried (a GET tried again).",
            ("result",),
            registry=self.registry,
        )
        self.namespace_relists = Counter(
            "ix_gpu_namespace_cache_relists",
            "Full namespace lists by the cache (startup, 410 Gone, recovery after errors).",
            registry=self.registry,
        )
        self.namespace_watch_errors = Counter(
            "ix_gpu_namespace_cache_watch_errors",
            "Errors of the namespace list/watch (each followed by a backoff).",
            registry=self.registry,
        )
        self.claim_waits = Counter(
            "ix_gpu_claim_waits",
            "Reviews naming a DRA claim or claim template the claim caches did not hold yet, which "
            "waited for the watch: arrived, or missing after the wait (then policy.claimLookupFailure).",
            ("outcome",),
            registry=self.registry,
        )
        self.claim_cache_size = Gauge(
            "ix_gpu_claim_cache_size",
            "ResourceClaims and ResourceClaimTemplates held by the watch-backed claim caches.",
            ("kind",),
            registry=self.registry,
        )

    def namespace_cache_gauges(self, size: Callable[[], float], staleness: Callable[[], float]) -> None:
        """Expose the cache's size and staleness, computed at scrape time."""
        Gauge(
            "ix_gpu_namespace_cache_size",
            "Namespaces held by the watch-backed cache.",
            registry=self.registry,
        ).set_function(size)
        Gauge(
            "ix_gpu_namespace_cache_staleness_seconds",
            "Seconds since the cache last heard from the API server (list, watch event or bookmark).",
            registry=self.registry,
        ).set_function(staleness)

    def set_config_digest(self, old: str | None, new: str) -> None:
        if old is not None and old != new:
            self.config_info.remove(old)
        self.config_info.labels(new).set(1)

    def count_request(self, kind: str, operation: str, result: str) -> None:
        self.admissions.count(kind, operation, result)

    def observe_duration(self, seconds: float) -> None:
        self.admissions.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
