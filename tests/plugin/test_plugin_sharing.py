"""Time-slicing as configured in either format: which resource is advertised, which devices are
replicated, and failRequestsGreaterThanOne; pure functions first, then the plugin over gRPC."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from ix_gpu.config.plugin_config import parse_plugin_config
from ix_gpu.config.plugin_runtime import RuntimeConfig
from ix_gpu.devicemodel.vendors import ILUVATAR, NVIDIA
from ix_gpu.node.devices.device_list import build_device_list
from ix_gpu.node.devices.sharing import SharingPlan, plan_sharing
from ix_gpu.plugin.offer.allocation import REPLICA_DEVICES_ENV, AllocationError, allocate_container
from tests.plugin.plugin_testkit import FAST_HEALTH
from tests.plugin.test_plugin_kubelet import UUID, allocate, plugin_and_kubelet, run
from tests.support.chips import chips

pytestmark = pytest.mark.timeout(60)

ILUVATAR_GPU = ILUVATAR.resource_name


def plan(doc: dict[str, object], vendor_resource: str = ILUVATAR_GPU) -> SharingPlan:
    return plan_sharing(parse_plugin_config(doc).runtime(), vendor_resource)


def slicing(**fields: object) -> dict[str, object]:
    return {"sharing": {"timeSlicing": fields}}


def nvidia(*entries: dict[str, object], **fields: object) -> dict[str, object]:
    return {"version": "v1", **slicing(resources=list(entries), **fields)}


# --------------------------------------------------------------------------- the plan


@pytest.mark.parametrize(
    ("doc", "resource", "replicas"),
    [
        pytest.param({}, ILUVATAR_GPU, 1, id="defaults"),
        pytest.param(slicing(replicas=4), ILUVATAR_GPU, 4, id="seed-replicas"),
        pytest.param(
            slicing(replicas=4, renameByDefault=True), "iluvatar.com/gpu.shared", 4, id="seed-rename"
        ),
        pytest.param(slicing(replicas=1, renameByDefault=True), ILUVATAR_GPU, 1, id="unshared-keeps-name"),
        pytest.param(nvidia({"name": "gpu", "replicas": 4}), ILUVATAR_GPU, 4, id="bare-name"),
        pytest.param(nvidia({"name": ILUVATAR_GPU, "replicas": 3}), ILUVATAR_GPU, 3, id="qualified-name"),
        pytest.param(
            nvidia({"name": "gpu", "replicas": 4}, renameByDefault=True),
            "iluvatar.com/gpu.shared",
            4,
            id="renameByDefault",
        ),
        pytest.param(
            nvidia({"name": "gpu", "replicas": 2, "rename": "vgpu"}, renameByDefault=True),
            "iluvatar.com/vgpu",
            2,
            id="rename-wins-over-default",
        ),
        pytest.param(
            nvidia({"name": "gpu", "replicas": 2, "rename": "example.com/slice"}),
            "example.com/slice",
            2,
            id="rename-qualified",
        ),
        pytest.param(
            {
                "resourceName": "iluvatar.com/vgpu",
                **nvidia({"name": "vgpu", "replicas": 2}, renameByDefault=True),
            },
            "iluvatar.com/vgpu.shared",
            2,
            id="entries-match-resourceName",
        ),
        pytest.param(
            nvidia({"name": "nvidia.com/gpu", "replicas": 4}, {"name": "gpu", "replicas": 2}),
            ILUVATAR_GPU,
            2,
            id="mixed-cluster-file",
        ),
    ],
)
def test_resource_and_replicas(doc: dict[str, object], resource: str, replicas: int) -> None:
    got = plan(doc)
    assert (got.resource, got.replicas) == (resource, replicas)


def test_the_same_file_on_an_nvidia_node() -> None:
    doc = nvidia(
        {"name": "nvidia.com/gpu", "replicas": 4},
        {"name": "iluvatar.com/gpu", "replicas": 2},
        renameByDefault=True,
    )
    got = plan(doc, NVIDIA.resource_name)
    assert (got.resource, got.replicas, got.notes) == ("nvidia.com/gpu.shared", 4, ())


def test_no_entry_for_this_resource_shares_nothing_and_says_so() -> None:
    got = plan(nvidia({"name": "nvidia.com/gpu", "replicas": 10}, renameByDefault=True))
    assert (got.resource, got.replicas) == (ILUVATAR_GPU, 1)
    assert got.notes == (
        "sharing.timeSlicing.resources has no entry for iluvatar.com/gpu (only nvidia.com/gpu): "
        "its devices are not shared",
    )


def test_a_second_entry_for_the_same_resource_is_reported() -> None:
    got = plan(nvidia({"name": "gpu", "replicas": 2}, {"name": ILUVATAR_GPU, "replicas": 8}))
    assert (got.replicas, got.key) == (2, "sharing.timeSlicing.resources[0]")
    assert got.notes == (
        "sharing.timeSlicing.resources[1] is ignored: sharing.timeSlicing.resources[0] already names "
        "iluvatar.com/gpu",
    )


def test_config_notices_are_in_the_plan() -> None:
    got = plan({"flags": {"failOnInitError": False}, **slicing(replicas=2)})
    assert len(got.notes) == 1 and got.notes[0].startswith("flags.failOnInitError: false is ignored")


# --------------------------------------------------------------------------- the device list


def devices_for(doc: dict[str, object], *, splitboard: bool, boards: int = 2) -> list[str]:
    p = plan(doc)
    return list(
        build_device_list(
            chips(boards, numa_of=(0,)),
            splitboard=splitboard,
            replicas=p.replicas,
            shared=p.devices,
            key=p.key,
        ).ids
    )


@pytest.mark.parametrize(
    ("devices", "splitboard", "expected"),
    [
        ("all", False, ["C0::0", "C0::1", "C2::0", "C2::1"]),
        (1, False, ["C0::0", "C0::1", "C2"]),
        (1, True, ["C0::0", "C0::1", "C1", "C2", "C3"]),
        ([3], True, ["C0", "C1", "C2", "C3::0", "C3::1"]),
        # Boards not split: a chip index selects the board that holds it.
        ([3], False, ["C0", "C2::0", "C2::1"]),
        (["C1", 2], True, ["C0", "C1::0", "C1::1", "C2::0", "C2::1", "C3"]),
    ],
)
def test_devices_selects_what_is_replicated(devices: object, splitboard: bool, expected: list[str]) -> None:
    doc = nvidia({"name": "gpu", "replicas": 2, "devices": devices})
    assert devices_for(doc, splitboard=splitboard) == expected


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        ([7], r"sharing\.timeSlicing\.resources\[0\]\.devices: no chip with index 7 on this node"),
        (["GPU-x"], r"sharing\.timeSlicing\.resources\[0\]\.devices: no chip with UUID 'GPU-x' on this node"),
        (3, r"sharing\.timeSlicing\.resources\[0\]\.devices: 3 devices to share, but this node has 2"),
    ],
)
def test_selecting_what_the_node_lacks_is_an_error(devices: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        devices_for(nvidia({"name": "gpu", "replicas": 2, "devices": devices}), splitboard=False)


def test_no_chips_yet_is_not_an_error() -> None:
    assert (
        devices_for(nvidia({"name": "gpu", "replicas": 2, "devices": [5]}), splitboard=True, boards=0) == []
    )


# --------------------------------------------------------------------------- Allocate


def alloc(ids: list[str], config: RuntimeConfig) -> dict[str, str]:
    p = plan_sharing(config, ILUVATAR_GPU)
    devices = build_device_list(chips(2), splitboard=True, replicas=p.replicas, shared=p.devices, key=p.key)
    return allocate_container(ids, devices, vendor=ILUVATAR, control_nodes=(), config=config).envs


FAIL_GT_ONE = nvidia({"name": "gpu", "replicas": 4}, failRequestsGreaterThanOne=True)


def test_fail_requests_greater_than_one_refuses_two_replicas_with_nvidias_words() -> None:
    config = parse_plugin_config(FAIL_GT_ONE).runtime()
    with pytest.raises(AllocationError) as info:
        alloc(["C0::0", "C1::0"], config)
    assert str(info.value) == (
        "request for 2 devices refused: the maximum request size for shared resources is 1 "
        "(sharing.timeSlicing.failRequestsGreaterThanOne); a time-sliced replica is not a whole GPU, "
        "request 1"
    )
    assert alloc(["C0::0"], config)[REPLICA_DEVICES_ENV] == "C0::0"
    # Without the flag two replicas are fine.
    assert alloc(["C0::0", "C1::0"], parse_plugin_config(nvidia({"name": "gpu", "replicas": 4})).runtime())


def test_fail_requests_greater_than_one_spares_whole_devices_when_only_some_are_shared() -> None:
    config = parse_plugin_config(
        nvidia({"name": "gpu", "replicas": 2, "devices": [0]}, failRequestsGreaterThanOne=True)
    ).runtime()
    whole = alloc(["C1", "C2"], config)
    assert whole == {"IX_VISIBLE_DEVICES": "C1,C2"}  # whole chips: no replica variable either
    with pytest.raises(AllocationError, match="maximum request size for shared resources is 1"):
        alloc(["C0::1", "C1"], config)


# --------------------------------------------------------------------------- over gRPC

NVIDIA_RENAMED = """\
version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: iluvatar.com/gpu
      replicas: 4
