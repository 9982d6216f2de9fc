"""DRA claims in the service: the claim caches against the apiserver stand-in (list, watch,
deletion, a cluster without resource.k8s.io/v1), and the webhook over HTTPS injecting a DRA pod
whose template it learned from the watch, with ``policy.claimLookupFailure`` for one it did not.

The caches are built as the service builds them (``claim_cache(api_server(...))``), so
their resource.k8s.io/v1 URLs and watch streams are exercised. The real-cluster
tier points the same code at a real kube-apiserver.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ix_gpu.webhook.core.claims import RESOURCE_CLAIM, RESOURCE_CLAIM_TEMPLATE
from ix_gpu.webhook.service.claim_cache import ARRIVAL_WAIT, ClaimCache, claim_cache
from ix_gpu.webhook.service.namespace_cache import api_server
from tests.service.conftest import FAST
from tests.service.fake_apiserver import CLAIM_PATHS, FakeApiServer
from tests.support.objects import (
    DRA_CLASS,
    apply_response,
    claim_template,
    container,
    device_request,
    pod,
    pod_claim,
    resource_claim,
    review,
)
from tests.support.waiting import wait_until
from tests.support.webhook_process import WebhookProcess

GPU = (("gpu", DRA_CLASS),)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    server.put("team-a")
    server.put_claim(claim_template("gpu", namespace="team-a"))
    server.put_claim(resource_claim("shared", namespace="team-a"))
    server.start()
    yield server
    server.stop()


def _cache(api: FakeApiServer, tmp_path: Path) -> ClaimCache:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    return claim_cache(api_server(str(kubeconfig)), watch_timeout=2, backoff=(0.05, 0.2))


@pytest.fixture
def cache(api: FakeApiServer, tmp_path: Path) -> Iterator[ClaimCache]:
    claims = _cache(api, tmp_path)
    claims.start()
    assert claims.wait_synced(10)
    yield claims
    claims.stop()


def test_the_initial_lists_fill_the_caches(cache: ClaimCache, api: FakeApiServer) -> None:
    assert cache.device_requests(RESOURCE_CLAIM_TEMPLATE, "team-a", "gpu") == GPU
    assert cache.device_requests(RESOURCE_CLAIM, "team-a", "shared") == GPU
    # Kinds, namespaces and names are told apart; what is not held is unknown.
    assert cache.device_requests(RESOURCE_CLAIM, "team-a", "gpu") is None
    assert cache.device_requests(RESOURCE_CLAIM_TEMPLATE, "team-b", "gpu") is None
    assert api.count(f"list {CLAIM_PATHS[RESOURCE_CLAIM]}") == 1
    assert api.count(f"list {CLAIM_PATHS[RESOURCE_CLAIM_TEMPLATE]}") == 1
    assert api.count("list") == 0  # no namespace traffic from the claim caches


def test_the_watch_adds_changes_and_deletes(cache: ClaimCache, api: FakeApiServer) -> None:
    api.put_claim(claim_template("nic", [device_request("nic", "nic.example.com")], namespace="team-a"))
    wait_until(
        lambda: cache.device_requests(RESOURCE_CLAIM_TEMPLATE, "team-a", "nic") is not None, "added", 5
    )
    assert cache.device_requests(RESOURCE_CLAIM_TEMPLATE, "team-a", "nic") == (("nic", "nic.example.com"),)
    api.put_claim(claim_template("nic", namespace="team-a"))
    wait_until(lambda: cache.device_requests(RESOURCE_CLAIM_TEMPLATE, "team-a", "nic") == GPU, "changed", 5)
    api.delete_claim(RESOURCE_CLAIM, "team-a", "shared")
    wait_until(lambda: cache.device_requests(RESOURCE_CLAIM, "team-a", "shared") is None, "deleted", 5)
    assert cache.device_requests(RESOURCE_CLAIM_TEMPLATE, "team-a", "gpu") == GPU


def test_after_compaction_the_caches_relist(cache: ClaimCache, api: FakeApiServer) -> None:
    api.compact()
    api.put_claim(claim_template("later", namespace="team-a"))
    wait_until(
        lambda: cache.device_requests(RESOURCE_CLAIM_TEMPLATE, "team-a", "later") == GPU, "relisted", 10
    )


def test_before_the_caches_sync_every_claim_is_unknown(api: FakeApiServer, tmp_path: Path) -> None:
    claims = _cache(api, tmp_path)  # not started
    assert claims.device_requests(RESOURCE_CLAIM_TEMPLATE, "team-a", "gpu") is None
    assert claims.status()[RESOURCE_CLAIM]["synced"] is False


def test_a_cluster_without_dra_leaves_every_claim_unknown(api: FakeApiServer, tmp_path: Path) -> None:
    api.serves_dra = False
    claims = _cache(api, tmp_path)
    claims.start()
    try:
        wait_until(lambda: claims.status()[RESOURCE_CLAIM]["lastError"] is not None, "failed list", 5)
        assert "404" in claims.status()[RESOURCE_CLAIM]["lastError"]
        assert claims.device_requests(RESOURCE_CLAIM_TEMPLATE, "team-a", "gpu") is None
    finally:
        claims.stop()


# --------------------------------------------------------------------------- the service over HTTPS


def wait_claims_synced(webhook: WebhookProcess) -> None:
    with webhook.client() as client:
        wait_until(
            lambda: client.get("/readyz").json()["claims"][RESOURCE_CLAIM_TEMPLATE]["synced"], "claims", 10
        )


def _dra_pod(template: str) -> dict[str, Any]:
    return pod(
        containers=[container("main", claims=["gpu"]), container("side")],
        resource_claims=[pod_claim("gpu", template=template)],
        namespace="team-a",
    )


def test_the_webhook_injects_a_dra_pod_whose_template_it_watched(
    api: FakeApiServer, tmp_path: Path, cert_dir: Path
) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    with WebhookProcess(tmp_path, cert_dir, kubeconfig=kubeconfig, extra=FAST).start(ready=True) as webhook:
        wait_claims_synced(webhook)
        obj = _dra_pod("gpu")
        injected = webhook.post_review(review(obj, namespace="team-a"))["response"]
        assert injected["auditAnnotations"]["decision"] == "mutated", injected
        mutated = apply_response(obj, injected)
        # The driver mounted; no LD_LIBRARY_PATH for a container served only through its claim.
        assert [m["mountPath"] for m in mutated["spec"]["containers"][0]["volumeMounts"]] == [
            "/usr/local/corex"
        ]
        assert "env" not in mutated["spec"]["containers"][0]
        assert mutated["spec"]["containers"][1] == obj["spec"]["containers"][1]  # type: ignore[index]

        # Created after the webhook started: learned from the watch, no request per review.
        api.put_claim(claim_template("fresh", namespace="team-a"))
        gets = api.count("get")
        wait_until(
            lambda: (
                webhook.post_review(review(_dra_pod("fresh"), namespace="team-a"))["response"][
                    "auditAnnotations"
                ]["decision"]
                == "mutated"
            ),
            "learned",
            5,
        )
        assert api.count("get") == gets

        # A claim it never learns: refused by default (claimLookupFailure: deny), never admitted
        # without its injection.
        unknown = webhook.post_review(review(_dra_pod("never"), namespace="team-a"))["response"]
        assert unknown["allowed"] is False
        assert "policy.claimLookupFailure is deny" in unknown["status"]["message"]


def test_an_unknown_claim_is_admitted_unmodified_only_when_configured_and_counted(
    api: FakeApiServer, tmp_path: Path, cert_dir: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "apiVersion: ix-gpu.io/v1alpha1\nkind: WebhookConfig\n"
        "policy:\n  claimLookupFailure: allow-unmodified\n"
    )
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    api.serves_dra = False  # the caches never sync: every claim is unknown
    with WebhookProcess(tmp_path, cert_dir, config=config, kubeconfig=kubeconfig, extra=FAST).start(
        ready=True  # readiness does not wait for the claim caches
    ) as webhook:
        allowed = webhook.post_review(review(_dra_pod("gpu"), namespace="team-a"))["response"]
        assert allowed["allowed"] is True and "patch" not in allowed
        assert any("policy.claimLookupFailure" in w for w in allowed["warnings"])
        assert webhook.metric("ix_gpu_admission_allowed_unmodified_total", lookup="claim") == 1
        plain = webhook.post_review(review(pod(namespace="team-a"), namespace="team-a"))["response"]
        assert plain["auditAnnotations"]["decision"] == "mutated"  # limits-based pods as before


def test_a_pod_sent_just_before_its_claim_templates_watch_event_waits_for_it(
    api: FakeApiServer, tmp_path: Path, cert_dir: Path
) -> None:
    """``kubectl apply`` of a template and its pod: the pod's review can come before the watch
    event. The review waits (bounded) for the name it missed, then injects; a name that never
    comes is answered per claimLookupFailure after the wait, and each outcome is counted."""
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    with WebhookProcess(tmp_path, cert_dir, kubeconfig=kubeconfig, extra=FAST).start(ready=True) as webhook:
        wait_claims_synced(webhook)
        answers: list[dict[str, Any]] = []
        sender = threading.Thread(
            target=lambda: answers.append(webhook.post_review(review(_dra_pod("racing"), namespace="team-a")))
        )
        sender.start()
        time.sleep(0.5)  # the review is waiting by now; only then does the template exist
        api.put_claim(claim_template("racing", namespace="team-a"))
        sender.join(10)
        (answer,) = answers
        assert answer["response"]["auditAnnotations"]["decision"] == "mutated", answer
        started = time.monotonic()
        unknown = webhook.post_review(review(_dra_pod("never"), namespace="team-a"))["response"]
        waited = time.monotonic() - started
        assert unknown["allowed"] is False  # claimLookupFailure: deny, the default
        assert "policy.claimLookupFailure is deny" in unknown["status"]["message"]
        assert ARRIVAL_WAIT <= waited < ARRIVAL_WAIT + 3, waited  # bounded: one wait, then the answer
        with webhook.client() as client:
            metrics = client.get("/metrics").text
        assert 'ix_gpu_claim_waits_total{outcome="arrived"} 1.0' in metrics, metrics
        assert 'ix_gpu_claim_waits_total{outcome="missing"} 1.0' in metrics, metrics
        assert 'ix_gpu_claim_cache_size{kind="ResourceClaimTemplate"} 2.0' in metrics, metrics


def test_waiting_for_a_claim_that_never_comes_checks_a_few_times_and_gives_up(cache: ClaimCache) -> None:
    """Bounded in time and in work: a review naming a claim nobody creates wakes about ten times in
    the whole wait, so many such reviews cannot keep the event loop busy."""
    checks = 0
    real = cache.device_requests

    def counted(kind: str, namespace: str, name: str) -> Any:
        nonlocal checks
        checks += 1
        return real(kind, namespace, name)

    cache.device_requests = counted  # type: ignore[method-assign]
    started = time.monotonic()
    arrived = asyncio.run(cache.arrival([(RESOURCE_CLAIM_TEMPLATE, "team-a", "never")] * 3, timeout=1.5))
    waited = time.monotonic() - started
    assert arrived is False
    assert 1.5 <= waited < 2.5, waited
    assert checks <= 12, checks
    assert asyncio.run(cache.arrival([(RESOURCE_CLAIM_TEMPLATE, "team-a", "gpu")], timeout=1.5)) is True
