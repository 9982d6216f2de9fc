"""Whose is each chip: the kubelet's PodResources answer mapped to holders (ix_gpu.node.attribution)
on all three paths, and the real ``ix-gpu plugin`` reading a PodResources server over its unix
socket (grpcio, as the kubelet's grpc-go would answer) into ``ix_gpu_chip_allocation`` series."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ix_gpu.node.attribution import ContainerDevices, Holder, holders_by_chip
from ix_gpu.node.backends.base import Chip
from ix_gpu.node.devices.device_list import build_device_list
from ix_gpu.plugin.api import podresources_v1_pb2 as pr
from ix_gpu.plugin.api import podresources_v1_pb2_grpc as pr_grpc
from ix_gpu.plugin.server.pod_resources import containers
from tests.plugin.plugin_testkit import FAST_HEALTH
from tests.support.net import free_port
from tests.support.plugin_process import PluginProcess
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.timeout(60)
R = "iluvatar.com/gpu"

CHIPS = [
    Chip(f"GPU-{b}{p}", 2 * b + p, 2 * b + p, f"b{b}", p, "Iluvatar BI-V150", 32768, 0)
    for b in range(2)
    for p in range(2)
]


def device_chips(splitboard: bool, replicas: int) -> dict[str, tuple[str, ...]]:
    devices = build_device_list(CHIPS, splitboard=splitboard, replicas=replicas)
    return {
        key: tuple(chip.uuid for chip in device.physical.chips)
        for device in devices.devices
        for key in (device.id, device.physical.id)
    }


def test_a_whole_board_a_chip_and_time_sliced_replicas() -> None:
    pods = [
        ContainerDevices("ml", "board-pod", "main", {"iluvatar.com/gpu": ["GPU-00"]}),
        ContainerDevices("other", "nic", "main", {"example.com/nic": ["GPU-10", "eth1"]}),  # not ours
    ]
    by_board = holders_by_chip(
        pods, CHIPS, resources=[R], device_chips=device_chips(False, 1), dra_driver=None, pool="n"
    )
    assert by_board == {
        "GPU-00": [Holder("ml", "board-pod", "main")],
        "GPU-01": [Holder("ml", "board-pod", "main")],
    }
    shared = [
        ContainerDevices("a", "p1", "c", {"iluvatar.com/gpu": ["GPU-10::0"]}),
        ContainerDevices("b", "p2", "c", {"iluvatar.com/gpu": ["GPU-10::3"]}),
    ]
    replicas = holders_by_chip(
        shared, CHIPS, resources=[R], device_chips=device_chips(True, 4), dra_driver=None, pool="n"
    )
    # Two pods time-slicing one chip: each its own holder, the chip once.
    assert replicas == {"GPU-10": [Holder("a", "p1", "c"), Holder("b", "p2", "c")]}


def test_dra_claims_by_pool_and_device_name_and_only_ours() -> None:
    pods = [
        ContainerDevices("ml", "chip-pod", "main", {}, [("ml/one", "gpu.iluvatar.com", "node-a", "gpu-2")]),
        ContainerDevices(
            "ml", "board-pod", "main", {}, [("ml/two", "gpu.iluvatar.com", "node-a", "board-0")]
        ),
        ContainerDevices("ml", "reader", "side", {}, [("ml/two", "gpu.iluvatar.com", "node-a", "board-0")]),
        ContainerDevices("x", "elsewhere", "c", {}, [("x/c", "gpu.iluvatar.com", "node-b", "gpu-3")]),
        ContainerDevices("x", "nvidia", "c", {}, [("x/d", "gpu.nvidia.com", "node-a", "gpu-3")]),
        ContainerDevices("x", "junk", "c", {}, [("x/e", "gpu.iluvatar.com", "node-a", "gpu-x")]),
    ]
    found = holders_by_chip(
        pods, CHIPS, resources=[R], device_chips={}, dra_driver="gpu.iluvatar.com", pool="node-a"
    )
    board = [Holder("ml", "board-pod", "main", "ml/two"), Holder("ml", "reader", "side", "ml/two")]
    assert found == {"GPU-00": board, "GPU-01": board, "GPU-10": [Holder("ml", "chip-pod", "main", "ml/one")]}
    assert holders_by_chip(pods, CHIPS, resources=[R], device_chips={}, dra_driver=None, pool="node-a") == {}


def test_the_protobuf_answer_becomes_containers() -> None:
    answer = pr.ListPodResourcesResponse(
        pod_resources=[
            pr.PodResources(
                name="p",
                namespace="ns",
                containers=[
                    pr.ContainerResources(
                        name="c",
                        devices=[
                            pr.ContainerDevices(resource_name="iluvatar.com/gpu", device_ids=["GPU-00"])
                        ],
                        dynamic_resources=[
                            pr.DynamicResource(
                                claim_name="cl",
                                claim_namespace="ns",
                                claim_resources=[
                                    pr.ClaimResource(
                                        driver_name="gpu.iluvatar.com", pool_name="n", device_name="gpu-1"
                                    )
                                ],
                            )
                        ],
                    ),
                    pr.ContainerResources(name="idle"),
                ],
            )
        ]
    )
    assert containers(answer) == [
        ContainerDevices(
            "ns", "p", "c", {"iluvatar.com/gpu": ("GPU-00",)}, (("ns/cl", "gpu.iluvatar.com", "n", "gpu-1"),)
        )
    ]


class PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.answer = pr.ListPodResourcesResponse()
        self.calls = 0

    async def List(self, request: pr.ListPodResourcesRequest, context: Any) -> pr.ListPodResourcesResponse:
        self.calls += 1
        return self.answer


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def allocations(samples: dict[Any, float]) -> list[tuple[str, str, str, str]]:
    return sorted(
        (labels["uuid"], labels["namespace"], labels["pod"], labels["container"])
        for (name, pairs) in samples
        if name == "ix_gpu_chip_allocation"
        for labels in [dict(pairs)]
    )


def test_the_plugin_labels_each_chip_with_its_pods_and_says_when_the_kubelet_does_not_answer(
    short_tmp: Path, fake_devices: Path
) -> None:
    """No socket yet: ``ix_gpu_pod_resources_up`` 0 and the chips' series flow. The kubelet's
    server comes up with one pod holding board 0 (splitboard false): both its chips show the pod.
    The pod goes: its series go with the next read."""
    socket = short_tmp / "pod-resources.sock"
    port = free_port()
    (short_tmp / "dp").mkdir()
    plugin = PluginProcess(
        short_tmp,
        short_tmp / "dp",
        fake_devices.read_text(),
        FAST_HEALTH,
        short_tmp,
        metrics_port=port,
        node="node-a",
        extra_args=("--telemetry-interval", "0.3", "--pod-resources-socket", str(socket)),
    ).start()
    board0 = "GPU-7d0d7c1e-6f0a-5a4c-9b51-0a1b2c3d4e00"

    async def scenario() -> None:
        await wait_until_async(
            lambda: scrape(port).get(("ix_gpu_pod_resources_up", ())) == 0.0,
            "up 0 without a socket",
            timeout=20,
        )
        assert any(name == "ix_gpu_chip_telemetry_stale" for name, _ in scrape(port))
        kubelet = PodResources()
        kubelet.answer = pr.ListPodResourcesResponse(
            pod_resources=[
                pr.PodResources(
                    name="train",
                    namespace="ml",
                    containers=[
                        pr.ContainerResources(
                            name="main",
                            devices=[
                                pr.ContainerDevices(resource_name="iluvatar.com/gpu", device_ids=[board0])
                            ],
                        )
                    ],
                )
            ]
        )
        server = grpc.aio.server()
        pr_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
        server.add_insecure_port(f"unix://{socket}")
        await server.start()
        try:
            await wait_until_async(lambda: allocations(scrape(port)), "the pod on its chips", timeout=10)
            samples = scrape(port)
            assert samples[("ix_gpu_pod_resources_up", ())] == 1.0
            assert allocations(samples) == [
                (board0, "ml", "train", "main"),
                ("GPU-7d0d7c1e-6f0a-5a4c-9b51-0a1b2c3d4e01", "ml", "train", "main"),
            ]
            kubelet.answer = pr.ListPodResourcesResponse()
            await wait_until_async(lambda: not allocations(scrape(port)), "the pod's series gone", timeout=5)
        finally:
            await server.stop(0)

    try:
        asyncio.run(scenario())
    finally:
        plugin.stop()


def test_a_kubelet_that_errors_or_sends_garbage_leaves_no_holder_and_is_said_once(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An UNAVAILABLE answer, then bytes that do not parse as the message: each read keeps no
    holder and reports down, the log says each distinct error once, and a good answer restores."""
    from ix_gpu.plugin.server.pod_resources import PodResourcesReader

    socket = short_tmp / "pr.sock"
    mode = {"now": "error"}

    async def list_handler(request: bytes, context: Any) -> bytes:
        if mode["now"] == "error":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet is busy")
        if mode["now"] == "garbage":
            return b"\xff\xff\xff"
        return pr.ListPodResourcesResponse(
            pod_resources=[pr.PodResources(name="p", namespace="n")]
        ).SerializeToString()

    async def scenario() -> list[tuple[bool, int]]:
        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(list_handler)  # raw bytes both ways
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": handler}),)
        )
        server.add_insecure_port(f"unix://{socket}")
        await server.start()
        reader = PodResourcesReader(socket)
        reader.containers = [ContainerDevices("ns", "gone", "c", {R: ("GPU-00",)})]  # from a read before
        seen = []
        try:
            for now in ("error", "error", "garbage", "good"):
                mode["now"] = now
                await reader.read()
                seen.append((reader.up, len(reader.containers)))
        finally:
            await server.stop(0)
        return seen

    with caplog.at_level("WARNING", logger="ix_gpu.plugin.server.pod_resources"):
        seen = asyncio.run(scenario())
    assert seen == [(False, 0), (False, 0), (False, 0), (True, 0)]  # the good answer's pod holds no device
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2 and "kubelet is busy" in warnings[0], warnings
