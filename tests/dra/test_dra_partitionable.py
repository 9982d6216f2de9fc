"""Partitionable boards: each multi-chip board published as the board and its chips, with one counter
set per board, in a pool of a devices slice and a counter slice; and the plain layout where the
apiserver drops the counters. The scheduler's side is proven on a real cluster
(tests/k8s/test_real_nodes_dra.py); here, what the plugin writes and prepares."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import cel
import pytest

from ix_gpu.devicemodel.vendors import ILUVATAR
from ix_gpu.dra.api import dra_v1_pb2 as dra
from ix_gpu.dra.devices import board_uuid, counter_sets, dra_devices, slice_devices
from ix_gpu.dra.slices import MAX_COUNTER_SLICES, SlicePublisher
from ix_gpu.kube.apiserver import ApiServer
from ix_gpu.node.backends.base import Chip
from tests.dra.dra_testkit import DRIVER, NODE, claim, dra_client, result, running, settings
from tests.dra.fake_resource_api import RESOURCE, FakeResourceApi
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.timeout(60)

SLICE = f"{NODE}-{DRIVER}"
COUNTERS = f"{SLICE}-counters-0"
UID = "5a6b7c8d-0000-4000-8000-00000000000a"


def _chip(index: int, board: str, chips_on_board: int = 2) -> Chip:
    return Chip(
        index=index,
        uuid=f"GPU-{index:04d}",
        product="Iluvatar BI-V150" if chips_on_board == 2 else "Iluvatar BI-V100",
        memory_mib=32768,
        numa_node=0,
        minor=index,
        board_id=board,
        board_position=index % chips_on_board,
    )


def test_each_multi_chip_board_is_the_board_and_its_chips_consuming_one_counter_set() -> None:
    chips = [_chip(0, "b0"), _chip(1, "b0"), _chip(2, "b1", 1)]
    for splitboard in (True, False):
        devices = dra_devices(chips, splitboard=splitboard, partitionable=True)
        assert [(d.name, d.whole_board, d.default_form) for d in devices] == [
            ("board-0", True, not splitboard),
            ("gpu-0", False, splitboard),
            ("gpu-1", False, splitboard),
            ("gpu-2", True, True),  # a one-chip board is one device, of either form
        ]
        entries = {e["name"]: e for e in slice_devices(devices, ILUVATAR, DRIVER)}
        assert entries["board-0"]["consumesCounters"] == [
            {"counterSet": "board-0", "counters": {"gpu-0": {"value": "1"}, "gpu-1": {"value": "1"}}}
        ]
        assert entries["gpu-1"]["consumesCounters"] == [
            {"counterSet": "board-0", "counters": {"gpu-1": {"value": "1"}}}
        ]
        assert "consumesCounters" not in entries["gpu-2"]
        assert entries["board-0"]["capacity"] == {"memory": {"value": "65536Mi"}}
        assert entries["gpu-0"]["attributes"]["chips"] == {"int": 1}
        assert entries["gpu-0"]["attributes"]["wholeBoard"] == {"bool": False}
        assert entries["gpu-2"]["attributes"]["wholeBoard"] == {"bool": True}
        # One set per multi-chip board, a counter of 1 per chip: the board and either chip (or one
        # chip twice) need 2 of a counter that has 1.
        assert counter_sets(devices) == [
            {"name": "board-0", "counters": {"gpu-0": {"value": "1"}, "gpu-1": {"value": "1"}}}
        ]
    plain = dra_devices(chips, splitboard=True)
    assert [(d.name, d.whole_board, d.default_form) for d in plain] == [
        ("gpu-0", False, True),
        ("gpu-1", False, True),
        ("gpu-2", True, True),
    ]
    assert counter_sets(plain) == []


def _cel_input(entry: dict[str, Any]) -> dict[str, Any]:
    """A slice entry as a CEL selector sees it: attributes grouped by domain, the driver's for the
    names without one."""
    grouped: dict[str, dict[str, Any]] = {}
    for name, value in entry["attributes"].items():
        domain, _, short = name.rpartition("/")
        grouped.setdefault(domain or DRIVER, {})[short] = next(iter(value.values()))
    return {"device": {"driver": DRIVER, "attributes": grouped}}


def _selected(expression: str, entries: list[dict[str, Any]]) -> list[str]:
    """The names of the entries ``expression`` selects; a CEL error (an attribute a device lacks)
    fails the test, as it fails the claim's allocation in the scheduler."""
    return [e["name"] for e in entries if cel.evaluate(expression, _cel_input(e)) is True]