"""


def test_plugin_registers_the_shared_name_and_refuses_two(short_tmp: Path, fake_devices: Path) -> None:
    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices, NVIDIA_RENAMED) as (_, kubelet):
            (reg,) = kubelet.registrations
            assert reg.request.resource_name == "iluvatar.com/gpu.shared"
            assert reg.request.endpoint == "iluvatar-gpu.shared.sock"
            assert len(kubelet.last_update().devices) == 2 * 4  # two boards, four replicas each
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await allocate(kubelet, [f"{UUID(0)}::0", f"{UUID(2)}::1"])
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "maximum request size for shared resources is 1" in (info.value.details() or "")
            (one,) = (await allocate(kubelet, [f"{UUID(2)}::3"])).container_responses
            assert one.envs["IX_VISIBLE_DEVICES"] == f"{UUID(2)},{UUID(3)}"

    run(scenario)


def test_reload_to_a_renamed_resource_registers_again(short_tmp: Path, fake_devices: Path) -> None:
    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices) as (_, kubelet):
            assert [r.request.resource_name for r in kubelet.registrations] == [ILUVATAR_GPU]
            (short_tmp / "ix-config").write_text(FAST_HEALTH + NVIDIA_RENAMED)
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 2, what="second registration")
            assert kubelet.registrations[1].request.resource_name == "iluvatar.com/gpu.shared"
            await kubelet.wait_for(lambda: len(kubelet.last_update().devices) == 8, what="8 devices")

    run(scenario)
