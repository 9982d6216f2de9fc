"""The device plugin advertises no devices on a node whose GPUs are DRA's (ix-gpu.io/gpu.allocation=dra),
and with --dra-driver none while that driver's ResourceSlices list devices on its node: the kubelet,
seeing an empty list, offers 0. Both are watched. Only an answer changes what a node offers: a list
or watch that fails keeps the last answer (before the first one, nothing is offered). The API
server is the DRA tests' fake."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ix_gpu.devicemodel.labels import GPU_ALLOCATION
from ix_gpu.kube.apiserver import ApiServer
from ix_gpu.node.node_config import NodeLabelReader
from ix_gpu.plugin.server.allocation_gate import DevicePluginGate, SliceDevices
from ix_gpu.plugin.server.app import PluginApp
from tests.dra.fake_resource_api import RESOURCE, FakeResourceApi, serving
from tests.plugin.kubelet_fake import FakeKubelet
from tests.plugin.test_plugin_kubelet import plugin_and_kubelet
from tests.support.cli import ix_gpu
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

NODE = "node1"
DRIVER = "gpu.iluvatar.com"


@pytest.fixture
def cluster() -> Iterator[tuple[FakeResourceApi, ApiServer]]:
    fake = FakeResourceApi()
    fake.add_node(NODE)
    fake.add_node("node2")
    with serving(fake) as api:
        yield fake, api


def label(fake: FakeResourceApi, value: str | None) -> None:
    with fake.lock:
        fake.nodes[NODE]["metadata"]["labels"] = {} if value is None else {GPU_ALLOCATION: value}


def dra_slice(fake: FakeResourceApi, node: str, devices: int, driver: str = DRIVER) -> None:
    with fake.lock:
        fake.slices[f"{node}-{driver}"] = {
            "metadata": {"name": f"{node}-{driver}", "resourceVersion": "1"},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "devices": [{"name": f"gpu-{i}"} for i in range(devices)],
            },
        }


@contextlib.asynccontextmanager
async def plugin(
    base: Path, devices_file: Path, api: ApiServer, dra_driver: str | None
) -> AsyncIterator[tuple[PluginApp, FakeKubelet]]:
    reader = NodeLabelReader(api, NODE, backoff=(0.05, 0.2))
    gate = DevicePluginGate(reader, dra_driver, backoff=(0.05, 0.2))
    async with plugin_and_kubelet(base, devices_file, allocation=gate) as running:
        yield running


def advertised(kubelet: FakeKubelet) -> int:
    return len(kubelet.last_update().devices)


def test_a_dra_node_gets_an_empty_list_and_its_gpus_back_after_relabel(
    short_tmp: Path, fake_devices: Path, cluster: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = cluster
    label(fake, "dra")

    async def scenario() -> None:
        async with plugin(short_tmp, fake_devices, api, None) as (app, kubelet):
            assert advertised(kubelet) == 0
            assert app.allocation_reason is not None and f"{GPU_ALLOCATION}=dra" in app.allocation_reason
            label(fake, None)
            await kubelet.wait_for(lambda: advertised(kubelet) == 2, what="2 boards advertised")
            label(fake, "DRA")  # neither mode (values compare case-sensitively): nothing
            await kubelet.wait_for(lambda: advertised(kubelet) == 0, what="nothing advertised")

    asyncio.run(scenario())


def test_with_dra_driver_it_waits_for_the_dra_slice_to_empty(
    short_tmp: Path, fake_devices: Path, cluster: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = cluster
    dra_slice(fake, NODE, 4)  # just relabelled away from dra: the DRA plugin has not withdrawn yet
    dra_slice(fake, "node2", 4)  # another node's slice is no reason to wait
    dra_slice(fake, NODE, 2, driver="other.example.com")  # nor another driver's

    async def scenario() -> None:
        async with plugin(short_tmp, fake_devices, api, DRIVER) as (app, kubelet):
            assert advertised(kubelet) == 0
            assert "still list 4 devices" in (app.allocation_reason or "")
            dra_slice(fake, NODE, 0)
            await kubelet.wait_for(lambda: advertised(kubelet) == 2, what="2 boards advertised")

    asyncio.run(scenario())


def api_errors(app: PluginApp, call: str) -> float:
    return app.metrics.api_errors.labels(call=call).get()


def test_an_apiserver_that_cannot_answer_changes_nothing_a_node_offers(
    short_tmp: Path, fake_devices: Path, cluster: tuple[FakeResourceApi, ApiServer]
) -> None:
    """An apiserver restart that lands on the slice list and the node read: the node keeps offering
    its two boards through many failed reads (retried, counted, in /healthz's detail); when the
    apiserver answers again, an answer that says DRA now holds the chips withdraws them."""
    fake, api = cluster
    slices = f"{RESOURCE}/resourceslices"

    async def scenario() -> None:
        async with plugin(short_tmp, fake_devices, api, DRIVER) as (app, kubelet):
            await kubelet.wait_for(lambda: advertised(kubelet) == 2, what="2 boards advertised")
            seen = len(kubelet.updates)
            watches = fake.count("WATCH", slices)
            fake.denied.update({slices, "/api/v1/nodes"})
            failed = lambda: fake.count("WATCH", slices) >= watches + 5  # noqa: E731
            await kubelet.wait_for(failed, what="5 failed watches")
            assert [len(u.devices) for u in kubelet.updates[seen:]] in ([], [2] * len(kubelet.updates[seen:]))
            assert advertised(kubelet) == 2
            assert api_errors(app, "slice_list") >= 5 and api_errors(app, "node_read") >= 1
            notes = "\n".join(app.notes())
            assert f"cannot watch the ResourceSlices of {DRIVER}" in notes and "403" in notes, notes
            assert f"cannot watch node {NODE}" in notes, notes
            assert app.problems() == [], "an apiserver outage is no reason for the liveness probe to fail"
            fake.denied.clear()
            dra_slice(fake, NODE, 4)  # the answer: the DRA plugin publishes this node's chips now
            await kubelet.wait_for(lambda: advertised(kubelet) == 0, what="nothing advertised")
            # Each watch recovers on its own retry: the node's may come back a moment after the slices'.
            await kubelet.wait_for(lambda: app.notes() == [], what="no failing watch left in /healthz")

    asyncio.run(scenario())


def test_before_the_first_answer_nothing_is_offered(
    short_tmp: Path, fake_devices: Path, cluster: tuple[FakeResourceApi, ApiServer]
) -> None:
    """With a DRA driver in the cluster, chips are offered only once the slices were listed: the
    DRA plugin may be publishing them, and both would hand out the same chip."""
    fake, api = cluster
    fake.denied.add(f"{RESOURCE}/resourceslices")

    async def scenario() -> None:
        async with plugin(short_tmp, fake_devices, api, DRIVER) as (app, kubelet):
            assert advertised(kubelet) == 0
            assert "cannot list the ResourceSlices" in (app.allocation_reason or "")
            fake.denied.clear()
            await kubelet.wait_for(lambda: advertised(kubelet) == 2, what="2 boards advertised")

    asyncio.run(scenario())


def test_slices_are_watched_by_node_and_driver_and_a_cluster_without_dra_has_none(
    cluster: tuple[FakeResourceApi, ApiServer],
) -> None:
    fake, api = cluster
    dra_slice(fake, NODE, 3)
    dra_slice(fake, "node2", 4)
    fake.absent.add(f"{RESOURCE}/resourceslices")
    mine = SliceDevices(api, NODE, DRIVER, backoff=(0.05, 0.2), recheck=0.1)
    mine.start()
    try:
        assert mine.wait_synced(5) and mine.count() == 0, "resource.k8s.io/v1 not served: no slices"
        fake.absent.clear()
        wait_until(lambda: mine.count() == 3, "the slices, once the API is served")
        dra_slice(fake, NODE, 1)
        wait_until(lambda: mine.count() == 1, "a change, from the watch")
        lists = fake.count("GET", f"{RESOURCE}/resourceslices")
        time.sleep(1)
        assert fake.count("GET", f"{RESOURCE}/resourceslices") == lists, "no list while the watch runs"
    finally:
        mine.stop()


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["--dra-driver", "gpu.iluvatar.com"],
            {"NODE_NAME": "node1"},
            "--dra-driver needs NODE_NAME and cluster",
        ),
        (["--dra-driver", "Not_A_Name"], {}, "--dra-driver 'Not_A_Name'"),
    ],
)
def test_dra_driver_usage_errors(
    args: list[str], env: dict[str, str], message: str, fake_devices: Path
) -> None:
    result = ix_gpu(
        "plugin", "--backend", "fake", "--fake-devices", str(fake_devices), *args, env=env, check=False
    )
    assert result.returncode == 2 and message in result.stderr
