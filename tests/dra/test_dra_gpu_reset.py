"""``flags.reset_gpu`` in the DRA plugin: a new claim's chips (whole chips and boards: with a reset
nothing is shared) are reset before its CDI spec is written; the kubelet asking again for a claim
already prepared resets nothing (its pod may be running); a failed reset, a chip that came back as
another, or a chip another claim holds fails that claim alone, with reason ``reset``."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from ix_gpu.dra.api import dra_v1_pb2 as dra
from ix_gpu.kube.apiserver import ApiServer
from tests.dra.dra_testkit import claim, dra_client, result, running, settings
from tests.dra.fake_resource_api import FakeResourceApi
from tests.dra.test_dra_prepare_failures import counted, spec_file
from tests.support.fake_resets import chip_reset, resets

pytestmark = pytest.mark.timeout(60)

UUID = "GPU-7d0d7c1e-6f0a-5a4c-9b51-0a1b2c3d4e0{}".format


def test_a_new_claims_chips_are_reset_once_and_a_board_whole(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    fake.add_claim("default", "chip", "uid-chip", [result("gpu-1")])
    fake.add_claim("default", "board", "uid-board", [result("gpu-2"), result("gpu-3")])
    config = dataclasses.replace(settings(short_tmp), reset_timeout=5)

    async def scenario() -> str:
        async with running(config, fake_devices, api) as app, dra_client(config) as client:
            request = dra.NodePrepareResourcesRequest(claims=[claim("uid-chip", "chip")])
            first = await client.NodePrepareResources(request)
            assert first.claims["uid-chip"].error == ""
            assert resets(fake_devices) == [[UUID(1)]]
            again = await client.NodePrepareResources(request)  # the kubelet asks again: no reset
            assert [d.device_name for d in again.claims["uid-chip"].devices] == ["gpu-1"]
            board = dra.NodePrepareResourcesRequest(claims=[claim("uid-board", "board")])
            assert (await client.NodePrepareResources(board)).claims["uid-board"].error == ""
            return app.metrics_text().decode()

    metrics = asyncio.run(scenario())
    assert resets(fake_devices) == [[UUID(1)], [UUID(2), UUID(3)]]
    assert 'ix_gpu_dra_gpu_resets_total{result="ok"} 2.0' in metrics


def test_without_the_setting_nothing_is_reset(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    fake.add_claim("default", "chip", "uid-chip", [result("gpu-1")])
    config = settings(short_tmp)

    async def scenario() -> None:
        async with running(config, fake_devices, api), dra_client(config) as client:
            answer = await client.NodePrepareResources(
                dra.NodePrepareResourcesRequest(claims=[claim("uid-chip", "chip")])
            )
            assert answer.claims["uid-chip"].error == ""

    asyncio.run(scenario())
    assert resets(fake_devices) == []


def test_a_failed_reset_fails_that_claim_alone_with_reason_reset(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    fake.add_claim("default", "bad", "uid-bad", [result("gpu-0")])
    fake.add_claim("default", "good", "uid-good", [result("gpu-2")])
    chip_reset(fake_devices, UUID(0), fails="GPU is in use")
    config = dataclasses.replace(settings(short_tmp), reset_timeout=5)

    async def scenario() -> tuple[dra.NodePrepareResourcesResponse, dict[str, float]]:
        async with running(config, fake_devices, api) as app, dra_client(config) as client:
            answer = await client.NodePrepareResources(
                dra.NodePrepareResourcesRequest(claims=[claim("uid-bad", "bad"), claim("uid-good", "good")])
            )
            return answer, counted(app, "ix_gpu_dra_prepare_failures")

    answer, failures = asyncio.run(scenario())
    error = answer.claims["uid-bad"].error
    assert f"GPU reset of {UUID(0)} failed (GPU is in use)" in error and error.endswith("(reason: reset)")
    assert not spec_file(short_tmp, "uid-bad").exists()
    assert answer.claims["uid-good"].error == "" and spec_file(short_tmp, "uid-good").exists()
    assert failures["reset"] == 1
    assert resets(fake_devices) == [[UUID(2)]]


def test_a_chip_that_came_back_as_another_fails_the_claim_and_the_slice_follows(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    fake.add_claim("default", "moved", "uid-moved", [result("gpu-3")])
    renamed = "GPU-00000000-0000-0000-0000-00000000beef"
    chip_reset(fake_devices, UUID(3), uuidAfter=renamed)
    config = dataclasses.replace(settings(short_tmp), reset_timeout=5)

    async def scenario() -> str:
        async with running(config, fake_devices, api) as app, dra_client(config) as client:
            answer = await client.NodePrepareResources(
                dra.NodePrepareResourcesRequest(claims=[claim("uid-moved", "moved")])
            )
            uuids = {chip.uuid for device in app.devices.values() for chip in device.physical.chips}
            assert renamed in uuids and UUID(3) not in uuids
            return answer.claims["uid-moved"].error

    error = asyncio.run(scenario())
    assert f"{UUID(3)} no longer exists after its GPU reset" in error and error.endswith("(reason: reset)")


def test_a_chip_prepared_for_another_claim_is_never_reset_under_it(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    fake.add_claim("default", "first", "uid-first", [result("gpu-1")])
    fake.add_claim("default", "second", "uid-second", [result("gpu-1")])  # no scheduler does this
    config = dataclasses.replace(settings(short_tmp), reset_timeout=5)

    async def scenario() -> str:
        async with running(config, fake_devices, api), dra_client(config) as client:
            first = dra.NodePrepareResourcesRequest(claims=[claim("uid-first", "first")])
            assert (await client.NodePrepareResources(first)).claims["uid-first"].error == ""
            second = dra.NodePrepareResourcesRequest(claims=[claim("uid-second", "second")])
            return (await client.NodePrepareResources(second)).claims["uid-second"].error

    error = asyncio.run(scenario())
    assert f"chip {UUID(1)} is prepared for claim default/first" in error
    assert error.endswith("(reason: reset)")
    assert resets(fake_devices) == [[UUID(1)]]
