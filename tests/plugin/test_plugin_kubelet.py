"""The plugin against a fake kubelet over real unix-socket gRPC.

Registration order, the seed's capacities, Allocate contents, health flip and recovery, and
kubelet restarts. The plugin runs in-process (same event loop) so each test takes well under a
second of wall time; the SIGTERM path runs the real CLI in a subprocess (test_plugin_process.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc
import pytest
from h2.connection import H2Connection

from ix_gpu.config.plugin_config import load_plugin_config
from ix_gpu.node.fake_devices_file import fake_backend
from ix_gpu.node.gpu_reset import SerializedBackend
from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2 as pb
from ix_gpu.plugin.server.allocation_gate import DevicePluginGate
from ix_gpu.plugin.server.app import PluginApp
from ix_gpu.plugin.server.registration import CLOSED_STREAMS_KEPT
from ix_gpu.plugin.server.settings import PluginSettings
from tests.plugin.kubelet_fake import FakeKubelet
from tests.plugin.plugin_testkit import FAST_HEALTH, write_config

pytestmark = pytest.mark.timeout(60)

UUID = "GPU-7d0d7c1e-6f0a-5a4c-9b51-0a1b2c3d4e0{}".format


def run(coro_fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(coro_fn())


@contextlib.asynccontextmanager
async def plugin_and_kubelet(
    base: Path, devices_file: Path, config_text: str = "", allocation: DevicePluginGate | None = None
) -> AsyncIterator[tuple[PluginApp, FakeKubelet]]:
    """The plugin serving ``devices_file`` to a fake kubelet, until the first ListAndWatch update;
    ``allocation`` decides whether it may advertise (default: always)."""
    directory = base / "dp"
    directory.mkdir(exist_ok=True)
    config_path = write_config(base, FAST_HEALTH + config_text)
    kubelet = FakeKubelet(directory)
    await kubelet.start()
    app = PluginApp(
        PluginSettings(device_plugin_dir=directory, config_path=config_path, allocation=allocation),
        load_plugin_config(config_path).runtime(),
        SerializedBackend(fake_backend(devices_file)),  # as start_node wraps every agent's backend
    )
    task = asyncio.create_task(app.run())
    try:
        await kubelet.wait_for(lambda: kubelet.updates, what="first ListAndWatch update")
        yield app, kubelet
    finally:
        app.request_stop("test finished")
        await asyncio.wait_for(task, 10)
        await kubelet.stop()


def test_serves_before_registering_and_options_read_back(short_tmp: Path, fake_devices: Path) -> None:
    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices) as (app, kubelet):
            assert kubelet.errors == []
            (reg,) = kubelet.registrations
            assert reg.request.version == "v1beta1"
            assert reg.request.endpoint == "iluvatar-gpu.sock"
            assert reg.request.resource_name == "iluvatar.com/gpu"
            assert reg.request.options.get_preferred_allocation_available
            # The fake kubelet called GetDevicePluginOptions inside Register: it was being served.
            assert reg.options.get_preferred_allocation_available
            assert not reg.options.pre_start_required
            assert app.registrar.registered

    run(scenario)


@pytest.mark.parametrize(
    ("config", "capacity"),
    [
        ("flags:\n  splitboard: false\n", 2),
        ("flags:\n  splitboard: true\n", 4),
        ("flags:\n  splitboard: false\nsharing:\n  timeSlicing:\n    replicas: 4\n", 8),
    ],
)
def test_seed_capacities(short_tmp: Path, fake_devices: Path, config: str, capacity: int) -> None:
    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices, config) as (_app, kubelet):
            update = kubelet.last_update()
            assert len(update.devices) == capacity
            assert set(update.health.values()) == {"Healthy"}
            numa = {device_id: node for device_id, _, node in update.devices}
            assert numa[next(d for d in numa if d.startswith(UUID(0)))] == 0
            assert numa[next(d for d in numa if d.startswith(UUID(2)))] == 1

    run(scenario)


async def allocate(kubelet: FakeKubelet, *containers: list[str]) -> pb.AllocateResponse:
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in containers]
    )
    response: pb.AllocateResponse = await kubelet.plugin.Allocate(request, timeout=2)
    return response


def specs(response: pb.ContainerAllocateResponse) -> list[tuple[str, str, str]]:
    return [(d.host_path, d.container_path, d.permissions) for d in response.devices]


def test_allocate_one_two_and_all_chips(short_tmp: Path, fake_devices: Path) -> None:
    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices, "flags:\n  splitboard: true\n") as (
            _,
            kubelet,
        ):
            one, two, every = (
                await allocate(kubelet, [UUID(1)], [UUID(0), UUID(3)], [UUID(i) for i in range(4)])
            ).container_responses
            assert specs(one) == [
                ("/dev/iluvatar1", "/dev/iluvatar1", "rw"),
                ("/dev/itrctl", "/dev/itrctl", "rw"),
            ]
            assert dict(one.envs) == {"IX_VISIBLE_DEVICES": UUID(1)}
            assert [s[0] for s in specs(two)] == ["/dev/iluvatar0", "/dev/iluvatar3", "/dev/itrctl"]
            assert dict(two.envs) == {"IX_VISIBLE_DEVICES": f"{UUID(0)},{UUID(3)}"}
            assert [s[0] for s in specs(every)] == [f"/dev/iluvatar{i}" for i in range(4)] + ["/dev/itrctl"]
            assert every.envs["IX_VISIBLE_DEVICES"] == ",".join(UUID(i) for i in range(4))

    run(scenario)


def test_allocate_whole_board_gets_both_chips(short_tmp: Path, fake_devices: Path) -> None:
    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices) as (_, kubelet):
            (board,) = (await allocate(kubelet, [UUID(2)])).container_responses
            assert [s[0] for s in specs(board)] == ["/dev/iluvatar2", "/dev/iluvatar3", "/dev/itrctl"]
            assert board.envs["IX_VISIBLE_DEVICES"] == f"{UUID(2)},{UUID(3)}"

    run(scenario)


def test_allocate_replicas_and_index_strategy(short_tmp: Path, fake_devices: Path) -> None:
    config = "deviceIdStrategy: index\nsharing:\n  timeSlicing:\n    replicas: 4\n"

    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices, config) as (_, kubelet):
            (shared,) = (await allocate(kubelet, [f"{UUID(0)}::1", f"{UUID(0)}::3"])).container_responses
            assert shared.envs["IX_VISIBLE_DEVICES"] == "0,1"  # the board's two chips, once
            assert shared.envs["IX_REPLICA_DEVICES"] == f"{UUID(0)}::1,{UUID(0)}::3"
            assert [s[0] for s in specs(shared)] == ["/dev/iluvatar0", "/dev/iluvatar1", "/dev/itrctl"]

    run(scenario)


def test_allocate_rejections_are_invalid_argument(short_tmp: Path, fake_devices: Path) -> None:
    config = "sharing:\n  timeSlicing:\n    replicas: 2\n    failRequestsGreaterThanOne: true\n"

    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices, config) as (app, kubelet):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await allocate(kubelet, ["GPU-nope"])
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "GPU-nope" in (info.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await allocate(kubelet, [f"{UUID(0)}::0", f"{UUID(2)}::0"])
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "failRequestsGreaterThanOne" in (info.value.details() or "")
            (ok,) = (await allocate(kubelet, [f"{UUID(2)}::1"])).container_responses
            assert ok.envs["IX_REPLICA_DEVICES"] == f"{UUID(2)}::1"
            assert app.metrics.allocations.labels(result="error").get() == 2

    run(scenario)


def test_one_long_lived_connection_keeps_bounded_stream_state(short_tmp: Path, fake_devices: Path) -> None:
    """The kubelet makes all its calls on one connection, for as long as it runs. h2 remembers every
    closed stream of a connection, by default up to 65,536 (10 MiB of the plugin's memory after as
    many Allocates); the plugin's connections remember at most CLOSED_STREAMS_KEPT."""

    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices) as (app, kubelet):
            device = kubelet.last_update().devices[0][0]
            for _ in range(CLOSED_STREAMS_KEPT + 100):
                await allocate(kubelet, [device])
            served = [c for c in gc.get_objects() if isinstance(c, H2Connection) and not c.config.client_side]
            remembered = [len(c._closed_streams) for c in served]
            assert remembered and max(remembered) == CLOSED_STREAMS_KEPT, remembered
            assert app.metrics.allocations.labels(result="success").get() == CLOSED_STREAMS_KEPT + 100

    run(scenario)


