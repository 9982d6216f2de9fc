"""The DRA plugin hands out a node's GPUs only on a node labelled ix-gpu.io/gpu.allocation=dra
whose kubelet offers no device-plugin GPUs, and withdraws them when that stops being true."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ix_gpu.devicemodel.labels import GPU_ALLOCATION
from ix_gpu.dra.api import dra_v1_pb2 as dra
from ix_gpu.kube.apiserver import ApiServer
from tests.dra.dra_testkit import DRIVER, NODE, claim, dra_client, result, running, settings
from tests.dra.fake_resource_api import FakeResourceApi
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.timeout(60)

SLICE = f"{NODE}-{DRIVER}"
EARLY = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
LATE = "1f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f1"


def set_node(fake: FakeResourceApi, label: str | None, allocatable: dict[str, str] | None = None) -> None:
    with fake.lock:
        node = fake.nodes[NODE]
        node["metadata"]["labels"] = {} if label is None else {GPU_ALLOCATION: label}
        node["status"]["allocatable"] = dict(allocatable or {})


def slice_devices(fake: FakeResourceApi) -> list[Any] | None:
    with fake.lock:
        stored = fake.slices.get(SLICE)
        return None if stored is None else list(stored["spec"]["devices"])


def generation(fake: FakeResourceApi) -> int:
    with fake.lock:
        return int(fake.slices[SLICE]["spec"]["pool"]["generation"])


def decided(app: Any) -> bool:
    """The app heard its node (a watch) and decided from it."""
    return app.node_reader.facts() is not None and "not read yet" not in app.allocation.reason


async def prepare(client: Any, uid: str, name: str = "claim") -> dra.NodePrepareResourceResponse:
    answer = await client.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=[claim(uid, name)]))
    return answer.claims[uid]


def test_a_device_plugin_node_gets_no_slice_and_no_prepared_claim(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    set_node(fake, None)  # unlabelled: the device plugin's
    fake.add_claim("default", "claim", EARLY, [result("gpu-0")])
    config = settings(short_tmp)

    async def scenario() -> dra.NodePrepareResourceResponse:
        async with running(config, fake_devices, api) as app, dra_client(config) as client:
            await wait_until_async(lambda: decided(app), "the node's watch answered")
            assert not app.allocation.allowed
            return await prepare(client, EARLY)

    refused = asyncio.run(scenario())
    assert slice_devices(fake) is None  # no slice is created just to list nothing
    assert f"without the label {GPU_ALLOCATION}=dra" in refused.error
    assert not (short_tmp / "cdi").exists() or not list((short_tmp / "cdi").iterdir())


def test_handover_waits_for_the_device_plugin_and_withdraws_on_relabel(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    fake.add_claim("default", "claim", EARLY, [result("gpu-0")])
    fake.add_claim("default", "late", LATE, [result("gpu-1")])
    # Labelled dra, but the kubelet still offers the device plugin's GPUs: not yet.
    set_node(fake, "dra", {"iluvatar.com/gpu": "4", "cpu": "8"})
    config = settings(short_tmp)

    async def scenario() -> None:
        async with running(config, fake_devices, api) as app, dra_client(config) as client:
            await wait_until_async(lambda: decided(app), "the node's watch answered")
            assert slice_devices(fake) is None
            assert "still offers iluvatar.com/gpu=4" in (await prepare(client, EARLY)).error

            set_node(fake, "dra", {"iluvatar.com/gpu": "0"})  # the device plugin advertises none now
            await wait_until_async(lambda: len(slice_devices(fake) or []) == 4, "4 devices published")
            first = await prepare(client, EARLY)
            assert first.error == "" and [d.device_name for d in first.devices] == ["gpu-0"]
            published = generation(fake)

            set_node(fake, "device-plugin")  # back to the device plugin
            await wait_until_async(lambda: slice_devices(fake) == [], "slice emptied")
            assert generation(fake) > published  # consumers see the empty pool as the newest
            assert not app.allocation.allowed
            late = await prepare(client, LATE, "late")
            assert "not preparing it" in late.error and f"{GPU_ALLOCATION}=device-plugin" in late.error
            # A claim prepared while the GPUs were DRA's is still answered (nothing new is handed
            # out) and still cleaned up.
            assert await prepare(client, EARLY) == first
            gone = await client.NodeUnprepareResources(
                dra.NodeUnprepareResourcesRequest(claims=[claim(EARLY)])
            )
            assert gone.claims[EARLY].error == ""

    asyncio.run(scenario())
    assert not list((short_tmp / "cdi").iterdir())


def test_a_label_that_is_neither_mode_hands_out_nothing(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    config = settings(short_tmp)

    async def scenario() -> None:
        async with running(config, fake_devices, api):
            await wait_until_async(lambda: len(slice_devices(fake) or []) == 4, "4 devices published")
            set_node(fake, "DRA")
            await wait_until_async(lambda: slice_devices(fake) == [], "slice emptied")

    asyncio.run(scenario())
