"""Hostile and malformed kubelet requests: bounded messages, bounded work, and
GetPreferredAllocation answers that obey the protocol whatever the request holds.

Two layers: the pure rules in :mod:`ix_gpu.plugin.offer.allocation`, and the real
:class:`~ix_gpu.plugin.server.servicer.DevicePluginServicer` behind a real gRPC server on a unix
socket, because the 1 MB-ID failure only shows on the wire (status details travel in HTTP/2 headers,
and an oversized one turns INVALID_ARGUMENT into RESOURCE_EXHAUSTED at the client).

The gRPC harness here is self-contained (no fake kubelet, no shared helpers): these tests call the
servicer directly, as the kubelet does after registration, and must not break when the helper
modules under ``tests/`` move.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import grpc
import pytest
from grpclib.server import Server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ix_gpu.plugin.offer.allocation as allocation
from ix_gpu.config.plugin_config import parse_plugin_config
from ix_gpu.config.plugin_runtime import ReplicaPolicy, RuntimeConfig
from ix_gpu.devicemodel.vendors import ILUVATAR
from ix_gpu.node.devices.device_list import Device, DeviceList, build_device_list
from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2 as pb
from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from ix_gpu.plugin.offer.allocation import AllocationError, allocate_container, preferred_allocation
from ix_gpu.plugin.offer.device_state import DeviceState, Snapshot
from ix_gpu.plugin.server.metrics import PluginMetrics
from ix_gpu.plugin.server.servicer import DevicePluginServicer
from tests.support.chips import chips

pytestmark = pytest.mark.timeout(60)

MEGABYTE_ID = "GPU-" + "A" * (1024 * 1024)
SHORT = 512
"""Longest error message accepted: a human reads it in ``kubectl describe pod``."""
FAST = 5.0
"""Seconds a hostile request may take. Generous for slow CI: the fixed code needs well under 0.5 s,
the quadratic code it replaces needed minutes for the same inputs."""


CONFIG = parse_plugin_config({}).runtime()
WHOLE = build_device_list(chips(4), splitboard=True, replicas=1)  # C0..C7, boards of two


def allocate(ids: Sequence[str], devices: DeviceList = WHOLE, config: RuntimeConfig = CONFIG) -> Any:
    return allocate_container(ids, devices, vendor=ILUVATAR, control_nodes=("/dev/itrctl",), config=config)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


# --- Allocate: error messages and work are bounded ----------------------------------------------


def test_unknown_megabyte_id_is_echoed_truncated() -> None:
    with pytest.raises(AllocationError) as info:
        allocate([MEGABYTE_ID])
    message = str(info.value)
    assert len(message) < SHORT, message[:200]
    assert "'GPU-" + "A" * 60 + "'..." in message  # the first 64 characters, then an ellipsis
    assert f"({len(MEGABYTE_ID) - 64} more characters)" in message
    assert "not among the 8 devices" in message


def test_short_unknown_id_is_echoed_whole() -> None:
    with pytest.raises(AllocationError, match=r"unknown device ID 'GPU-nope': not among the 8 devices"):
        allocate(["GPU-nope"])


def test_hundred_thousand_unknown_ids_are_fast_and_short() -> None:
    ids = [f"x{i}" for i in range(100_000)]
    started = time.perf_counter()
    with pytest.raises(AllocationError) as info:
        allocate(ids)
    assert time.perf_counter() - started < FAST
    assert len(str(info.value)) < SHORT
    assert "unknown device ID 'x0' (and 99999 more)" in str(info.value)


def test_hundred_thousand_repeats_of_a_known_id_give_it_once() -> None:
    """A repeated ID is the same device: the container gets it once, and the replica list stays the
    size of the device list instead of growing with the request (100,000 repeats made a 1.5 MB env)."""
    shared = build_device_list(chips(1), splitboard=False, replicas=4)
    result, seconds = timed(lambda: allocate(["C0::1"] * 100_000 + ["C0::2"], shared))
    assert seconds < FAST
    assert result.envs == {"IX_VISIBLE_DEVICES": "C0,C1", "IX_REPLICA_DEVICES": "C0::1,C0::2"}
    assert [n.host_path for n in result.device_nodes] == ["/dev/iluvatar0", "/dev/iluvatar1", "/dev/itrctl"]


def test_echo_bounds_every_kind_of_string() -> None:
    assert allocation.echo("abc") == "'abc'"
    assert allocation.echo("a" * 64) == repr("a" * 64)
    assert allocation.echo("a" * 65) == repr("a" * 64) + "... (1 more character)"
    # Non-printable characters are escaped, so a hostile ID cannot forge log lines.
    assert allocation.echo("a\nb") == "'a\\nb'"
    assert len(allocation.echo("\U000e0001" * 10_000)) < 1000
    assert allocation.clip("x" * 100, 10) == "xxxxxxxxxx... (90 more characters)"
    assert allocation.clip("short", 10) == "short"


# --- GetPreferredAllocation: the answer obeys the protocol ----------------------------------------


def test_must_include_that_is_not_available_is_dropped() -> None:
    got = preferred_allocation(WHOLE, ["C0", "C1"], ["C5"], 1, ReplicaPolicy.SPREAD)
    assert got in (["C0"], ["C1"])


def test_unknown_must_include_is_dropped() -> None:
    got = preferred_allocation(WHOLE, ["C0", "C1", "ghost"], ["ghost", "C1"], 2, ReplicaPolicy.SPREAD)
    assert got == ["C1", "C0"]


def test_size_one_with_three_must_include_returns_one() -> None:
    got = preferred_allocation(WHOLE, WHOLE.ids, ["C4", "C2", "C6"], 1, ReplicaPolicy.SPREAD)
    assert got == ["C4"]


def test_nonpositive_size_returns_nothing() -> None:
    assert preferred_allocation(WHOLE, WHOLE.ids, ["C1"], 0, ReplicaPolicy.SPREAD) == []
    assert preferred_allocation(WHOLE, WHOLE.ids, ["C1"], -5, ReplicaPolicy.SPREAD) == []


def test_available_ids_not_advertised_are_never_returned() -> None:
    assert preferred_allocation(WHOLE, ["ghost", "C3", "C3"], [], 5, ReplicaPolicy.SPREAD) == ["C3"]


@pytest.mark.timeout(30)
def test_hostile_sizes_and_lists_are_fast() -> None:
    noise = [f"x{i}" for i in range(400_000)]  # about what fits gRPC's 4 MB request limit
    got, seconds = timed(
        lambda: preferred_allocation(
            WHOLE, [*noise, *WHOLE.ids, *WHOLE.ids], noise, 10**9, ReplicaPolicy.SPREAD
        )
    )
    assert seconds < FAST
    assert sorted(got) == sorted(WHOLE.ids)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("policy", list(ReplicaPolicy))
def test_thousands_of_replicas_are_picked_in_linear_time(policy: ReplicaPolicy) -> None:
    """A pod may ask for thousands of time-sliced replicas (the size is the user's request). Picking
    them must cost (size x GPUs) score evaluations, not (size x replicas)."""
    shared = build_device_list(chips(4), splitboard=True, replicas=2000)  # 16,000 devices
    got, seconds = timed(lambda: preferred_allocation(shared, shared.ids, [], 12_000, policy))
    assert seconds < FAST
    assert len(got) == len(set(got)) == 12_000
    per_gpu = Counter(i.split("::")[0] for i in got)
    if policy is ReplicaPolicy.SPREAD:
        assert set(per_gpu.values()) == {1500}
    else:
        assert list(per_gpu.values()) == [2000] * 6  # whole GPUs filled, two left untouched


def test_fallback_obeys_the_same_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> list[str]:
        raise RuntimeError("bug")

    monkeypatch.setattr(allocation, "_preferred", broken)
    assert preferred_allocation(WHOLE, ["C0", "C1"], ["C5", "C1", "C0"], 1, ReplicaPolicy.SPREAD) == ["C1"]
    assert preferred_allocation(WHOLE, ["C0", "ghost", "C1"], [], 10**9, ReplicaPolicy.SPREAD) == ["C0", "C1"]
    assert preferred_allocation(WHOLE, ["C0"], [], 0, ReplicaPolicy.SPREAD) == []


def test_a_broken_fallback_still_does_not_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> list[str]:
        raise RuntimeError("bug")

    monkeypatch.setattr(allocation, "_preferred", broken)
    monkeypatch.setattr(allocation, "_first_available", broken)
    assert preferred_allocation(WHOLE, ["C0"], [], 1, ReplicaPolicy.SPREAD) == []


# --- The property: any request, both code paths --------------------------------------------------


@st.composite
def requests(draw: st.DrawFn) -> tuple[DeviceList, list[str], list[str], int, ReplicaPolicy]:
    boards = draw(st.integers(0, 4))
    per_board = draw(st.integers(1, 3))
    numa = draw(st.lists(st.sampled_from([0, 1, 2, None]), min_size=1, max_size=4))
    devices = build_device_list(
        chips(boards, per_board, numa), splitboard=draw(st.booleans()), replicas=draw(st.integers(1, 4))
    )
    known = list(devices.ids)
    names = (
        st.sampled_from([*known, "ghost", "C99", "C0::9", ""]) if known else st.sampled_from(["ghost", ""])
    )
    available = draw(st.lists(names, max_size=30))
    must_include = draw(st.lists(names, max_size=8))
    size = draw(st.one_of(st.integers(-2, 30), st.just(10**9)))
    return devices, available, must_include, size, draw(st.sampled_from(list(ReplicaPolicy)))


def check_answer(
    got: list[str], devices: DeviceList, available: list[str], must_include: list[str], size: int
) -> None:
    usable = [i for i in dict.fromkeys(available) if i in devices.by_id]
    first = [i for i in dict.fromkeys(must_include) if i in set(usable)][: max(size, 0)]
    assert len(got) == len(set(got)), got
    assert set(got) <= set(usable), got
    assert len(got) == max(0, min(size, len(usable))), got
    assert got[: len(first)] == first, got


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_property_answer_obeys_the_protocol(
    request: tuple[DeviceList, list[str], list[str], int, ReplicaPolicy],
) -> None:
    devices, available, must_include, size, policy = request
    check_answer(
        preferred_allocation(devices, available, must_include, size, policy),
        devices,
        available,
        must_include,
        size,
    )
    with (
        mock.patch.object(allocation, "_preferred", side_effect=RuntimeError("bug")),
        mock.patch.object(allocation.log, "exception"),
    ):
        fallback = preferred_allocation(devices, available, must_include, size, policy)
    check_answer(fallback, devices, available, must_include, size)


def _reference_pick_replicas(
    pool: list[Device], chosen: list[Device], need: int, policy: ReplicaPolicy
) -> list[Device]:
    """The replica picker as it was before it was made linear, kept to prove the choices are equal."""
    order = {d.id: n for n, d in enumerate(pool)}
    in_request = Counter(d.physical.id for d in chosen)
    free = Counter(d.physical.id for d in pool)
    boards = {d.physical.board_id for d in chosen}
    remaining = list(pool)
    picked: list[Device] = []
    while len(picked) < need and remaining:

        def score(d: Device) -> tuple[int, ...]:
            parent = d.physical.id
            near = 0 if (not boards or d.physical.board_id in boards) else 1
            if policy is ReplicaPolicy.PACK:
                return (-in_request[parent], free[parent], near, order[d.id])
            return (in_request[parent], -free[parent], near, order[d.id])

        best = min(remaining, key=score)
        remaining.remove(best)
        picked.append(best)
        in_request[best.physical.id] += 1
        free[best.physical.id] -= 1
        boards.add(best.physical.board_id)
    return picked


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_property_linear_replica_picker_chooses_as_before(data: st.DataObject) -> None:
    devices = build_device_list(
        chips(data.draw(st.integers(1, 4)), data.draw(st.integers(1, 2)), (0, 1)),
        splitboard=data.draw(st.booleans()),
        replicas=data.draw(st.integers(2, 5)),
    )
    every = list(devices.devices)
    pool = data.draw(st.permutations(every))
    split = data.draw(st.integers(0, len(pool)))
    chosen, pool = pool[:split], pool[split:]
    pool = data.draw(st.lists(st.sampled_from(pool), unique_by=lambda d: d.id)) if pool else []
    need = data.draw(st.integers(0, len(every) + 2))
    policy = data.draw(st.sampled_from(list(ReplicaPolicy)))
    assert allocation._pick_replicas(pool, chosen, need, policy) == _reference_pick_replicas(
        pool, chosen, need, policy
    )


def _reference_preferred(
    devices: DeviceList, available: list[str], must_include: list[str], size: int, policy: ReplicaPolicy
) -> list[str]:
    """``_preferred`` as it was, correct for the requests the kubelet sends (below)."""
    chosen_ids = list(dict.fromkeys(must_include))
    need = size - len(chosen_ids)
    if need <= 0:
        return chosen_ids
    chosen = [devices.by_id[i] for i in chosen_ids if i in devices.by_id]
    taken = set(chosen_ids)
    pool = [devices.by_id[i] for i in dict.fromkeys(available) if i in devices.by_id and i not in taken]
    picker = _reference_pick_replicas if devices.shared else allocation._pick_topology
    return chosen_ids + [d.id for d in picker(pool, chosen, need, policy)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(), st.data())
def test_property_kubelet_shaped_requests_are_answered_as_before(
    request: tuple[DeviceList, list[str], list[str], int, ReplicaPolicy], data: st.DataObject
) -> None:
    """The kubelet's requests (mustInclude among the available, no more of them than the size)
    get the same answer as before the rules were tightened: topology and replica preferences kept."""
    devices, available, _, _, policy = request
    usable = [i for i in dict.fromkeys(available) if i in devices.by_id]
    size = data.draw(st.integers(1, len(usable) + 2))
    must_include = data.draw(st.lists(st.sampled_from(usable), unique=True, max_size=size)) if usable else []
    assert preferred_allocation(devices, usable, must_include, size, policy) == _reference_preferred(
        devices, usable, must_include, size, policy
    )


# --- Over gRPC: the real servicer on a unix socket ------------------------------------------------


def run(coro_fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(coro_fn())


@contextlib.asynccontextmanager
async def serving(
    devices: DeviceList, config: RuntimeConfig = CONFIG
) -> AsyncIterator[tuple[Any, PluginMetrics]]:
    """The plugin's servicer behind the plugin's gRPC server (grpclib) on a unix socket, and a
    default-options grpcio client stub (the same limits a Go kubelet client has for status details:
    a few KiB of headers)."""
    directory = Path(tempfile.mkdtemp(prefix="ixadv", dir="/tmp"))  # unix socket paths are short
    metrics = PluginMetrics()
    snapshot = Snapshot(
        devices=devices, unhealthy={}, config=config, vendor=ILUVATAR, control_nodes=("/dev/itrctl",)
    )
    server = Server([DevicePluginServicer(DeviceState(snapshot), metrics)])
    await server.start(path=str(directory / "plugin.sock"))
    channel = grpc.aio.insecure_channel(f"unix://{directory / 'plugin.sock'}")
    try:
        yield pb_grpc.DevicePluginStub(channel), metrics  # type: ignore[no-untyped-call]
    finally:
        await channel.close()
        server.close()
        await server.wait_closed()
        shutil.rmtree(directory, ignore_errors=True)


def allocate_request(*containers: Sequence[str]) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=list(c)) for c in containers]
    )


def test_megabyte_id_allocate_is_invalid_argument_with_a_short_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with serving(WHOLE) as (plugin, metrics):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await plugin.Allocate(allocate_request([MEGABYTE_ID]), timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.code()
            details = info.value.details() or ""
            assert len(details) < SHORT
            assert details.startswith("unknown device ID 'GPU-AAAA")
            assert "more characters" in details
            assert metrics.allocations.labels(result="error").get() == 1
            # The plugin still serves after the hostile call.
            (ok,) = (await plugin.Allocate(allocate_request(["C3"]), timeout=2)).container_responses
            assert ok.envs["IX_VISIBLE_DEVICES"] == "C3"

    with caplog.at_level(logging.WARNING, logger="ix_gpu.plugin.server.servicer"):
        run(scenario)
    (record,) = [r for r in caplog.records if "Allocate rejected" in r.getMessage()]
    assert len(record.getMessage()) < SHORT + 100


def test_hundred_thousand_ids_over_grpc_are_rejected_fast() -> None:
    async def scenario() -> None:
        async with serving(WHOLE) as (plugin, _):
            started = time.perf_counter()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await plugin.Allocate(allocate_request([f"x{i}" for i in range(100_000)]), timeout=10)
            assert time.perf_counter() - started < FAST
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "(and 99999 more)" in (info.value.details() or "")

    run(scenario)


def test_one_container_per_device_is_the_most_a_request_may_name() -> None:
    allocation.check_container_count(len(WHOLE.ids), WHOLE)
    # With nothing advertised one container still passes, to get the clearer unknown-ID message.
    allocation.check_container_count(1, build_device_list([], splitboard=False, replicas=1))
    with pytest.raises(AllocationError, match=r"^9 containers in one request, but this plugin advertises 8"):
        allocation.check_container_count(len(WHOLE.ids) + 1, WHOLE)


def test_huge_container_lists_are_rejected_fast(caplog: pytest.LogCaptureFixture) -> None:
    """A 2.4 MB request can name 300,000 containers; answering each took about 16 s in all."""
    huge = 300_000
    # Concatenated messages parse as one with the repeated fields appended: the fast way to build
    # what a hostile client would put on the wire.
    hostile_allocate = pb.AllocateRequest.FromString(allocate_request(["C1"]).SerializeToString() * huge)
    one_preferred = pb.ContainerPreferredAllocationRequest(available_deviceIDs=["C1"], allocation_size=1)
    hostile_preferred = pb.PreferredAllocationRequest.FromString(
        pb.PreferredAllocationRequest(container_requests=[one_preferred]).SerializeToString() * huge
    )
    assert len(hostile_allocate.container_requests) == len(hostile_preferred.container_requests) == huge

    async def scenario() -> None:
        async with serving(WHOLE) as (plugin, metrics):
            # As many containers as devices is still answered (a pod of eight one-GPU containers).
            response = await plugin.Allocate(allocate_request(*[[i] for i in WHOLE.ids]), timeout=10)
            assert [c.envs["IX_VISIBLE_DEVICES"] for c in response.container_responses] == list(WHOLE.ids)
            for call, request in (
                (plugin.Allocate, hostile_allocate),
                (plugin.GetPreferredAllocation, hostile_preferred),
            ):
                started = time.perf_counter()
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call(request, timeout=30)
                assert time.perf_counter() - started < FAST
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert (info.value.details() or "").startswith(f"{huge} containers in one request")
            assert metrics.allocations.labels(result="error").get() == 1

    with caplog.at_level(logging.WARNING, logger="ix_gpu.plugin.server.servicer"):
        run(scenario)
    assert [r.getMessage().split(":")[0] for r in caplog.records if "rejected" in r.getMessage()] == [
        "Allocate rejected",
        "GetPreferredAllocation rejected",
    ]


def test_preferred_allocation_over_grpc_obeys_the_protocol() -> None:
    async def scenario() -> None:
        async with serving(WHOLE) as (plugin, _):
            request = pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=["C0", "C1", "C2"],
                        must_include_deviceIDs=[MEGABYTE_ID, "C7", "C2", "C0", "C1"],
                        allocation_size=1,
                    ),
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=["C4", "C5", MEGABYTE_ID], allocation_size=2_000_000_000
                    ),
                ]
            )
            first, second = (await plugin.GetPreferredAllocation(request, timeout=10)).container_responses
            assert list(first.deviceIDs) == ["C2"]
            assert list(second.deviceIDs) == ["C4", "C5"]

    run(scenario)
