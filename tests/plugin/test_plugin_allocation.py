"""Allocate and GetPreferredAllocation rules, without gRPC."""

from __future__ import annotations

import pytest

from ix_gpu.config.plugin_config import parse_plugin_config
from ix_gpu.config.plugin_runtime import ReplicaPolicy
from ix_gpu.devicemodel.vendors import ILUVATAR, NVIDIA
from ix_gpu.node.devices.device_list import DeviceList, build_device_list
from ix_gpu.plugin.offer.allocation import AllocationError, allocate_container, preferred_allocation
from tests.support.chips import chips


def ids(devices: DeviceList) -> list[str]:
    return list(devices.ids)


def test_prefers_a_whole_board_and_best_fit() -> None:
    devices = build_device_list(chips(4), splitboard=True, replicas=1)
    # Board b0 is half used (C0 gone): a 1-chip request should fill its hole, not break b1.
    available = ["C1", "C2", "C3", "C4", "C5", "C6", "C7"]
    assert preferred_allocation(devices, available, [], 1, ReplicaPolicy.SPREAD) == ["C1"]
    assert sorted(preferred_allocation(devices, available, [], 2, ReplicaPolicy.SPREAD)) == ["C2", "C3"]


def test_stays_on_the_numa_node_of_must_include() -> None:
    devices = build_device_list(chips(4), splitboard=True, replicas=1)
    got = preferred_allocation(devices, ids(devices), ["C4"], 3, ReplicaPolicy.SPREAD)
    assert got[0] == "C4"
    assert got[1] == "C5"  # same board first
    assert got[2] in {"C6", "C7"}  # then the same NUMA node (boards 2 and 3 are on node 1)


def test_exhausted_pool_returns_what_exists_and_never_raises() -> None:
    devices = build_device_list(chips(1), splitboard=True, replicas=2)
    # C0::1 is in mustInclude but not available: only available IDs may come back.
    got = preferred_allocation(devices, ["C0::0", "unknown"], ["C0::1"], 4, ReplicaPolicy.SPREAD)
    assert got == ["C0::0"]
    assert preferred_allocation(devices, [], [], 2, ReplicaPolicy.PACK) == []


def test_must_include_larger_than_size_is_cut_to_size() -> None:
    devices = build_device_list(chips(1), splitboard=True, replicas=1)
    # Exactly allocation_size IDs, mustInclude first, never more than the kubelet asked for.
    assert preferred_allocation(devices, ["C0", "C1"], ["C1", "C0"], 1, ReplicaPolicy.SPREAD) == ["C1"]


def test_replicas_spread_across_gpus_or_pack_onto_busy_ones() -> None:
    devices = build_device_list(chips(2), splitboard=False, replicas=4)
    every = ids(devices)
    # GPU C0 already has two replicas taken by other pods; GPU C2 is idle.
    available = [i for i in every if i not in ("C0::0", "C0::1")]
    spread = preferred_allocation(devices, available, [], 2, ReplicaPolicy.SPREAD)
    assert spread[0].startswith("C2::")  # least used GPU first
    assert {i.split("::")[0] for i in spread} == {"C0", "C2"}  # one per GPU before doubling up
    pack = preferred_allocation(devices, available, [], 2, ReplicaPolicy.PACK)
    assert [i.split("::")[0] for i in pack] == ["C0", "C0"]  # keep C2 whole


def test_a_bug_falls_back_instead_of_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    import ix_gpu.plugin.offer.allocation as allocation

    def broken(*args: object) -> list[str]:
        raise RuntimeError("bug")

    monkeypatch.setattr(allocation, "_preferred", broken)
    devices = build_device_list(chips(1), splitboard=True, replicas=1)
    assert preferred_allocation(devices, ["C0", "C1"], ["C1"], 2, ReplicaPolicy.SPREAD) == ["C1", "C0"]


def test_allocate_for_nvidia_uses_its_nodes_and_env() -> None:
    devices = build_device_list(chips(1), splitboard=True, replicas=1)
    result = allocate_container(
        ["C1"],
        devices,
        vendor=NVIDIA,
        control_nodes=("/dev/nvidiactl",),
        config=parse_plugin_config({}).runtime(),
    )
    assert [n.host_path for n in result.device_nodes] == ["/dev/nvidia1", "/dev/nvidiactl"]
    assert result.envs == {"NVIDIA_VISIBLE_DEVICES": "C1"}


def test_allocate_without_control_node_and_error_messages() -> None:
    devices = build_device_list(chips(1), splitboard=False, replicas=1)
    config = parse_plugin_config({}).runtime()
    result = allocate_container(["C0"], devices, vendor=ILUVATAR, control_nodes=(), config=config)
    assert [n.host_path for n in result.device_nodes] == ["/dev/iluvatar0", "/dev/iluvatar1"]
    with pytest.raises(AllocationError, match=r"unknown device ID 'X' \(and 1 more\)"):
        allocate_container(["X", "Y"], devices, vendor=ILUVATAR, control_nodes=(), config=config)
    with pytest.raises(AllocationError, match="no device IDs"):
        allocate_container([], devices, vendor=ILUVATAR, control_nodes=(), config=config)
