"""The DRA plugin against an API server that misbehaves: answers cut off mid-body, answers that
are not JSON, 500s, 403s on every write, and an exception nobody expected inside its health loop.
No task dies, health keeps being refreshed, each fault is counted, writes back off, and shutdown
still removes the sockets."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from ix_gpu.devicemodel.labels import GPU_ALLOCATION
from ix_gpu.dra.app import DraApp
from ix_gpu.dra.slices import RESOURCE_SLICES
from ix_gpu.kube.apiserver import ApiServer
from ix_gpu.node.fake_devices_file import fake_backend
from ix_gpu.process.backoff import Backoff
from tests.dra.dra_testkit import DRIVER, NODE, running, settings
from tests.dra.fake_resource_api import FakeResourceApi
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.timeout(60)

SLICE_PATH = f"{RESOURCE_SLICES}/{NODE}-{DRIVER}"
NODES = "/api/v1/nodes"  # the node is watched there


def label_dra(fake: FakeResourceApi) -> None:
    with fake.lock:
        fake.nodes[NODE]["metadata"]["labels"] = {GPU_ALLOCATION: "dra"}


def tainted(fake: FakeResourceApi) -> set[str]:
    with fake.lock:
        stored = fake.slices.get(f"{NODE}-{DRIVER}")
        devices: list[dict[str, Any]] = [] if stored is None else stored["spec"]["devices"]
        return {d["name"] for d in devices if d.get("taints")}


def set_health(devices_file: Path, index: int, value: int) -> None:
    lines = devices_file.read_text().splitlines(keepends=True)
    seen = -1
    for i, line in enumerate(lines):
        if line.strip().startswith("health:"):
            seen += 1
            if seen == index:
                lines[i] = line[: line.index("health:")] + f"health: {value}\n"
    devices_file.write_text("".join(lines))


@pytest.mark.parametrize("fault", ["cut", "junk", "500"])
def test_a_misbehaving_apiserver_is_counted_and_survived_and_shutdown_removes_the_sockets(
    fault: str, short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    label_dra(fake)
    config = settings(short_tmp)

    async def scenario() -> DraApp:
        async with running(config, fake_devices, api) as app:
            await wait_until_async(lambda: fake.slices, "slice published")
            fake.faults.update({SLICE_PATH: fault, NODES: fault})
            set_health(fake_devices, 1, 4)  # chip 1 over temperature, while the apiserver is broken
            await wait_until_async(
                lambda: app.api_errors["slice_write"] >= 2 and app.api_errors["node_read"] >= 2,
                "faults counted",
            )
            await wait_until_async(
                lambda: any(not d.healthy for d in app.devices.values()), "health refreshed"
            )
            assert app.allocation.allowed, "a node watch that fails keeps the last answer"
            # (a "cut" or "junk" watch is accepted, then breaks: between the two there is no error)
            await wait_until_async(lambda: app.node_reader.last_error() is not None, "the watch's error")
            assert tainted(fake) == set()
            fake.faults.clear()
            await wait_until_async(
                lambda: tainted(fake), "the taint published once the apiserver answers", 10
            )
            assert app.health_loop.crashes == 0, "an apiserver fault is handled, not a crash"
            return app

    app = asyncio.run(scenario())
    assert len(tainted(fake)) == 1
    assert not app.settings.dra_socket.exists() and not app.settings.registration_socket.exists()


def test_an_unexpected_exception_restarts_the_health_loop_and_shutdown_still_runs(
    short_tmp: Path,
    fake_devices: Path,
    resource_api: tuple[FakeResourceApi, ApiServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, api = resource_api
    label_dra(fake)
    config = settings(short_tmp)

    async def scenario() -> DraApp:
        async with running(config, fake_devices, api) as app:
            app.health_loop.backoff = Backoff(first=0.05, cap=0.1)
            real = app.claims.close_idle
            calls = 0

            def once_broken(*args: Any, **kwargs: Any) -> None:
                nonlocal calls
                calls += 1
                if calls == 1:
                    raise TypeError("'NoneType' object is not subscriptable")
                real(*args, **kwargs)

            app.claims.close_idle = once_broken  # type: ignore[method-assign]
            await wait_until_async(lambda: app.health_loop.crashes == 1, "the crash counted")
            set_health(fake_devices, 2, 4)
            await wait_until_async(lambda: tainted(fake), "the restarted loop publishes health", 10)
            return app

    with caplog.at_level(logging.ERROR):
        app = asyncio.run(scenario())
    assert app.health_loop.crashes == 1
    crash = [r for r in caplog.records if "the health loop failed" in r.getMessage()]
    assert len(crash) == 1 and crash[0].exc_info is not None
    assert not app.settings.dra_socket.exists() and not app.settings.registration_socket.exists()


def test_refused_writes_back_off_to_one_a_minute(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    """An RBAC or policy that refuses every slice write (403), on a clock the test drives: the
    health loop ticks every 5 s; the slice is tried at most twice a minute after the first."""
    fake, api = resource_api
    label_dra(fake)
    fake.denied.add(SLICE_PATH)
    app = DraApp(settings(short_tmp), fake_backend(fake_devices), api)
    now = [0.0]
    app.publish_retry = Backoff(first=1.0, cap=60.0, clock=lambda: now[0])
    app.refresh()
    app.node_reader.start()
    try:
        assert app.node_reader.wait_synced(5) and app.check_allocation().allowed
        per_minute = []
        for _minute in range(5):
            before = fake.count("GET", SLICE_PATH)
            for _tick in range(12):
                assert app.publish() is False
                now[0] += 5
            per_minute.append(fake.count("GET", SLICE_PATH) - before)
        assert per_minute[0] >= 4, f"the first retries come within seconds: {per_minute}"
        assert all(n <= 2 for n in per_minute[1:]), per_minute
        assert app.api_errors["slice_write"] == sum(per_minute)
        fake.denied.clear()
        now[0] += app.publish_retry.remaining()
        assert app.publish() is True
    finally:
        app.node_reader.stop()


def test_taints_the_apiserver_drops_make_unhealthy_devices_leave_the_slice_said_once(
    short_tmp: Path,
    fake_devices: Path,
    resource_api: tuple[FakeResourceApi, ApiServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An apiserver without DRADeviceTaints stores the slice without the taint: the chip would stay
    allocatable. The plugin reads that back and takes the chip out of the slice instead."""
    fake, api = resource_api
    label_dra(fake)
    fake.drop_taints = True
    set_health(fake_devices, 1, 4)
    config = settings(short_tmp)

    async def scenario() -> None:
        async with running(config, fake_devices, api) as app:
            await wait_until_async(lambda: app.unhealthy == "remove", "fallen back to remove")
            await wait_until_async(
                lambda: names(fake) == {"gpu-0", "gpu-2", "gpu-3"}, "chip 1 left the slice"
            )
            set_health(fake_devices, 1, 0)
            await wait_until_async(lambda: len(names(fake)) == 4, "chip 1 back")
            set_health(fake_devices, 2, 4)
            await wait_until_async(lambda: "gpu-2" not in names(fake), "chip 2 left the slice")

    with caplog.at_level(logging.WARNING, logger="ix_gpu.dra.app"):
        asyncio.run(scenario())
    said = [r for r in caplog.records if "dropped the device taints" in r.getMessage()]
    assert len(said) == 1, "said once"


def names(fake: FakeResourceApi) -> set[str]:
    with fake.lock:
        stored = fake.slices.get(f"{NODE}-{DRIVER}")
        return set() if stored is None else {d["name"] for d in stored["spec"]["devices"]}