@pytest.mark.parametrize("shares", [1, 4])
@pytest.mark.parametrize("splitboard", [True, False])
def test_a_chips_uuid_selects_that_chip_and_never_its_board(splitboard: bool, shares: int) -> None:
    """A board used to carry its first chip's uuid: a claim selecting that chip by uuid through the
    catch-all DeviceClass could be given the whole board, its neighbour chip with it."""
    chips = [_chip(0, "b0"), _chip(1, "b0"), _chip(2, "b1", 1), _chip(4, "b2"), _chip(5, "b2")]
    devices = dra_devices(chips, splitboard=splitboard, partitionable=True, shares=shares)
    entries = slice_devices(devices, ILUVATAR, DRIVER)
    uuid = f'device.attributes["{DRIVER}"].uuid'
    for chip in chips:
        holders = [e for e in entries if e["attributes"]["uuid"] == {"string": chip.uuid}]
        assert [(e["name"], e["attributes"]["chips"]) for e in holders] == [(f"gpu-{chip.index}", {"int": 1})]
        assert _selected(f'{uuid} == "{chip.uuid}"', entries) == [f"gpu-{chip.index}"]
    boards = {e["name"]: e["attributes"]["uuid"]["string"] for e in entries if e["name"].startswith("board-")}
    assert boards == {"board-0": "board-GPU-0000", "board-4": "board-GPU-0004"}
    assert _selected(f'{uuid} == "board-GPU-0004"', entries) == ["board-4"]  # a board is selectable too
    uuids = [e["attributes"]["uuid"]["string"] for e in entries]
    assert len(set(uuids)) == len(uuids)
    # A board's chips are found by its board identifier, which they share.
    board = f'device.attributes["{DRIVER}"].board == "b2"'
    assert _selected(f'{board} && device.attributes["{DRIVER}"].chips == 1', entries) == ["gpu-4", "gpu-5"]


def test_a_plain_whole_board_carries_its_own_uuid_and_no_chips() -> None:
    """Without partitions and with ``splitboard: false`` no chip is published: a chip's uuid
    selects nothing rather than the board (which is also what the device plugin's board is)."""
    chips = [_chip(0, "b0"), _chip(1, "b0"), _chip(2, "b1", 1)]
    devices = dra_devices(chips, splitboard=False)
    entries = slice_devices(devices, ILUVATAR, DRIVER)
    assert {e["name"]: e["attributes"]["uuid"]["string"] for e in entries} == {
        "board-0": board_uuid(devices[0].physical),
        "board-2": "GPU-0002",  # a one-chip board is that chip
    }
    assert devices[0].physical.id == "GPU-0000"  # the device plugin's name for the board is unchanged
    assert _selected(f'device.attributes["{DRIVER}"].uuid == "GPU-0000"', entries) == []


def test_the_pool_is_a_devices_slice_and_a_counter_slice_of_one_generation(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    config = settings(short_tmp, partitionable=True)

    def generations() -> set[int]:
        return {fake.slices[n]["spec"]["pool"]["generation"] for n in (SLICE, COUNTERS) if n in fake.slices}

    async def publish_then_fail_a_chip() -> None:
        async with running(config, fake_devices, api):
            await wait_until_async(lambda: SLICE in fake.slices and COUNTERS in fake.slices, "the pool")
            await asyncio.sleep(0.5)  # a few health rounds: nothing changed, nothing written
            assert (fake.count("POST"), fake.count("PUT")) == (2, 0)
            assert generations() == {1}
            text = fake_devices.read_text()
            fake_devices.write_text(text.replace("health: 0", "health: 4", 1))  # chip 0 over temperature
            await wait_until_async(lambda: generations() == {2}, "both slices at generation 2", timeout=15)

    asyncio.run(publish_then_fail_a_chip())
    devices = fake.slices[SLICE]["spec"]
    counters = fake.slices[COUNTERS]["spec"]
    for spec in (devices, counters):
        assert spec["pool"] == {"name": NODE, "generation": 2, "resourceSliceCount": 2}
        assert spec["nodeName"] == NODE and spec["driver"] == DRIVER
    assert "devices" not in counters and "sharedCounters" not in devices
    assert [c["name"] for c in counters["sharedCounters"]] == ["board-0", "board-2"]
    assert [d["name"] for d in devices["devices"]] == [
        "board-0",
        "gpu-0",
        "gpu-1",
        "board-2",
        "gpu-2",
        "gpu-3",
    ]
    # Chip 0's failure taints it and its board, not its sibling.
    tainted = [d["name"] for d in devices["devices"] if d.get("taints")]
    assert tainted == ["board-0", "gpu-0"]
    assert fake.slices[COUNTERS]["metadata"]["ownerReferences"][0]["kind"] == "Node"

    # A restart finds both slices as they should be and writes nothing.
    before = (fake.count("POST"), fake.count("PUT"))

    async def restart() -> None:
        async with running(config, fake_devices, api) as app:
            await wait_until_async(lambda: app.publisher.published is not None, "the pool read back")
            await asyncio.sleep(0.3)

    asyncio.run(restart())
    assert (fake.count("POST"), fake.count("PUT")) == before


def test_a_board_claim_gets_both_chips_and_a_chip_claim_one(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    fake.add_claim("default", "board", UID, [result("board-2")])
    fake.add_claim("default", "chip", "uid-chip", [result("gpu-1")])
    config = settings(short_tmp, partitionable=True)

    async def scenario() -> dra.NodePrepareResourcesResponse:
        async with running(config, fake_devices, api), dra_client(config) as client:
            request = dra.NodePrepareResourcesRequest(claims=[claim(UID, "board"), claim("uid-chip", "chip")])
            return await client.NodePrepareResources(request)

    answer = asyncio.run(scenario())
    assert answer.claims[UID].error == "" and answer.claims["uid-chip"].error == ""
    board = json.loads((short_tmp / "cdi" / f"iluvatar.com-gpu-claim-{UID}.json").read_text())
    assert board["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/iluvatar2"},
        {"path": "/dev/iluvatar3"},
    ]
    chip = json.loads((short_tmp / "cdi" / "iluvatar.com-gpu-claim-uid-chip.json").read_text())
    assert chip["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/iluvatar1"}]


