"""The DRA plugin's /healthz and /metrics (``--metrics-port``), read over HTTP from the running
plugin while the kubelet (grpcio over its unix sockets) registers it and asks for claims: every
series from the start, registration as the kubelet last said it, each prepare counted by result and
timed, devices by health; /healthz stays 200 with notes for what a restart would not mend."""

from __future__ import annotations

import asyncio
import dataclasses
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ix_gpu.dra.api import dra_v1_pb2 as dra
from ix_gpu.dra.api import pluginregistration_v1_pb2 as reg
from ix_gpu.dra.api import pluginregistration_v1_pb2_grpc as reg_grpc
from ix_gpu.dra.app import DraApp
from ix_gpu.dra.claims import FAILURE_REASONS
from ix_gpu.dra.metrics import DraMetrics, DraState, render_metrics
from ix_gpu.kube.apiserver import ApiServer
from ix_gpu.serving.text_metrics import CONTENT_TYPE
from tests.dra.dra_testkit import claim, dra_client, result, running, settings
from tests.dra.fake_resource_api import FakeResourceApi

pytestmark = pytest.mark.timeout(60)

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
MISSING = "1f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f1"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def get(app: DraApp, path: str) -> tuple[int, str, str]:
    assert app.http_server is not None
    port = app.http_server.sockets[0].getsockname()[1]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.headers["content-type"], answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["content-type"], err.read().decode()


def test_every_series_is_there_from_the_start_at_zero() -> None:
    state = DraState(registered=False, publishing=False, devices={}, api_errors={}, loop_crashes=0)
    found = samples(render_metrics(DraMetrics(), state).decode())
    assert found[("ix_gpu_dra_registered", ())] == 0
    assert found[("ix_gpu_dra_publishing", ())] == 0
    for result_ in ("success", "error"):
        assert found[("ix_gpu_dra_prepares_total", (("result", result_),))] == 0
        assert found[("ix_gpu_dra_unprepares_total", (("result", result_),))] == 0
    for reason in FAILURE_REASONS:  # tests/dra/test_dra_prepare_failures.py counts them
        assert found[("ix_gpu_dra_prepare_failures_total", (("reason", reason),))] == 0
    for reason in ("invalid", "write", "internal"):
        assert found[("ix_gpu_dra_unprepare_failures_total", (("reason", reason),))] == 0
    for call in ("node_read", "slice_write"):
        assert found[("ix_gpu_dra_api_errors_total", (("call", call),))] == 0
    for health in ("Healthy", "Unhealthy"):
        assert found[("ix_gpu_dra_devices", (("health", health),))] == 0
    assert found[("ix_gpu_dra_loop_crashes_total", ())] == 0
    assert found[("ix_gpu_dra_prepare_duration_seconds_count", ())] == 0


def test_metrics_and_healthz_follow_registration_prepares_and_health(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    fake.add_claim("default", "claim", UID, [result("gpu-1")])
    config = dataclasses.replace(settings(short_tmp), metrics_port=0, metrics_host="127.0.0.1")

    async def scenario() -> tuple[list[tuple[int, str, str]], DraApp]:
        seen = []
        async with running(config, fake_devices, api) as app:
            seen.append(await asyncio.to_thread(get, app, "/metrics"))
            seen.append(await asyncio.to_thread(get, app, "/healthz"))
            channel = grpc.aio.insecure_channel(f"unix://{config.registration_socket}")
            stub = reg_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            await stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True))
            await channel.close()
            async with dra_client(config) as client:
                request = dra.NodePrepareResourcesRequest(claims=[claim(UID), claim(MISSING, name="gone")])
                answer = await client.NodePrepareResources(request)
                assert answer.claims[UID].error == "" and answer.claims[MISSING].error
                await client.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(claims=[claim(UID)]))
            seen.append(await asyncio.to_thread(get, app, "/metrics"))
            seen.append(await asyncio.to_thread(get, app, "/healthz"))
            return seen, app

    (before, health_before, after, health_after), app = asyncio.run(scenario())
    status, content_type, text = before
    assert status == 200 and content_type == CONTENT_TYPE
    found = samples(text)
    assert found[("ix_gpu_dra_registered", ())] == 0
    assert found[("ix_gpu_dra_publishing", ())] == 1  # the node is labelled for DRA
    assert found[("ix_gpu_dra_devices", (("health", "Healthy"),))] == 4
    assert health_before[0] == 200
    assert health_before[2].splitlines() == ["ok", "not registered with the kubelet"]

    found = samples(after[2])
    assert found[("ix_gpu_dra_registered", ())] == 1
    assert found[("ix_gpu_dra_prepares_total", (("result", "success"),))] == 1
    assert found[("ix_gpu_dra_prepares_total", (("result", "error"),))] == 1
    assert found[("ix_gpu_dra_prepare_failures_total", (("reason", "read"),))] == 1  # the 404
    assert found[("ix_gpu_dra_unprepares_total", (("result", "success"),))] == 1
    assert found[("ix_gpu_dra_prepare_duration_seconds_count", ())] == 1  # successes are timed
    assert health_after == (200, "text/plain; charset=utf-8", "ok\n")
    assert app.http_server is not None and not app.http_server.is_serving()  # closed with the plugin


def test_healthz_fails_while_the_health_loop_waits_to_restart(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    _, api = resource_api
    config = dataclasses.replace(settings(short_tmp), metrics_port=0, metrics_host="127.0.0.1")

    async def scenario() -> tuple[int, str, str]:
        async with running(config, fake_devices, api) as app:
            app.health_loop.restarting, app.health_loop.last_error = True, "RuntimeError: boom"
            app.health_loop.crashes = 1
            answer = await asyncio.to_thread(get, app, "/healthz")
            metrics = await asyncio.to_thread(get, app, "/metrics")
            assert samples(metrics[2])[("ix_gpu_dra_loop_crashes_total", ())] == 1
            app.health_loop.restarting = False
            return answer

    status, _, body = asyncio.run(scenario())
    assert status == 503
    assert body == "the health loop failed (RuntimeError: boom) and is waiting to restart\n"


def test_a_metrics_port_in_use_stops_the_plugin_with_one_line_and_no_socket(
    short_tmp: Path,
    fake_devices: Path,
    resource_api: tuple[FakeResourceApi, ApiServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    import socket

    from ix_gpu.node.fake_devices_file import fake_backend

    _, api = resource_api
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = dataclasses.replace(settings(short_tmp), metrics_port=port, metrics_host="127.0.0.1")
        code = asyncio.run(DraApp(config, fake_backend(fake_devices), api).run())
    assert code == 1
    assert f"cannot serve /healthz and /metrics on 127.0.0.1:{port}" in caplog.text
    assert not config.registration_socket.exists() and not config.dra_socket.exists()
