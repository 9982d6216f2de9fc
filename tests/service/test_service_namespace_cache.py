"""The namespace cache against a local stand-in for the kube-apiserver (unit level).

The cache is built exactly as the service builds it, ``NamespaceListWatch(api_server(kubeconfig))``,
so these tests exercise the list and watch's URL layout, query parameters and chunked watch streams.
The real-Kubernetes tier (tests/k8s) points the same code at a real kube-apiserver.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ix_gpu.webhook.core.decision import NamespaceFacts
from ix_gpu.webhook.service.metrics import ServiceMetrics
from ix_gpu.webhook.service.namespace_cache import (
    NamespaceCache,
    NamespaceListWatch,
    NamespaceLookupFailed,
    api_server,
)
from tests.service.conftest import FAST
from tests.service.fake_apiserver import FakeApiServer
from tests.support.objects import container, pod, review
from tests.support.waiting import wait_until
from tests.support.webhook_process import WebhookProcess

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    server.put("team-a", annotations={LAST_APPLIED: "{" + "x" * 5000 + "}"})
    server.put("optout", annotations={"ix-gpu.io/inject": "disabled"})
    server.put("baseline", labels={"pod-security.kubernetes.io/enforce": "baseline"})
    server.start()
    yield server
    server.stop()


@pytest.fixture
def metrics() -> ServiceMetrics:
    return ServiceMetrics()


@pytest.fixture
def cache(api: FakeApiServer, tmp_path: Path, metrics: ServiceMetrics) -> Iterator[NamespaceCache]:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    cache = NamespaceCache(
        NamespaceListWatch(api_server(str(kubeconfig))),
        metrics=metrics,
        lookup_timeout=1.0,
        watch_timeout=2,
        backoff=(0.05, 0.2),
    )
    cache.start()
    assert cache.wait_synced(10)
    yield cache
    cache.stop()


def _sample(metrics: ServiceMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _facts(cache: NamespaceCache, name: str) -> NamespaceFacts:
    return asyncio.run(cache.facts(name))


def test_initial_list_fills_the_cache(
    cache: NamespaceCache, api: FakeApiServer, metrics: ServiceMetrics
) -> None:
    optout = _facts(cache, "optout")
    assert optout.known and optout.annotations == {"ix-gpu.io/inject": "disabled"}
    assert _facts(cache, "baseline").labels == {"pod-security.kubernetes.io/enforce": "baseline"}
    # Only the keys the core reads are kept: kilobytes of last-applied config are not.
    assert _facts(cache, "team-a").annotations == {}
    assert api.count("get") == 0
    assert _sample(metrics, "ix_gpu_namespace_lookups_total", result="hit") == 3
    assert _sample(metrics, "ix_gpu_namespace_cache_size") == 3
    assert cache.ready() and cache.status()["synced"] is True


def test_watch_applies_adds_changes_and_deletes(cache: NamespaceCache, api: FakeApiServer) -> None:
    api.put("new-team")
    wait_until(lambda: cache.cached("new-team") is not None, "ADDED", 10, interval=0.02)
    api.put("new-team", annotations={"ix-gpu.io/inject": "disabled"})
    wait_until(
        lambda: (f := cache.cached("new-team")) is not None and bool(f.annotations),
        "MODIFIED",
        10,
        interval=0.02,
    )
    api.delete("new-team")
    wait_until(lambda: cache.cached("new-team") is None, "DELETED", 10, interval=0.02)
    assert api.count("get") == 0 and api.count("list") == 1


def test_watch_continues_from_its_resource_version(cache: NamespaceCache, api: FakeApiServer) -> None:
    """A watch ended by the server (timeoutSeconds) is resumed, not replaced by a re-list."""
    wait_until(lambda: api.count("watch") >= 3, "two watch restarts", 10, interval=0.02)
    api.put("after-restarts")
    wait_until(lambda: cache.cached("after-restarts") is not None, "event after restarts", 10, interval=0.02)
    assert api.count("list") == 1
    assert cache.staleness_seconds() < 3


def test_gone_event_triggers_a_relist(
    cache: NamespaceCache, api: FakeApiServer, metrics: ServiceMetrics
) -> None:
    api.hold_events = True  # the watch falls behind ...
    api.put("missed")
    api.compact()  # ... and its history is compacted: 410 Gone
    wait_until(lambda: cache.cached("missed") is not None, "re-list after 410", 10, interval=0.02)
    assert api.count("list") == 2
    assert _sample(metrics, "ix_gpu_namespace_cache_relists_total") == 2
    assert _sample(metrics, "ix_gpu_namespace_cache_watch_errors_total") == 0
    api.release_events()
    api.put("after-gone")
    wait_until(lambda: cache.cached("after-gone") is not None, "watching again", 10, interval=0.02)


def test_http_410_on_watch_triggers_a_relist(cache: NamespaceCache, api: FakeApiServer) -> None:
    api.watch_gone_http = True
    wait_until(lambda: api.count("list") == 2, "re-list after HTTP 410", 10, interval=0.02)
    api.put("after-http-gone")
    wait_until(lambda: cache.cached("after-http-gone") is not None, "watching again", 10, interval=0.02)


def test_errors_back_off_and_recover(
    cache: NamespaceCache, api: FakeApiServer, metrics: ServiceMetrics
) -> None:
    api.fail_next = 3
    wait_until(lambda: cache.status()["lastError"] is not None, "an error", 10, interval=0.02)
    api.put("during-outage")
    wait_until(lambda: cache.cached("during-outage") is not None, "recovery", 10, interval=0.02)
    assert _sample(metrics, "ix_gpu_namespace_cache_watch_errors_total") == 3
    assert cache.status()["lastError"] is None
    assert cache.ready()


def test_a_410_storm_relists_with_backoff_not_as_fast_as_the_server_answers(
    cache: NamespaceCache, api: FakeApiServer
) -> None:
    """Every list and watch answered 410 for 2 s: the cache waits between re-lists (0.05 s doubling
    to 0.2 s here, with jitter), where it used to re-list as fast as the server answered.

    The 2 s count from the storm's first re-list: the watch open when the 410s begin runs to its
    own end first (``watch_timeout``, 2 s here), so the storm reaches the cache up to 2 s later."""
    before = api.count("list")
    api.always_gone = True
    wait_until(lambda: api.count("list") > before, "the storm's first re-list", 10, interval=0.01)
    first = api.count("list")
    time.sleep(2.0)
    storm = api.count("list") - first
    api.always_gone = False
    assert 2 <= storm <= 16, storm
    api.put("after-storm")
    wait_until(
        lambda: cache.cached("after-storm") is not None, "re-listed after the storm", 10, interval=0.02
    )
    assert cache.ready()


def test_a_silent_watch_turns_the_cache_stale_and_not_ready_until_it_hears_again(
    api: FakeApiServer, tmp_path: Path, metrics: ServiceMetrics
) -> None:
    """The watch is accepted and then says nothing, not even its end: no error, yet the cache
    stops hearing. Past ``max_staleness`` it is not ready (the webhook's /readyz fails), and
    its status says stale; the first event heard makes it ready again."""
    api.silent_watches = True
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    watched = NamespaceListWatch(api_server(str(kubeconfig)))
    cache = NamespaceCache(watched, metrics=metrics, watch_timeout=30, backoff=(0.05, 0.2), max_staleness=0.5)
    cache.start()
    try:
        assert cache.wait_synced(10) and cache.ready()
        wait_until(lambda: not cache.ready(), "stale", 5, interval=0.02)
        status = cache.status()
        assert status["stale"] is True and status["synced"] is True and status["lastError"] is None
        assert status["stalenessSeconds"] > 0.5 and status["maxStalenessSeconds"] == 0.5
        assert api.count("list") == 1 and api.count("watch") == 1
        api.silent_watches = False
        api.put("heard")
        wait_until(lambda: cache.cached("heard") is not None, "the event", 10, interval=0.02)
        assert cache.ready() and cache.status()["stale"] is False
    finally:
        cache.stop()


def _started_with_budget(
    api: FakeApiServer, tmp_path: Path, metrics: ServiceMetrics, budget: float
) -> NamespaceCache:
    """A synced cache whose lookups try for ``budget`` seconds, each try at most 1 s."""
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    cache = NamespaceCache(
        NamespaceListWatch(api_server(str(kubeconfig))),
        metrics=metrics,
        lookup_timeout=1.0,
        lookup_budget=budget,
    )
    cache.start()
    if not cache.wait_synced(10):
        cache.stop()
        raise AssertionError("the namespace cache did not sync within 10 s")
    return cache


def test_a_namespace_created_during_an_outage_is_read_by_a_later_try_within_the_budget(
    api: FakeApiServer, tmp_path: Path, metrics: ServiceMetrics
) -> None:
    """A namespace the watch has not brought yet (created as the API server restarts): its GET
    fails twice, and the third try, 0.3 s later, reads it; before, one failed try of 2 s had the
    pod admitted untouched."""
    cache = _started_with_budget(api, tmp_path, metrics, 3.0)
    try:
        api.hold_events = True  # the watch has not brought it
        api.put("created-now", annotations={"ix-gpu.io/inject": "disabled"})
        api.fail_next = 2
        facts = _facts(cache, "created-now")
        assert facts.known and facts.annotations == {"ix-gpu.io/inject": "disabled"}
        # Two requests fail: the GET's (a watch renewing meanwhile may take one of them).
        assert 1 <= _sample(metrics, "ix_gpu_namespace_lookups_total", result="retried") <= 2
        assert _sample(metrics, "ix_gpu_namespace_lookups_total", result="fetched") == 1
    finally:
        api.release_events()
        cache.stop()


def test_a_lookup_whose_budget_runs_out_fails_naming_its_tries(
    api: FakeApiServer, tmp_path: Path, metrics: ServiceMetrics
) -> None:
    cache = _started_with_budget(api, tmp_path, metrics, 0.5)
    try:
        api.fail_next = 1000
        started = time.monotonic()
        with pytest.raises(NamespaceLookupFailed, match=r"could not be read \(\d+ tries in 0.5 s\)"):
            _facts(cache, "never")
        assert time.monotonic() - started < 1.5
        assert _sample(metrics, "ix_gpu_namespace_lookups_total", result="failed") == 1
    finally:
        api.fail_next = 0
        cache.stop()


def test_a_forbidden_lookup_is_not_tried_again(
    api: FakeApiServer, tmp_path: Path, metrics: ServiceMetrics
) -> None:
    """A 403 (the webhook's RBAC lost its get on namespaces) would answer the same to every try:
    one GET, no retry, and the review is answered at once, not at the end of its budget."""
    cache = _started_with_budget(api, tmp_path, metrics, 3.0)
    try:
        api.fail_status, api.fail_next = 403, 1000
        started = time.monotonic()
        with pytest.raises(NamespaceLookupFailed, match="403"):
            _facts(cache, "not-allowed")
        assert time.monotonic() - started < 1.0  # well inside the 3 s budget
        # One request answered 403: the GET (a watch renewing meanwhile could take a second).
        assert 1 <= 1000 - api.fail_next <= 2
        assert _sample(metrics, "ix_gpu_namespace_lookups_total", result="retried") == 0
        assert _sample(metrics, "ix_gpu_namespace_lookups_total", result="failed") == 1
    finally:
        api.fail_next, api.fail_status = 0, 500
        cache.stop()


def test_a_lookup_whose_budget_was_spent_in_the_queue_fails_without_a_get(
    cache: NamespaceCache, api: FakeApiServer, metrics: ServiceMetrics
) -> None:
    """The budget runs from the review's request, not from when a worker is free."""
    gets = api.count("get")
    with pytest.raises(NamespaceLookupFailed, match="the lookups before it took the time"):
        cache._fetch("queued", time.monotonic() - 0.1)
    assert api.count("get") == gets
    assert _sample(metrics, "ix_gpu_namespace_lookups_total", result="failed") == 1


def test_miss_is_answered_by_a_direct_get(
    cache: NamespaceCache, api: FakeApiServer, metrics: ServiceMetrics
) -> None:
    api.hold_events = True  # created a moment ago: the watch has not delivered it yet
    api.put("fresh", labels={"ix-gpu.io/inject": "disabled"})
    facts = _facts(cache, "fresh")
    assert facts.known and facts.labels == {"ix-gpu.io/inject": "disabled"}
    assert api.count("get") == 1
    assert _sample(metrics, "ix_gpu_namespace_lookups_total", result="fetched") == 1
    _facts(cache, "fresh")
    assert api.count("get") == 1  # remembered


def test_absent_namespace_is_known_and_empty(cache: NamespaceCache, metrics: ServiceMetrics) -> None:
    facts = _facts(cache, "does-not-exist")
    assert facts == NamespaceFacts("does-not-exist")
    assert _sample(metrics, "ix_gpu_namespace_lookups_total", result="absent") == 1


def test_concurrent_misses_share_one_get(cache: NamespaceCache, api: FakeApiServer) -> None:
    api.hold_events = True
    api.put("popular")
    api.get_delay = 0.3

    async def many() -> list[NamespaceFacts]:
        return await asyncio.gather(*(cache.facts("popular") for _ in range(20)))

    results = asyncio.run(many())
    assert {f.name for f in results} == {"popular"}
    assert api.count("get") == 1


def test_slow_api_server_fails_the_lookup_within_its_budget(
    cache: NamespaceCache, api: FakeApiServer
) -> None:
    """Each try waits at most the lookup timeout (1 s here), and all of them the budget (3 s)."""
    api.hold_events = True
    api.put("slow")
    api.get_delay = 3.0
    started = time.monotonic()
    with pytest.raises(NamespaceLookupFailed, match='namespace "slow" could not be read'):
        _facts(cache, "slow")
    assert time.monotonic() - started < 3.5


def test_unreachable_api_server(cache: NamespaceCache, api: FakeApiServer, metrics: ServiceMetrics) -> None:
    api.stop()
    with pytest.raises(NamespaceLookupFailed):
        _facts(cache, "never-seen")
    assert _sample(metrics, "ix_gpu_namespace_lookups_total", result="failed") == 1
    # What was learned before keeps answering, and the staleness shows how old it is.
    assert _facts(cache, "optout").annotations == {"ix-gpu.io/inject": "disabled"}
    wait_until(lambda: cache.staleness_seconds() > 2.5, "staleness", 10, interval=0.02)
    assert _sample(metrics, "ix_gpu_namespace_cache_staleness_seconds") > 2.5


# ------------------------------------------------------------------ through the service


def _post(webhook: WebhookProcess, body: dict[str, object]) -> dict[str, object]:
    with webhook.client() as client:
        answer = client.post(
            "/mutate", content=json.dumps(body), headers={"content-type": "application/json"}
        )
    assert answer.status_code == 200, answer.text
    response = answer.json()["response"]
    assert isinstance(response, dict)
    return response


def test_lookup_failure_allows_unmodified_when_configured_and_counts_it(
    tmp_path: Path, cert_dir: Path
) -> None:
    """``allow-unmodified``, chosen explicitly: the GPU pod is admitted uninjected with a warning,
    and ``ix_gpu_admission_allowed_unmodified_total{lookup="namespace"}`` counts it (its alert)."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "apiVersion: ix-gpu.io/v1alpha1\nkind: WebhookConfig\n"
        "policy:\n  namespaceLookupFailure: allow-unmodified\n"
    )
    api = FakeApiServer()
    api.put("team-a")
    api.start()
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    extra = [*FAST, "--namespace-lookup-budget", "0.3"]
    webhook = WebhookProcess(tmp_path, cert_dir, config=config, kubeconfig=kubeconfig, extra=extra).start()
    try:
        with webhook.client() as client:
            wait_until(lambda: client.get("/readyz").status_code == 200, "ready", 10, interval=0.02)
        api.stop()

        cached = _post(webhook, review(pod(namespace="team-a"), namespace="team-a"))
        assert cached["auditAnnotations"]["decision"] == "mutated"  # type: ignore[index]

        unknown = _post(webhook, review(pod(namespace="brand-new"), namespace="brand-new"))
        assert unknown["allowed"] is True and "patch" not in unknown
        assert any("namespaceLookupFailure" in w for w in unknown["warnings"])  # type: ignore[attr-defined]

        no_gpu = _post(
            webhook, review(pod(containers=[container("web")], namespace="brand-2"), namespace="brand-2")
        )
        assert "warnings" not in no_gpu and no_gpu["allowed"] is True
        assert webhook.metric("ix_gpu_namespace_lookups_total", result="failed") == 1
        assert webhook.metric("ix_gpu_admission_allowed_unmodified_total", lookup="namespace") == 1
    finally:
        webhook.stop()


def test_lookup_failure_denies_by_default_with_a_retriable_message(tmp_path: Path, cert_dir: Path) -> None:
    """The default config: a GPU pod whose namespace cannot be read is refused, never stored
    without its injection (what failurePolicy Fail promises), and the message says to retry."""
    config = tmp_path / "config.yaml"
    config.write_text("apiVersion: ix-gpu.io/v1alpha1\nkind: WebhookConfig\n")
    api = FakeApiServer()
    api.start()
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    api.stop()  # unreachable from the start
    webhook = WebhookProcess(tmp_path, cert_dir, config=config, kubeconfig=kubeconfig, extra=FAST).start()
    try:
        with webhook.client() as client:
            ready = client.get("/readyz")
            assert ready.status_code == 503 and ready.json()["namespaces"]["synced"] is False
            assert client.get("/healthz").status_code == 200
        denied = _post(webhook, review(pod()))
        assert denied["allowed"] is False
        message = denied["status"]["message"]  # type: ignore[index]
        assert "policy.namespaceLookupFailure: deny" in message and "create it again" in message, message
        assert webhook.metric("ix_gpu_admission_allowed_unmodified_total", lookup="namespace") == 0
    finally:
        webhook.stop()


def test_the_webhook_is_not_ready_while_its_namespace_cache_is_staler_than_its_bound(
    tmp_path: Path, cert_dir: Path
) -> None:
    """``ix-gpu webhook --cache-max-staleness``, end to end: the API server accepts the watch and
    says nothing more, so /readyz turns 503 naming the stale cache; the first event heard makes it
    ready again."""
    api = FakeApiServer()
    api.put("team-a")
    api.silent_watches = True
    api.start()
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    extra = [*FAST, "--cache-max-staleness", "1"]
    webhook = WebhookProcess(tmp_path, cert_dir, kubeconfig=kubeconfig, extra=extra).start()
    try:
        with webhook.client() as client:
            wait_until(lambda: client.get("/readyz").status_code == 200, "synced", 10, interval=0.02)
            wait_until(
                lambda: client.get("/readyz").status_code == 503, "not ready: stale", 10, interval=0.05
            )
            stale = client.get("/readyz").json()["namespaces"]
            assert stale["stale"] is True and stale["synced"] is True and stale["lastError"] is None, stale
            api.silent_watches = False
            api.put("heard")
            wait_until(lambda: client.get("/readyz").status_code == 200, "ready again", 10, interval=0.05)
    finally:
        webhook.stop()
        api.stop()