@pytest.mark.parametrize(
    ("splitboard", "names"), [(True, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]), (False, ["board-0", "board-2"])]
)
def test_counters_the_apiserver_drops_bring_the_plain_layout_said_once(
    short_tmp: Path,
    fake_devices: Path,
    resource_api: tuple[FakeResourceApi, ApiServer],
    caplog: pytest.LogCaptureFixture,
    splitboard: bool,
    names: list[str],
) -> None:
    """As a Kubernetes 1.35 apiserver, whose DRAPartitionableDevices is off, does: the pool shrinks
    to the one devices slice, the counter slice is deleted, and the log says why once."""
    fake, api = resource_api
    fake.drop_counters = True
    config = settings(short_tmp, splitboard=splitboard, partitionable=True)

    async def scenario() -> None:
        async with running(config, fake_devices, api) as app:
            await wait_until_async(lambda: not app.partitionable and SLICE in fake.slices, "the fallback")
            await wait_until_async(lambda: COUNTERS not in fake.slices, "the counter slice deleted")
            await asyncio.sleep(0.5)

    with caplog.at_level(logging.WARNING, logger="ix_gpu.dra.app"):
        asyncio.run(scenario())
    spec = fake.slices[SLICE]["spec"]
    assert [d["name"] for d in spec["devices"]] == names
    assert spec["pool"]["resourceSliceCount"] == 1
    assert all("consumesCounters" not in d for d in spec["devices"])
    said = [r.getMessage() for r in caplog.records if "shared counters" in r.getMessage()]
    assert len(said) == 1 and "DRAPartitionableDevices" in said[0], said
    assert fake.count("DELETE") == 1


def test_a_stored_pool_claiming_a_huge_slice_count_costs_a_bounded_number_of_reads(
    resource_api: tuple[FakeResourceApi, ApiServer],
) -> None:
    """Someone with write access stores ``resourceSliceCount: 10**9`` in this node's slice: the
    plugin looks for at most MAX_COUNTER_SLICES counter slices, then rewrites the pool."""
    fake, api = resource_api
    chips = [_chip(0, "b0"), _chip(1, "b0")]
    devices = dra_devices(chips, splitboard=True, partitionable=True)
    forged = SlicePublisher(api, driver=DRIVER, node=NODE).body([], 7, count=10**9)
    fake.slices[SLICE] = {**forged, "metadata": {**forged["metadata"], "resourceVersion": "1"}}
    publisher = SlicePublisher(api, driver=DRIVER, node=NODE)
    assert publisher.publish(slice_devices(devices, ILUVATAR, DRIVER), counter_sets(devices))
    assert fake.count("GET", f"{RESOURCE}/resourceslices/{SLICE}-counters-") <= MAX_COUNTER_SLICES
    assert fake.slices[SLICE]["spec"]["pool"] == {"name": NODE, "generation": 8, "resourceSliceCount": 2}
