"""One bad claim in a NodePrepareResources (or NodeUnprepareResources) call fails alone: its entry
carries an error naming the claim and the reason, the call's other claims are prepared (CDI
devices answered, specs written), and ``ix_gpu_dra_prepare_failures_total`` counts it by reason.
Before, an answer cut off mid-body or not JSON escaped as an exception and failed the whole call
with gRPC UNKNOWN, uncounted."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ix_gpu.dra.api import dra_v1_pb2 as dra
from ix_gpu.dra.app import DraApp
from ix_gpu.dra.claims import FAILURE_REASONS, UNPREPARE_FAILURE_REASONS, ClaimRef
from ix_gpu.kube.apiserver import ApiServer
from tests.dra.dra_testkit import claim, dra_client, result, running, settings
from tests.dra.fake_resource_api import RESOURCE, FakeResourceApi

pytestmark = pytest.mark.timeout(60)

GOOD = ("uid-first", "uid-third")
CLAIMS = [claim("uid-first", "first"), claim("uid-bad", "bad"), claim("uid-third", "third")]


def counted(app: DraApp, family: str) -> dict[str, float]:
    """``<family>_total`` by reason, as /metrics serves it."""
    return {
        s.labels["reason"]: s.value
        for f in text_string_to_metric_families(app.metrics_text().decode())
        for s in f.samples
        if s.name == f"{family}_total"
    }


def spec_file(root: Path, uid: str) -> Path:
    return root / "cdi" / f"iluvatar.com-gpu-claim-{uid}.json"


def add_three_claims(fake: FakeResourceApi) -> dict[str, Any]:
    """first (gpu-0), bad (gpu-1), third (gpu-2); the bad one's stored claim is returned."""
    fake.add_claim("default", "first", "uid-first", [result("gpu-0")])
    bad = fake.add_claim("default", "bad", "uid-bad", [result("gpu-1")])
    fake.add_claim("default", "third", "uid-third", [result("gpu-2")])
    return bad


@pytest.mark.parametrize(
    ("fault", "reason", "said"),
    [
        ("cut", "read", "IncompleteRead"),  # the body ends before its Content-Length
        ("junk", "parse", "not JSON"),  # a proxy's HTML error page with a 200
        ("500", "read", "500"),
        ("deep", "parse", "nested too deep"),  # 100,000 levels: the parser stops, not the plugin
        ("shape", "parse", "status.allocation.devices is a str"),  # JSON, but not a claim's shape
    ],
)
def test_a_claim_that_cannot_be_read_fails_alone_and_is_counted_by_reason(
    short_tmp: Path,
    fake_devices: Path,
    resource_api: tuple[FakeResourceApi, ApiServer],
    fault: str,
    reason: str,
    said: str,
) -> None:
    fake, api = resource_api
    bad = add_three_claims(fake)
    if fault == "shape":
        bad["status"]["allocation"]["devices"] = "gpu-1"
    else:
        fake.faults[f"{RESOURCE}/namespaces/default/resourceclaims/bad"] = fault
    config = settings(short_tmp)

    async def scenario() -> tuple[dict[str, float], dra.NodePrepareResourcesResponse, dict[str, float]]:
        async with running(config, fake_devices, api) as app, dra_client(config) as client:
            before = counted(app, "ix_gpu_dra_prepare_failures")
            answer = await client.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=CLAIMS))
            return before, answer, counted(app, "ix_gpu_dra_prepare_failures")

    before, answer, after = asyncio.run(scenario())
    assert set(answer.claims) == {"uid-first", "uid-bad", "uid-third"}
    for uid, device in zip(GOOD, ("gpu-0", "gpu-2"), strict=True):
        entry = answer.claims[uid]
        assert entry.error == ""
        assert [list(d.cdi_device_ids) for d in entry.devices] == [[f"iluvatar.com/gpu={uid}-{device}"]]
        assert spec_file(short_tmp, uid).exists()
    error = answer.claims["uid-bad"].error
    assert "default/bad (uid-bad)" in error and said in error, error
    assert error.endswith(f"(reason: {reason})"), error
    assert not answer.claims["uid-bad"].devices and not spec_file(short_tmp, "uid-bad").exists()
    assert set(json.loads(config.checkpoint.read_text())["claims"]) == set(GOOD)
    assert set(before) == set(FAILURE_REASONS) and not any(before.values())  # every series from the start
    assert after == {**before, reason: 1.0}


def test_the_kubelets_retry_of_the_failed_claim_alone_prepares_it(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    add_three_claims(fake)
    path = f"{RESOURCE}/namespaces/default/resourceclaims/bad"
    fake.faults[path] = "cut"
    config = settings(short_tmp)

    async def scenario() -> tuple[dra.NodePrepareResourcesResponse, dict[str, float]]:
        async with running(config, fake_devices, api) as app, dra_client(config) as client:
            first = await client.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=CLAIMS))
            assert first.claims["uid-bad"].error
            del fake.faults[path]
            again = await client.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=CLAIMS[1:2]))
            return again, counted(app, "ix_gpu_dra_prepare_failures")

    again, failures = asyncio.run(scenario())
    assert again.claims["uid-bad"].error == ""
    assert [d.device_name for d in again.claims["uid-bad"].devices] == ["gpu-1"]
    assert spec_file(short_tmp, "uid-bad").exists()
    assert failures["read"] == 1


def test_an_unforeseen_exception_is_that_claims_internal_failure_and_unprepare_fails_alone_too(
    short_tmp: Path,
    fake_devices: Path,
    resource_api: tuple[FakeResourceApi, ApiServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, api = resource_api
    add_three_claims(fake)
    config = settings(short_tmp)

    Answers = tuple[dra.NodePrepareResourcesResponse, dra.NodeUnprepareResourcesResponse]

    async def scenario() -> tuple[Answers, dict[str, float], dict[str, float]]:
        async with running(config, fake_devices, api) as app, dra_client(config) as client:
            read = app.preparer.read_claim

            def buggy(ref: ClaimRef) -> dict[str, Any]:
                if ref.name == "bad":
                    raise TypeError("'NoneType' object is not subscriptable")
                return read(ref)

            app.preparer.read_claim = buggy
            prepared = await client.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=CLAIMS))
            # The middle reference is no uid at all: only its entry fails.
            claims = [CLAIMS[0], claim("../etc", "bad"), CLAIMS[2]]
            gone = await client.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(claims=claims))
            return (
                (prepared, gone),
                counted(app, "ix_gpu_dra_prepare_failures"),
                counted(app, "ix_gpu_dra_unprepare_failures"),
            )

    with caplog.at_level(logging.ERROR, logger="ix_gpu.dra.servicer"):
        (prepared, gone), prepare_failures, unprepare_failures = asyncio.run(scenario())
    assert [prepared.claims[uid].error for uid in GOOD] == ["", ""]
    error = prepared.claims["uid-bad"].error
    assert "default/bad (uid-bad)" in error and "TypeError" in error and error.endswith("(reason: internal)")
    assert prepare_failures["internal"] == 1 and sum(prepare_failures.values()) == 1
    (logged,) = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert logged.exc_info is not None  # the traceback, to find the bug by
    assert [gone.claims[uid].error for uid in GOOD] == ["", ""]
    assert not any(spec_file(short_tmp, uid).exists() for uid in GOOD)
    assert "is not a Kubernetes uid" in gone.claims["../etc"].error
    assert gone.claims["../etc"].error.endswith("(reason: invalid)")
    assert set(unprepare_failures) == set(UNPREPARE_FAILURE_REASONS)
    assert unprepare_failures["invalid"] == 1 and sum(unprepare_failures.values()) == 1
