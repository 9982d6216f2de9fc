"""Shared devices (``sharing.timeSlicing.replicas`` above 1, DRAConsumableCapacity): each device
published with ``allowMultipleAllocations`` and its memory in equal shares, claims told their share
in their CDI spec, and exclusive devices where the apiserver drops the sharing fields. The
scheduler's side is proven on a real cluster (tests/k8s/test_dra_scheduler_properties.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from ix_gpu.devicemodel.vendors import ILUVATAR
from ix_gpu.dra.api import dra_v1_pb2 as dra
from ix_gpu.dra.devices import counter_sets, dra_devices, slice_devices
from ix_gpu.dra.prepare import MEMORY_SHARE_ENV, memory_mib
from ix_gpu.kube.apiserver import ApiServer
from ix_gpu.node.backends.base import Chip
from tests.dra.dra_testkit import DRIVER, NODE, claim, dra_client, result, running, settings
from tests.dra.fake_resource_api import FakeResourceApi
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.timeout(60)

SLICE = f"{NODE}-{DRIVER}"


def _chips() -> list[Chip]:
    return [Chip(f"GPU-{i}", i, i, f"b{i // 2}", i % 2, "Iluvatar BI-V150", 32768, 0) for i in range(4)]


@pytest.mark.parametrize(("splitboard", "names", "share"), [(True, 4, "8192Mi"), (False, 2, "16384Mi")])
def test_replicas_become_equal_memory_shares_of_the_form_splitboard_picks(
    splitboard: bool, names: int, share: str
) -> None:
    devices = dra_devices(_chips(), splitboard=splitboard, shares=4)
    assert len(devices) == names and counter_sets(devices) == []
    for entry in slice_devices(devices, ILUVATAR, DRIVER):
        assert entry["allowMultipleAllocations"] is True
        memory = entry["capacity"]["memory"]
        whole = "32768Mi" if splitboard else "65536Mi"
        assert memory == {
            "value": whole,
            "requestPolicy": {"default": share, "validRange": {"min": share, "max": whole, "step": share}},
        }
        assert "consumesCounters" not in entry
    plain = slice_devices(dra_devices(_chips(), splitboard=True), ILUVATAR, DRIVER)
    assert all(
        "allowMultipleAllocations" not in e and "requestPolicy" not in e["capacity"]["memory"] for e in plain
    )


@pytest.mark.parametrize("splitboard", [True, False])
def test_partitionable_boards_and_their_chips_are_all_shared_and_keep_their_counters(
    splitboard: bool,
) -> None:
    """Partitions and shares together: every board and every chip is shared, each in N shares of
    its own memory, and each still consumes its board's counters (a board's shares and its chips'
    shares are kept apart by the scheduler, which charges a shared device's counters once:
    tests/k8s/test_dra_scheduler_properties.py proves it on v1.37's)."""
    devices = dra_devices(_chips(), splitboard=splitboard, partitionable=True, shares=4)
    assert [d.name for d in devices] == ["board-0", "gpu-0", "gpu-1", "board-2", "gpu-2", "gpu-3"]
    sets = {s["name"]: set(s["counters"]) for s in counter_sets(devices)}
    assert sets == {"board-0": {"gpu-0", "gpu-1"}, "board-2": {"gpu-2", "gpu-3"}}
    for device, entry in zip(devices, slice_devices(devices, ILUVATAR, DRIVER), strict=True):
        board = entry["name"].startswith("board-")
        whole, share = ("65536Mi", "16384Mi") if board else ("32768Mi", "8192Mi")
        assert entry["allowMultipleAllocations"] is True
        assert entry["capacity"]["memory"] == {
            "value": whole,
            "requestPolicy": {"default": share, "validRange": {"min": share, "max": whole, "step": share}},
        }
        [consumed] = entry["consumesCounters"]
        assert consumed["counterSet"] == device.counter_set
        assert set(consumed["counters"]) == (sets[entry["name"]] if board else {entry["name"]})
        default = entry["attributes"]["defaultForm"]["bool"]
        assert default is (not board if splitboard else board)


