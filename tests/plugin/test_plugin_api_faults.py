"""The device plugin against an API server that misbehaves (answers cut off mid-body, not JSON,
500s, 403s on every label write) and an exception nobody expected in its health loop: the node
keeps offering what it offered, no loop dies, each fault is counted in ``/metrics``, label writes
back off, and stopping still removes the socket."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from ix_gpu.config.plugin_config import load_plugin_config
from ix_gpu.devicemodel import labels
from ix_gpu.kube.apiserver import ApiServer
from ix_gpu.node.fake_devices_file import fake_backend
from ix_gpu.node.node_labels import NodeLabeler
from ix_gpu.plugin.server.app import PluginApp
from ix_gpu.plugin.server.settings import PluginSettings
from ix_gpu.process.backoff import Backoff
from tests.dra.fake_resource_api import RESOURCE, FakeResourceApi, serving
from tests.plugin.plugin_testkit import FAST_HEALTH, write_config
from tests.plugin.test_plugin_allocation_gate import DRIVER, NODE, advertised, plugin
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.timeout(60)

SLICES = f"{RESOURCE}/resourceslices"
NODE_PATH = f"/api/v1/nodes/{NODE}"
NODES = "/api/v1/nodes"  # where the node is watched


@pytest.fixture
def cluster() -> Any:
    fake = FakeResourceApi()
    fake.add_node(NODE)
    with serving(fake) as api:
        yield fake, api


def metric(app: PluginApp, family: str, **labels_: str) -> float:
    for line in app.metrics.render().decode().splitlines():
        name, _, value = line.rpartition(" ")
        wanted = family + ("{" + ",".join(f'{k}="{v}"' for k, v in labels_.items()) + "}" if labels_ else "")
        if name == wanted:
            return float(value)
    raise AssertionError(f"no {family} {labels_} in /metrics")


@pytest.mark.parametrize("fault", ["cut", "junk", "500"])
def test_transport_faults_change_nothing_offered_and_are_counted(
    fault: str, short_tmp: Path, fake_devices: Path, cluster: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = cluster

    async def scenario() -> PluginApp:
        async with plugin(short_tmp, fake_devices, api, DRIVER) as (app, kubelet):
            await kubelet.wait_for(lambda: advertised(kubelet) == 2, what="2 boards advertised")
            fake.faults.update({SLICES: fault, NODES: fault})
            await wait_until_async(
                lambda: (
                    metric(app, "ix_gpu_plugin_api_errors_total", call="slice_list") >= 3
                    and metric(app, "ix_gpu_plugin_api_errors_total", call="node_read") >= 3
                ),
                "faults counted",
            )
            fake_devices.write_text(fake_devices.read_text().replace("health: 0", "health: 4", 1))
            await kubelet.wait_for(
                lambda: "Unhealthy" in kubelet.last_update().health.values(), what="health still followed"
            )
            assert advertised(kubelet) == 2
            # Both watches keep failing (a "cut" or "junk" watch is accepted, then breaks: between
            # the two, its note is briefly gone), and neither fails the liveness probe.
            await wait_until_async(lambda: len(app.notes()) == 2, "both failing watches in /healthz")
            assert app.problems() == [], app.problems()
            assert metric(app, "ix_gpu_plugin_loop_crashes_total", loop="health") == 0
            return app

    app = asyncio.run(scenario())
    assert not list(app.settings.device_plugin_dir.glob("*.sock")), "the plugin's socket is removed"


def test_an_unexpected_exception_restarts_the_health_loop(
    short_tmp: Path,
    fake_devices: Path,
    cluster: tuple[FakeResourceApi, ApiServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    _fake, api = cluster

    async def scenario() -> PluginApp:
        async with plugin(short_tmp, fake_devices, api, DRIVER) as (app, kubelet):
            app.loops["health"].backoff = Backoff(first=0.3, cap=0.3, jitter=0)
            real = app.check_once
            calls = 0

            async def once_broken() -> None:
                nonlocal calls
                calls += 1
                if calls == 1:
                    raise KeyError("metadata")
                await real()

            app.check_once = once_broken  # type: ignore[method-assign]
            await wait_until_async(lambda: app.loops["health"].restarting, "the loop waits to restart")
            assert any("health loop failed (KeyError: 'metadata')" in p for p in app.problems())
            await wait_until_async(lambda: calls >= 3, "the loop restarted")
            assert app.problems() == []
            assert metric(app, "ix_gpu_plugin_loop_crashes_total", loop="health") == 1
            assert advertised(kubelet) == 2, "the kubelet kept its devices meanwhile"
            return app

    with caplog.at_level(logging.ERROR):
        app = asyncio.run(scenario())
    crash = [r for r in caplog.records if "the health loop failed" in r.getMessage()]
    assert len(crash) == 1 and crash[0].exc_info is not None
    assert not list(app.settings.device_plugin_dir.glob("*.sock"))


def test_refused_label_writes_back_off_to_one_a_minute(
    short_tmp: Path, fake_devices: Path, cluster: tuple[FakeResourceApi, ApiServer]
) -> None:
    """A policy that refuses the plugin's label PATCH (403), the real plugin's health checks on a
    clock the test drives, every 5 s: at most two writes a minute after the first minute, then
    the labels land as soon as the policy allows them."""
    fake, api = cluster
    fake.denied.add(NODE_PATH)
    config = write_config(short_tmp, FAST_HEALTH + "labels:\n  enabled: true\n")
    (short_tmp / "dp").mkdir()
    app = PluginApp(
        PluginSettings(short_tmp / "dp", config, node_name=NODE, api_server=api),
        load_plugin_config(config).runtime(),
        fake_backend(fake_devices),
    )
    now = [0.0]
    app.labeler.retry = Backoff(first=1.0, cap=60.0, clock=lambda: now[0])

    async def minutes(n: int) -> list[int]:
        counts = []
        for _ in range(n):
            before = fake.count("PATCH", NODE_PATH)
            for _tick in range(12):
                await app.check_once()
                now[0] += 5
            counts.append(fake.count("PATCH", NODE_PATH) - before)
        return counts

    per_minute = asyncio.run(minutes(5))
    assert per_minute[0] >= 4, per_minute
    assert all(n <= 2 for n in per_minute[1:]), per_minute
    assert metric(app, "ix_gpu_plugin_api_errors_total", call="label_write") == sum(per_minute)
    assert "cannot label node" in "\n".join(app.notes())
    fake.denied.clear()
    now[0] += app.labeler.retry.remaining()
    asyncio.run(app.check_once())
    assert fake.nodes[NODE]["metadata"]["labels"][labels.GPU_PRODUCT] == "BI-V150"
    assert app.notes() == []


def test_the_labeler_reports_every_transport_fault_as_a_failed_write(
    cluster: tuple[FakeResourceApi, ApiServer],
) -> None:
    fake, api = cluster
    labeler = NodeLabeler(api, NODE)
    for fault in ("cut", "junk", "500"):
        fake.faults[NODE_PATH] = fault
        labeler.retry = Backoff()
        assert labeler.publish({labels.GPU_PRODUCT: "BI-V150"}) is False
        assert labeler.error is not None