def test_preferred_allocation_over_grpc(short_tmp: Path, fake_devices: Path) -> None:
    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices, "flags:\n  splitboard: true\n") as (
            _,
            kubelet,
        ):
            request = pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=[UUID(0), UUID(2), UUID(3)], allocation_size=2
                    ),
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=[UUID(1), UUID(2), UUID(3)],
                        must_include_deviceIDs=[UUID(1)],
                        allocation_size=5,  # more than exists: answer what there is, never fail
                    ),
                ]
            )
            first, second = (
                await kubelet.plugin.GetPreferredAllocation(request, timeout=2)
            ).container_responses
            assert list(first.deviceIDs) == [UUID(2), UUID(3)]  # one whole board
            assert second.deviceIDs[0] == UUID(1)
            assert sorted(second.deviceIDs) == sorted([UUID(1), UUID(2), UUID(3)])

    run(scenario)


def test_health_flip_sends_update_and_recovers_after_streak(short_tmp: Path, fake_devices: Path) -> None:
    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices) as (app, kubelet):
            text = fake_devices.read_text()
            lines = text.splitlines()
            hot = [i for i, line in enumerate(lines) if "health: 0" in line][3]  # chip 3, board 1
            lines[hot] = lines[hot].replace("health: 0", "health: 0x4")
            flipped_at = time.monotonic()
            fake_devices.write_text("\n".join(lines) + "\n")
            await kubelet.wait_for(
                lambda: kubelet.last_update().health.get(UUID(2)) == "Unhealthy", what="board 1 Unhealthy"
            )
            assert kubelet.last_update().at - flipped_at < 1.0
            assert kubelet.last_update().health[UUID(0)] == "Healthy"

            fixed_at = time.monotonic()
            fake_devices.write_text(text)
            await kubelet.wait_for(
                lambda: kubelet.last_update().health.get(UUID(2)) == "Healthy", what="board 1 recovered"
            )
            # recoverAfter 3 at 0.1 s: at least two more checks after the first healthy one.
            assert kubelet.last_update().at - fixed_at >= 0.2
            transitions = app.metrics.health_transitions
            assert transitions.labels(to="Unhealthy").get() == 1
            assert transitions.labels(to="Healthy").get() == 1

    run(scenario)