def test_two_claims_on_one_shared_chip_each_get_their_share_in_the_env(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    one = {
        **result("gpu-1"),
        "shareID": "6f1c7a52-0000-4000-8000-000000000001",
        "consumedCapacity": {"memory": "8Gi"},
    }
    two = {
        **result("gpu-1"),
        "shareID": "6f1c7a52-0000-4000-8000-000000000002",
        "consumedCapacity": {"memory": "16Gi"},
    }
    fake.add_claim("default", "one", "uid-one", [one])
    fake.add_claim("default", "two", "uid-two", [two])
    fake.add_claim("default", "whole", "uid-whole", [result("gpu-2")])
    config = settings(short_tmp, replicas=4)

    async def scenario() -> dra.NodePrepareResourcesResponse:
        async with running(config, fake_devices, api), dra_client(config) as client:
            await wait_until_async(lambda: SLICE in fake.slices, "the ResourceSlice")
            claims = [claim("uid-one", "one"), claim("uid-two", "two"), claim("uid-whole", "whole")]
            return await client.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=claims))

    answer = asyncio.run(scenario())
    assert {uid: c.error for uid, c in answer.claims.items()} == {
        "uid-one": "",
        "uid-two": "",
        "uid-whole": "",
    }
    assert answer.claims["uid-one"].devices[0].share_id == one["shareID"]
    assert all(d["allowMultipleAllocations"] for d in fake.slices[SLICE]["spec"]["devices"])

    def env(uid: str) -> list[str]:
        spec = json.loads((short_tmp / "cdi" / f"iluvatar.com-gpu-claim-{uid}.json").read_text())
        edits = spec["containerEdits"]["env"]
        assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"].startswith("/dev/iluvatar")
        return [e for e in edits if not e.startswith("IX_VISIBLE_DEVICES=")]

    assert env("uid-one") == [f"{MEMORY_SHARE_ENV}=8192"]
    assert env("uid-two") == [f"{MEMORY_SHARE_ENV}=16384"]
    assert env("uid-whole") == []  # allocated whole: nothing to tell


def test_a_share_of_a_partitionable_board_is_told_per_chip_beside_a_share_of_a_chip(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    """Partitions and shares on one node: the slice has both boards and chips shared, each with
    its counters; a 16 GiB share of a board sees both chips, told 8 GiB of each."""
    fake, api = resource_api
    board = {
        **result("board-0"),
        "shareID": "6f1c7a52-0000-4000-8000-000000000003",
        "consumedCapacity": {"memory": "16Gi"},
    }
    chip = {
        **result("gpu-2"),
        "shareID": "6f1c7a52-0000-4000-8000-000000000004",
        "consumedCapacity": {"memory": "24Gi"},
    }
    fake.add_claim("default", "board", "uid-board", [board])
    fake.add_claim("default", "chip", "uid-chip", [chip])
    config = settings(short_tmp, partitionable=True, replicas=4, partitionable_shares=True)

    async def scenario() -> dra.NodePrepareResourcesResponse:
        async with running(config, fake_devices, api), dra_client(config) as client:
            await wait_until_async(lambda: SLICE in fake.slices, "the ResourceSlice")
            claims = [claim("uid-board", "board"), claim("uid-chip", "chip")]
            return await client.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=claims))

    answer = asyncio.run(scenario())
    assert {uid: c.error for uid, c in answer.claims.items()} == {"uid-board": "", "uid-chip": ""}
    published = fake.slices[SLICE]["spec"]["devices"]
    assert [d["name"] for d in published] == ["board-0", "gpu-0", "gpu-1", "board-2", "gpu-2", "gpu-3"]
    assert all(d["allowMultipleAllocations"] and d["consumesCounters"] for d in published)

    def env(uid: str) -> dict[str, str]:
        spec = json.loads((short_tmp / "cdi" / f"iluvatar.com-gpu-claim-{uid}.json").read_text())
        return dict(e.split("=", 1) for e in spec["containerEdits"]["env"])

    board_env, chip_env = env("uid-board"), env("uid-chip")
    assert len(board_env["IX_VISIBLE_DEVICES"].split(",")) == 2
    assert board_env[MEMORY_SHARE_ENV] == "8192,8192"
    assert len(chip_env["IX_VISIBLE_DEVICES"].split(",")) == 1
    assert chip_env[MEMORY_SHARE_ENV] == "24576"


