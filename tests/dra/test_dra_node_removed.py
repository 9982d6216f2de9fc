"""A Node deleted while its DRA plugin runs, then registered again by its kubelet: the slices were
owned by the old Node object, so the garbage collector deleted them with it. The plugin, which
watches its Node, publishes them again, owned by the new object (an owner reference to the old
uid would have the collector delete them at once). On real nodes: tests/k8s/test_real_nodes_dra.py
(a node drained and deleted)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ix_gpu.kube.apiserver import ApiServer
from tests.dra.dra_testkit import DRIVER, NODE, running, settings
from tests.dra.fake_resource_api import FakeResourceApi
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.timeout(60)

SLICE = f"{NODE}-{DRIVER}"


def test_a_node_registered_again_gets_its_slice_back_owned_by_the_new_node(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    config = settings(short_tmp)

    def owner() -> str | None:
        stored = fake.slices.get(SLICE)
        return stored["metadata"]["ownerReferences"][0]["uid"] if stored else None

    async def scenario() -> None:
        async with running(config, fake_devices, api):
            await wait_until_async(lambda: owner() == f"uid-{NODE}", "the slice, owned by the node")
            with fake.lock:  # the Node deleted, and its slices by the garbage collector
                labels = fake.nodes.pop(NODE)["metadata"]["labels"]
                fake.slices.clear()
            await asyncio.sleep(0.6)  # the plugin hears of it (a few health rounds of 0.2 s)
            with fake.lock:
                fake.add_node(NODE, labels=labels)  # the kubelet registers it again: a new uid
                fake.nodes[NODE]["metadata"]["uid"] = "uid-again"
            await wait_until_async(lambda: owner() == "uid-again", "the slice again, owned by the new node")

    asyncio.run(scenario())
    assert [d["name"] for d in fake.slices[SLICE]["spec"]["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
