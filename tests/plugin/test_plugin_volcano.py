"""``flags.usevolcano`` in the running plugin: a fake kubelet calls Allocate with its own choice, a
fake API server serves this node's pods as ix-volcano-plugin annotates them (and takes the
plugin's write-back), and a fake PodResources server says what the kubelet believes each pod
holds. Allocate binds Volcano's devices (device nodes, variable, CDI names and the reset all
follow them), writes them back to the pod, falls back to the kubelet's choice with a warning, and
refuses a kubelet choice that would give one chip to two pods."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ix_gpu.config.plugin_config import load_plugin_config
from ix_gpu.node.fake_devices_file import fake_backend
from ix_gpu.node.gpu_reset import SerializedBackend
from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2 as pb
from ix_gpu.plugin.api import podresources_v1_pb2 as pr
from ix_gpu.plugin.api import podresources_v1_pb2_grpc as pr_grpc
from ix_gpu.plugin.offer.volcano import CONSUMED, DEV_KUBELET, DEV_REAL_ALLOC, DEV_VOLCANO, PREDICATE_TIME
from ix_gpu.plugin.server.app import PluginApp
from ix_gpu.plugin.server.settings import PluginSettings
from tests.dra.fake_resource_api import FakeResourceApi, serving
from tests.plugin.kubelet_fake import FakeKubelet
from tests.plugin.plugin_testkit import FAST_HEALTH, write_config
from tests.plugin.test_plugin_gpu_reset import resets
from tests.plugin.test_plugin_kubelet import UUID, allocate, run

pytestmark = pytest.mark.timeout(60)

NODE = "node-a"
VOLCANO = "flags:\n  splitboard: true\n  usevolcano: true\n"


class PodResources(pr_grpc.PodResourcesListerServicer):
    """What the kubelet believes: pod key → the device IDs it allocated (its own choice)."""

    def __init__(self) -> None:
        self.held: dict[str, list[str]] = {}

    async def List(self, request: pr.ListPodResourcesRequest, context: Any) -> pr.ListPodResourcesResponse:
        pods = []
        for key, ids in self.held.items():
            namespace, name = key.split("/")
            devices = [pr.ContainerDevices(resource_name="iluvatar.com/gpu", device_ids=ids)]
            container = pr.ContainerResources(name="main", devices=devices)
            pods.append(pr.PodResources(namespace=namespace, name=name, containers=[container]))
        return pr.ListPodResourcesResponse(pod_resources=pods)


@contextlib.asynccontextmanager
async def volcano_plugin(
    base: Path, devices_file: Path, api: FakeResourceApi, config_text: str = VOLCANO, *, cluster: bool = True
) -> AsyncIterator[tuple[PluginApp, FakeKubelet, PodResources]]:
    """The plugin on ``node-a`` with ``api`` as its API server (``cluster`` False: none, and no
    NODE_NAME) and the kubelet's PodResources, serving a fake kubelet."""
    directory = base / "dp"
    directory.mkdir(exist_ok=True)
    config_path = write_config(base, FAST_HEALTH + config_text)
    socket = base / "pr.sock"
    kubelet_view = PodResources()
    grpc_server = grpc.aio.server()
    pr_grpc.add_PodResourcesListerServicer_to_server(kubelet_view, grpc_server)
    grpc_server.add_insecure_port(f"unix://{socket}")
    await grpc_server.start()
    kubelet = FakeKubelet(directory)
    await kubelet.start()
    with serving(api) as server:
        settings = PluginSettings(
            device_plugin_dir=directory,
            config_path=config_path,
            node_name=NODE if cluster else None,
            api_server=server if cluster else None,
            pod_resources_socket=socket,
            telemetry_interval=0,
        )
        app = PluginApp(
            settings,
            load_plugin_config(config_path).runtime(),
            SerializedBackend(fake_backend(devices_file)),
        )
        app.volcano.wait = 0.5
        task = asyncio.create_task(app.run())
        try:
            await kubelet.wait_for(lambda: kubelet.updates, what="first ListAndWatch update")
            yield app, kubelet, kubelet_view
        finally:
            app.request_stop("test finished")
            await asyncio.wait_for(task, 10)
            await kubelet.stop()
            await grpc_server.stop(0)


def annotated(api: FakeResourceApi, name: str, volcano: str, when: int, phase: str = "Pending") -> None:
    """A pod on node-a as ix-volcano-plugin leaves it: the devices it chose, and when."""
    api.add_pod("ml", name, NODE, {DEV_VOLCANO: volcano, PREDICATE_TIME: str(when)}, phase)


def annotations(api: FakeResourceApi, name: str) -> dict[str, str]:
    with api.lock:
        return dict(api.pods[f"ml/{name}"]["metadata"]["annotations"])


def counted(app: PluginApp, result: str) -> float:
    text = app.metrics_text().decode()
    found = re.search(rf'ix_gpu_plugin_volcano_allocations_total{{result="{result}"}} (\S+)', text)
    assert found, "no ix_gpu_plugin_volcano_allocations_total series"
    return float(found.group(1))