def test_library_failure_mid_run_marks_all_unhealthy_then_recovers(
    short_tmp: Path, fake_devices: Path
) -> None:
    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices) as (app, kubelet):
            text = fake_devices.read_text()
            fake_devices.write_text(text.replace("boards:", "libraryError: ixml returned 999\nboards:"))
            await kubelet.wait_for(
                lambda: set(kubelet.last_update().health.values()) == {"Unhealthy"}, what="all Unhealthy"
            )
            assert len(kubelet.last_update().devices) == 2  # last known devices kept, not dropped
            assert any("ixml returned 999" in p for p in app.problems())
            fake_devices.write_text(text)
            await kubelet.wait_for(
                lambda: set(kubelet.last_update().health.values()) == {"Healthy"}, what="recovered"
            )
            assert app.problems() == []

    run(scenario)


def test_config_hot_reload_and_invalid_config_kept(short_tmp: Path, fake_devices: Path) -> None:
    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices) as (app, kubelet):
            config = short_tmp / "ix-config"
            config.write_text(FAST_HEALTH + "flags:\n  splitboard: true\n")
            await kubelet.wait_for(lambda: len(kubelet.last_update().devices) == 4, what="4 devices")
            config.write_text(FAST_HEALTH + "sharing:\n  timeSlicing:\n    replicas: 0\n")
            await kubelet.wait_for(
                lambda: app.metrics.config_reloads.labels(result="error").get() == 1,
                what="rejection",
            )
            await asyncio.sleep(0.3)
            assert len(kubelet.last_update().devices) == 4
            assert app.config.splitboard is True

    run(scenario)


def test_kubelet_restart_deleting_sockets_re_registers(short_tmp: Path, fake_devices: Path) -> None:
    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices) as (app, kubelet):
            restarted = time.monotonic()
            await kubelet.restart()
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 2, timeout=5, what="re-registration")
            assert kubelet.registrations[1].at - restarted < 2.0
            await kubelet.wait_for(lambda: kubelet.last_update().generation == 2, what="new ListAndWatch")
            assert (kubelet.directory / "iluvatar-gpu.sock").is_socket()
            assert app.registrar.registered

    run(scenario)


def test_kubelet_sock_recreated_alone_re_registers(short_tmp: Path, fake_devices: Path) -> None:
    """Only kubelet.sock is replaced (our socket survives): an inode comparison could miss it."""

    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices) as (_app, kubelet):
            await kubelet.stop()
            kubelet.socket.unlink(missing_ok=True)  # grpc removes it on stop already
            await kubelet.start()
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 2, timeout=5, what="re-registration")

    run(scenario)


def test_plugin_started_before_kubelet_registers_when_it_appears(short_tmp: Path, fake_devices: Path) -> None:
    async def scenario() -> None:
        directory = short_tmp / "dp"
        directory.mkdir()
        config_path = write_config(short_tmp, FAST_HEALTH)
        app = PluginApp(
            PluginSettings(device_plugin_dir=directory, config_path=config_path),
            load_plugin_config(config_path).runtime(),
            fake_backend(fake_devices),
        )
        task = asyncio.create_task(app.run())
        await asyncio.sleep(0.3)
        assert not app.registrar.registered
        kubelet = FakeKubelet(directory)
        await kubelet.start()
        try:
            await kubelet.wait_for(lambda: kubelet.updates, what="registration after kubelet start")
        finally:
            app.request_stop("done")
            await asyncio.wait_for(task, 10)
            await kubelet.stop()
        assert not (directory / "iluvatar-gpu.sock").exists()

    run(scenario)


def test_kubelet_restart_detected_without_inotify(
    short_tmp: Path, fake_devices: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The polling fallback (no inotify): own socket gone → serve and register again."""
    from ix_gpu.plugin.server.socket_watch import SocketWatch

    def no_inotify(self: SocketWatch) -> None:
        self.using_inotify = False

    monkeypatch.setattr(SocketWatch, "_open_inotify", no_inotify)

    async def scenario() -> None:
        async with plugin_and_kubelet(short_tmp, fake_devices) as (app, kubelet):
            assert not app.registrar.watch.using_inotify
            await kubelet.restart()
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 2, timeout=5, what="re-registration")

    run(scenario)
