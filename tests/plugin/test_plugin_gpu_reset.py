"""``flags.reset_gpu`` in the device plugin: every Allocate resets the chips it hands out, through
the backend (here the fake one, whose devices file says how each chip's reset goes), off the event
loop, bounded, counted; a reset that fails or changes a chip's identity refuses the allocation."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import grpc
import pytest

from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2 as pb
from tests.plugin.kubelet_fake import FakeKubelet
from tests.plugin.test_plugin_kubelet import UUID, allocate, plugin_and_kubelet, run
from tests.support.fake_resets import chip_reset, resets

pytestmark = pytest.mark.timeout(60)

RESET = "flags:\n  reset_gpu: true\n"
SPLIT_RESET = "flags:\n  splitboard: true\n  reset_gpu: true\ngpuReset:\n  timeoutSeconds: 2\n"


def counted(metrics: bytes, result: str) -> float:
    found = re.search(rf'ix_gpu_plugin_gpu_resets_total{{result="{result}"}} (\S+)', metrics.decode())
    assert found, "no ix_gpu_plugin_gpu_resets_total series"
    return float(found.group(1))


async def refused(kubelet: FakeKubelet, *containers: list[str]) -> str:
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in containers]
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await kubelet.plugin.Allocate(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return info.value.details() or ""


def test_a_board_is_reset_whole_before_the_kubelet_gets_it(short_tmp: Path, fake_devices: Path) -> None:
    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices, RESET) as (app, kubelet):
            (response,) = (await allocate(kubelet, [UUID(0)])).container_responses
            assert dict(response.envs)["IX_VISIBLE_DEVICES"] == f"{UUID(0)},{UUID(1)}"
            assert resets(fake_devices) == [[UUID(0), UUID(1)]]  # both chips of board 0
            (await allocate(kubelet, [UUID(2)], [UUID(0)]))
            assert resets(fake_devices)[1:] == [[UUID(2), UUID(3), UUID(0), UUID(1)]]  # one reset a call
            assert counted(app.metrics_text(), "ok") == 2

    run(scenario)


def test_without_the_flag_nothing_is_reset(short_tmp: Path, fake_devices: Path) -> None:
    async def scenario() -> None:
        config = "flags:\n  reset_gpu: false\n"
        async with plugin_and_kubelet(short_tmp, fake_devices, config) as (app, kubelet):
            await allocate(kubelet, [UUID(0)])
            assert resets(fake_devices) == []
            assert counted(app.metrics_text(), "ok") == 0

    run(scenario)


def test_a_reset_that_fails_refuses_the_allocation_with_the_tools_words(
    short_tmp: Path, fake_devices: Path
) -> None:
    chip_reset(fake_devices, UUID(1), fails="GPU is in use by another process")

    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices, SPLIT_RESET) as (app, kubelet):
            details = await refused(kubelet, [UUID(1)])
            assert f"GPU reset of {UUID(1)} failed" in details and "in use by another process" in details
            assert "not handed out" in details
            await allocate(kubelet, [UUID(0)])  # another chip still resets and is handed out
            assert resets(fake_devices) == [[UUID(0)]]
            text = app.metrics_text()
            assert (counted(text, "failed"), counted(text, "ok")) == (1, 1)

    run(scenario)


def test_a_reset_past_its_timeout_refuses_within_the_bound_and_the_loop_serves_meanwhile(
    short_tmp: Path, fake_devices: Path
) -> None:
    """gpuReset.timeoutSeconds 2 against a reset that takes 30 s: refused after 2 s, and the event
    loop answered GetPreferredAllocation while the reset ran."""
    chip_reset(fake_devices, UUID(2), seconds=30)

    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices, SPLIT_RESET) as (_, kubelet):
            started = time.monotonic()
            pending = asyncio.create_task(refused(kubelet, [UUID(2)]))
            await asyncio.sleep(0.5)
            asked = time.monotonic()
            request = pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(available_deviceIDs=[UUID(0)], allocation_size=1)
                ]
            )
            await kubelet.plugin.GetPreferredAllocation(request, timeout=2)
            assert time.monotonic() - asked < 0.5
            details = await pending
            assert 2 <= time.monotonic() - started < 5
            assert "did not finish in 2s" in details

    run(scenario)


def test_a_chip_that_comes_back_with_another_uuid_is_refused_and_the_new_list_published(
    short_tmp: Path, fake_devices: Path
) -> None:
    renamed = "GPU-00000000-0000-0000-0000-00000000beef"
    chip_reset(fake_devices, UUID(3), uuidAfter=renamed)

    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices, SPLIT_RESET) as (app, kubelet):
            details = await refused(kubelet, [UUID(3)])
            assert f"{UUID(3)} no longer exists after its GPU reset" in details
            await kubelet.wait_for(
                lambda: renamed in {d for d, _, _ in kubelet.last_update().devices},
                timeout=2,
                what="the list with the new UUID",
            )
            assert UUID(3) not in {d for d, _, _ in kubelet.last_update().devices}
            assert counted(app.metrics_text(), "changed") == 1
            await allocate(kubelet, [renamed])  # the chip under its new name resets and is handed out
            assert resets(fake_devices)[-1] == [renamed]

    run(scenario)