async def refused(kubelet: FakeKubelet, ids: list[str]) -> str:
    request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await kubelet.plugin.Allocate(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return info.value.details() or ""


@pytest.fixture
def api() -> Iterator[FakeResourceApi]:
    yield FakeResourceApi()


def test_allocate_binds_volcanos_chip_and_writes_it_back_to_the_pod(
    short_tmp: Path, fake_devices: Path, api: FakeResourceApi
) -> None:
    """The kubelet chose chip 0; Volcano chose chip 3: the container gets /dev/iluvatar3 and chip
    3's UUID, and the pod says what was bound (uid as the write's precondition)."""
    annotated(api, "train", UUID(3), 1700000000000000000)

    async def scenario() -> None:
        async with volcano_plugin(short_tmp, fake_devices, api) as (app, kubelet, _):
            (answer,) = (await allocate(kubelet, [UUID(0)])).container_responses
            assert [d.host_path for d in answer.devices] == ["/dev/iluvatar3", "/dev/itrctl"]
            assert dict(answer.envs) == {"IX_VISIBLE_DEVICES": UUID(3)}
            assert annotations(api, "train") == {
                DEV_VOLCANO: UUID(3),
                PREDICATE_TIME: CONSUMED,
                DEV_KUBELET: UUID(0),
                DEV_REAL_ALLOC: UUID(3),
            }
            ((key, body),) = api.patches
            assert key == "ml/train" and body["metadata"]["uid"] == "uid-ml-train"
            assert counted(app, "volcano") == 1 and counted(app, "fallback") == 0

    run(scenario)


def test_pods_are_matched_oldest_first_and_each_once(
    short_tmp: Path, fake_devices: Path, api: FakeResourceApi
) -> None:
    """Two pods wait for one device each: the one Volcano placed first gets the first Allocate, the
    other the next; the kubelet picks chips 0 and 1, Volcano's 2 and 1 are bound."""
    annotated(api, "second", UUID(1), 30)
    annotated(api, "first", UUID(2), 20)

    async def scenario() -> None:
        async with volcano_plugin(short_tmp, fake_devices, api) as (_, kubelet, kubelet_view):
            (one,) = (await allocate(kubelet, [UUID(0)])).container_responses
            assert dict(one.envs) == {"IX_VISIBLE_DEVICES": UUID(2)}
            kubelet_view.held["ml/first"] = [UUID(0)]
            (two,) = (await allocate(kubelet, [UUID(1)])).container_responses
            assert dict(two.envs) == {"IX_VISIBLE_DEVICES": UUID(1)}
            assert annotations(api, "first")[DEV_REAL_ALLOC] == UUID(2)
            assert annotations(api, "second")[DEV_REAL_ALLOC] == UUID(1)

    run(scenario)


def test_a_pod_the_watch_shows_late_is_waited_for(
    short_tmp: Path, fake_devices: Path, api: FakeResourceApi
) -> None:
    async def scenario() -> None:
        async with volcano_plugin(short_tmp, fake_devices, api) as (_, kubelet, _view):
            asyncio.get_running_loop().call_later(0.2, annotated, api, "late", UUID(3), 5)
            (answer,) = (await allocate(kubelet, [UUID(0)])).container_responses
            assert dict(answer.envs) == {"IX_VISIBLE_DEVICES": UUID(3)}

    run(scenario)


def test_a_device_not_on_the_node_falls_back_to_the_kubelets_choice_with_a_warning(
    short_tmp: Path, fake_devices: Path, api: FakeResourceApi, caplog: pytest.LogCaptureFixture
) -> None:
    elsewhere = "GPU-00000000-0000-0000-0000-0000000000ff"
    annotated(api, "stray", elsewhere, 1)

    async def scenario() -> None:
        async with volcano_plugin(short_tmp, fake_devices, api) as (app, kubelet, _):
            (answer,) = (await allocate(kubelet, [UUID(1)])).container_responses
            assert dict(answer.envs) == {"IX_VISIBLE_DEVICES": UUID(1)}
            assert [d.host_path for d in answer.devices] == ["/dev/iluvatar1", "/dev/itrctl"]
            # Matched all the same: consumed, and it says the kubelet's chip is what it holds.
            assert annotations(api, "stray")[DEV_REAL_ALLOC] == UUID(1)
            assert counted(app, "fallback") == 1 and counted(app, "volcano") == 0

    with caplog.at_level(logging.WARNING, logger="ix_gpu.plugin.server.volcano"):
        run(scenario)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "pod ml/stray" in warning and f"binding the kubelet's choice {UUID(1)}" in warning
    assert "not among this node's advertised devices" in warning


def test_the_kubelets_choice_of_a_chip_volcano_gave_another_pod_is_refused(
    short_tmp: Path, fake_devices: Path, api: FakeResourceApi
) -> None:
    """After a restart: pod ``held`` was bound chip 3 (its DevRealAlloc) while the kubelet believes it
    holds chip 0. A pod outside Volcano that the kubelet gives chip 3 is refused, naming the holder;
    the kubelet's chip 1 is bound. A Volcano pod may not take chip 3 either: it falls back."""
    api.add_pod("ml", "held", NODE, {DEV_KUBELET: UUID(0), DEV_REAL_ALLOC: UUID(3)}, "Running")

    async def scenario() -> None:
        async with volcano_plugin(short_tmp, fake_devices, api) as (app, kubelet, kubelet_view):
            kubelet_view.held["ml/held"] = [UUID(0)]
            details = await refused(kubelet, [UUID(3)])
            assert f"the kubelet chose '{UUID(3)}', which pod ml/held holds" in details
            (answer,) = (await allocate(kubelet, [UUID(1)])).container_responses
            assert dict(answer.envs) == {"IX_VISIBLE_DEVICES": UUID(1)}
            annotated(api, "greedy", UUID(3), 1)
            (answer,) = (await allocate(kubelet, [UUID(2)])).container_responses
            assert dict(answer.envs) == {"IX_VISIBLE_DEVICES": UUID(2)}
            assert counted(app, "refused") == 1 and counted(app, "unmatched") == 1
            assert counted(app, "fallback") == 1

    run(scenario)


def test_the_reset_and_the_cdi_names_follow_volcanos_devices(
    short_tmp: Path, fake_devices: Path, api: FakeResourceApi
) -> None:
    annotated(api, "cdi", UUID(2), 1)
    config = VOLCANO + f"  reset_gpu: true\ndeviceListStrategy: cdi\ncdi:\n  specDir: {short_tmp / 'cdi'}\n"

    async def scenario() -> None:
        async with volcano_plugin(short_tmp, fake_devices, api, config) as (_, kubelet, _view):
            (answer,) = (await allocate(kubelet, [UUID(0)])).container_responses
            assert [d.name for d in answer.cdi_devices] == [f"iluvatar.com/gpu={UUID(2)}"]
            assert resets(fake_devices) == [[UUID(2)]]

    run(scenario)


def test_a_failed_write_back_is_counted_and_the_binding_stands(
    short_tmp: Path, fake_devices: Path, api: FakeResourceApi
) -> None:
    """The pod cannot be written (403): the chip it got is still its own in this process, so the
    kubelet's later choice of it for another pod is refused."""
    annotated(api, "unwritten", UUID(3), 1)
    api.denied.add("/api/v1/namespaces/ml/pods/unwritten")

    async def scenario() -> None:
        async with volcano_plugin(short_tmp, fake_devices, api) as (app, kubelet, kubelet_view):
            (answer,) = (await allocate(kubelet, [UUID(0)])).container_responses
            assert dict(answer.envs) == {"IX_VISIBLE_DEVICES": UUID(3)}
            assert DEV_REAL_ALLOC not in annotations(api, "unwritten")
            assert re.search(
                r'ix_gpu_plugin_api_errors_total\{call="pod_patch"\} 1', app.metrics_text().decode()
            )
            kubelet_view.held["ml/unwritten"] = [UUID(0)]
            assert "which pod ml/unwritten holds" in await refused(kubelet, [UUID(3)])

    run(scenario)


def test_without_cluster_access_the_kubelets_choice_is_bound_and_said(
    short_tmp: Path, fake_devices: Path, api: FakeResourceApi
) -> None:
    """usevolcano from the ix-config (the shipped Volcano ConfigMap) where the pods cannot be read:
    the plugin runs, binds the kubelet's choice, counts it unavailable and says why on /healthz."""
    annotated(api, "ignored", UUID(3), 1)

    async def scenario() -> None:
        async with volcano_plugin(short_tmp, fake_devices, api, cluster=False) as (app, kubelet, _):
            (answer,) = (await allocate(kubelet, [UUID(0)])).container_responses
            assert dict(answer.envs) == {"IX_VISIBLE_DEVICES": UUID(0)}
            assert counted(app, "unavailable") == 1
            assert any("flags.usevolcano needs NODE_NAME and cluster access" in n for n in app.notes())
            assert api.patches == []

    run(scenario)


def test_with_usevolcano_off_the_pods_are_not_read(
    short_tmp: Path, fake_devices: Path, api: FakeResourceApi
) -> None:
    annotated(api, "ignored", UUID(3), 1)

    async def scenario() -> None:
        async with volcano_plugin(short_tmp, fake_devices, api, "flags:\n  splitboard: true\n") as (
            app,
            kubelet,
            _,
        ):
            (answer,) = (await allocate(kubelet, [UUID(0)])).container_responses
            assert dict(answer.envs) == {"IX_VISIBLE_DEVICES": UUID(0)}
            assert app.volcano.pods is None and api.count("GET", "/api/v1/pods") == 0

    run(scenario)
