"""Two instances of the plugin on one node, as a DaemonSet rolling with maxSurge has for a moment:
each serves a socket of its own (``--socket-id``), the one that goes leaves without its farewell
while the other serves, and a plugin the kubelet stops listening to registers again (a kubelet
before 1.37 drops the newest plugin of a resource when an older one's stream ends). The same with
the kubelet's own device manager: tests/k8s/test_plugin_devicemanager.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ix_gpu.config.plugin_config import load_plugin_config
from ix_gpu.node.fake_devices_file import fake_backend
from ix_gpu.node.gpu_reset import SerializedBackend
from ix_gpu.plugin.server.app import PluginApp
from ix_gpu.plugin.server.plugin_sockets import remove_stale, sibling_serving, socket_name_for
from ix_gpu.plugin.server.settings import PluginSettings
from tests.plugin.kubelet_fake import FakeKubelet
from tests.plugin.plugin_testkit import FAST_HEALTH, write_config

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def instance(base: Path, directory: Path, devices: Path, socket_id: str) -> AsyncIterator[PluginApp]:
    base.mkdir(parents=True, exist_ok=True)
    config = write_config(base, FAST_HEALTH)
    app = PluginApp(
        PluginSettings(device_plugin_dir=directory, config_path=config, socket_id=socket_id),
        load_plugin_config(config).runtime(),
        SerializedBackend(fake_backend(devices)),
    )
    task = asyncio.create_task(app.run())
    try:
        yield app
    finally:
        app.request_stop("test finished")
        await asyncio.wait_for(task, 10)


def test_socket_names() -> None:
    assert socket_name_for("iluvatar.com/gpu") == "iluvatar-gpu.sock"
    assert socket_name_for("iluvatar.com/gpu", "0c5e2a6d-1f3b") == "iluvatar-gpu-0c5e2a6d-1f3b.sock"


def test_a_plugin_the_kubelet_stops_listening_to_registers_again(short_tmp: Path, fake_devices: Path) -> None:
    directory = short_tmp / "dp"
    directory.mkdir()

    calls: list[None] = []

    async def scenario() -> None:
        kubelet = FakeKubelet(directory)
        await kubelet.start()
        try:
            async with instance(short_tmp / "a", directory, fake_devices, "a") as app:
                labels_forgotten = app.labeler.forget
                app.registrar.on_registered = lambda: calls.append(labels_forgotten())
                await kubelet.wait_for(lambda: kubelet.updates, 10, "registration")
                await kubelet.disconnect()
                await kubelet.wait_for(lambda: len(kubelet.registrations) == 2, 5, "a second registration")
                await kubelet.wait_for(lambda: len(kubelet.updates) >= 2, 5, "the devices again")
                assert app.registrar.registered
                assert len(calls) == 2, "each registration has the node labelled again"
                assert kubelet.registrations[1].request.endpoint == "iluvatar-gpu-a.sock"
        finally:
            await kubelet.stop()

    asyncio.run(scenario())


def test_the_old_instance_goes_quietly_and_the_new_one_takes_the_kubelet_back(
    short_tmp: Path, fake_devices: Path
) -> None:
    """``old`` registered; ``new`` serves its own socket and registers (the fake kubelet then
    closes ``old``'s stream, which ``old`` must not answer with a registration of its own while
    ``new`` serves); ``old`` stops without its all-Unhealthy farewell; the kubelet, as one before
    1.37 does, drops ``new`` when ``old``'s stream ends; ``new`` registers again."""
    directory = short_tmp / "dp"
    directory.mkdir()

    async def scenario() -> None:
        kubelet = FakeKubelet(directory)
        await kubelet.start()
        try:
            async with instance(short_tmp / "new", directory, fake_devices, "new") as new:
                async with instance(short_tmp / "old", directory, fake_devices, "old") as old:
                    await kubelet.wait_for(lambda: old.registrar.registered, 10, "old registered")
                    await kubelet.wait_for(lambda: new.registrar.registered, 10, "new registered")
                    assert {r.request.endpoint for r in kubelet.registrations} == {
                        "iluvatar-gpu-old.sock",
                        "iluvatar-gpu-new.sock",
                    }
                    await asyncio.sleep(2.5)  # more than the orphan grace: no ping-pong
                    endpoints = [r.request.endpoint for r in kubelet.registrations]
                    assert len(endpoints) == 2, endpoints
                    updates = len(kubelet.updates)
                assert not (directory / "iluvatar-gpu-old.sock").exists()
                assert (directory / "iluvatar-gpu-new.sock").exists()
                assert all(h == "Healthy" for u in kubelet.updates[updates:] for h in u.health.values())
                await kubelet.disconnect()  # what a kubelet before 1.37 does to the current plugin
                await kubelet.wait_for(lambda: len(kubelet.registrations) == 3, 5, "new registered again")
                assert kubelet.registrations[2].request.endpoint == "iluvatar-gpu-new.sock"
        finally:
            await kubelet.stop()

    asyncio.run(scenario())


def test_a_socket_nobody_serves_is_removed_and_one_served_is_not(short_tmp: Path) -> None:
    import socket

    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(short_tmp / "iluvatar-gpu-dead.sock"))
    stale.close()  # the file stays, nobody listens: a plugin killed without cleaning up
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(short_tmp / "iluvatar-gpu-live.sock"))
    live.listen()
    (short_tmp / "other-gpu.sock").touch()  # another resource's: never ours to touch
    try:
        own = short_tmp / "iluvatar-gpu-me.sock"
        assert sibling_serving(short_tmp, "iluvatar.com/gpu", own) == short_tmp / "iluvatar-gpu-live.sock"
        remove_stale(short_tmp, "iluvatar.com/gpu", own)
        assert sorted(p.name for p in short_tmp.iterdir()) == ["iluvatar-gpu-live.sock", "other-gpu.sock"]
    finally:
        live.close()
    assert sibling_serving(short_tmp, "iluvatar.com/gpu", None) is None