def test_shares_the_apiserver_drops_make_each_device_exclusive_said_once(
    short_tmp: Path,
    fake_devices: Path,
    resource_api: tuple[FakeResourceApi, ApiServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, api = resource_api
    fake.drop_shares = True
    config = settings(short_tmp, replicas=4)

    async def scenario() -> None:
        async with running(config, fake_devices, api) as app:
            await wait_until_async(lambda: app.shares == 1 and SLICE in fake.slices, "the fallback")
            await asyncio.sleep(0.5)

    with caplog.at_level(logging.WARNING, logger="ix_gpu.dra.app"):
        asyncio.run(scenario())
    devices = fake.slices[SLICE]["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert all(d["capacity"] == {"memory": {"value": "32768Mi"}} for d in devices)
    said = [r.getMessage() for r in caplog.records if "allowMultipleAllocations" in r.getMessage()]
    assert len(said) == 1 and "DRAConsumableCapacity" in said[0], said


@pytest.mark.parametrize(
    ("opt_in", "names"),
    [
        (False, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]),
        (True, ["board-0", "gpu-0", "gpu-1", "board-2", "gpu-2", "gpu-3"]),
    ],
)
def test_a_shared_node_publishes_boards_beside_chips_only_when_asked(
    short_tmp: Path,
    fake_devices: Path,
    resource_api: tuple[FakeResourceApi, ApiServer],
    opt_in: bool,
    names: list[str],
) -> None:
    """``--partitionable auto`` (the default) leaves a shared node's boards unpartitioned: a
    kube-scheduler before 1.37 may give a board's share and its chip's share together.
    ``with-shares`` publishes them."""
    fake, api = resource_api
    config = settings(short_tmp, partitionable=True, replicas=4, partitionable_shares=opt_in)

    async def scenario() -> None:
        async with running(config, fake_devices, api):
            await wait_until_async(lambda: SLICE in fake.slices, "the ResourceSlice")

    asyncio.run(scenario())
    devices = fake.slices[SLICE]["spec"]["devices"]
    assert [d["name"] for d in devices] == names
    assert all(d["allowMultipleAllocations"] for d in devices)
    assert all(bool(d.get("consumesCounters")) is opt_in for d in devices)


@pytest.mark.parametrize(
    ("drop_shares", "drop_counters", "names", "shared", "counted"),
    [
        (True, False, ["board-0", "gpu-0", "gpu-1", "board-2", "gpu-2", "gpu-3"], False, True),
        (False, True, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], True, False),
        (True, True, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], False, False),  # as Kubernetes 1.35
    ],
)
def test_with_partitions_and_shares_each_dropped_feature_falls_back_alone(
    short_tmp: Path,
    fake_devices: Path,
    resource_api: tuple[FakeResourceApi, ApiServer],
    drop_shares: bool,
    drop_counters: bool,
    names: list[str],
    shared: bool,
    counted: bool,
) -> None:
    """A cluster may serve one of the two features and not the other: what it drops goes, what it
    keeps stays."""
    fake, api = resource_api
    fake.drop_shares, fake.drop_counters = drop_shares, drop_counters
    config = settings(short_tmp, partitionable=True, replicas=4, partitionable_shares=True)

    async def scenario() -> None:
        async with running(config, fake_devices, api) as app:
            await wait_until_async(
                lambda: (
                    (app.shares == 1) is drop_shares
                    and app.partitionable is not drop_counters
                    and SLICE in fake.slices
                    and [d["name"] for d in fake.slices[SLICE]["spec"]["devices"]] == names
                ),
                "the fallback",
            )
            await asyncio.sleep(0.5)

    asyncio.run(scenario())
    devices = fake.slices[SLICE]["spec"]["devices"]
    assert [d["name"] for d in devices] == names
    assert all(bool(d.get("allowMultipleAllocations")) is shared for d in devices)
    assert all(bool(d.get("consumesCounters")) is counted for d in devices)


@pytest.mark.parametrize(
    ("quantity", "mib"),
    [
        ("8Gi", 8192),
        ("8192Mi", 8192),
        ("8589934592", 8192),
        ("1000M", 953),
        ("1Ti", 1 << 20),
        ("1.5Gi", None),
        ("8 Gi", None),
    ],
)
def test_memory_quantities_as_the_scheduler_writes_them(quantity: str, mib: int | None) -> None:
    assert memory_mib(quantity) == mib


def test_shares_never_go_below_one_mib_and_unknown_memory_is_not_shared() -> None:
    small = [Chip("GPU-s", 0, 0, "b0", 0, "Iluvatar MR-V100", 3, 0), Chip("GPU-z", 1, 1, "b1", 0, "x", 0, 0)]
    entries = slice_devices(dra_devices(small, splitboard=True, shares=1000), ILUVATAR, DRIVER)
    assert entries[0]["capacity"]["memory"]["requestPolicy"]["default"] == "1Mi"  # 3 shares of 1 MiB
    assert "allowMultipleAllocations" not in entries[1] and entries[1]["capacity"] == {
        "memory": {"value": "0Mi"}
    }
