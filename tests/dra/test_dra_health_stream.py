"""The DRA plugin's health stream (``NodeWatchResources``) over its real unix socket, read with
grpcio as the kubelet reads it: GetInfo offers it, a stream gets the pool's health at once, again
when a chip turns unhealthy and when it recovers, and in between at least every health interval,
each report stamped with its read time and a timeout the kubelet turns stale reports Unknown by."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from ix_gpu.dra.api import dra_health_v1_pb2 as health_v1
from ix_gpu.dra.api import dra_health_v1_pb2_grpc as health_v1_grpc
from ix_gpu.dra.api import dra_health_v1alpha1_pb2 as health_v1alpha1
from ix_gpu.dra.api import dra_health_v1alpha1_pb2_grpc as health_v1alpha1_grpc
from ix_gpu.dra.api import pluginregistration_v1_pb2 as reg
from ix_gpu.dra.api import pluginregistration_v1_pb2_grpc as reg_grpc
from ix_gpu.kube.apiserver import ApiServer
from tests.dra.dra_testkit import NODE, running, settings
from tests.dra.fake_resource_api import FakeResourceApi

VERSIONS = {"v1": (health_v1, health_v1_grpc), "v1alpha1": (health_v1alpha1, health_v1alpha1_grpc)}


def report(response: Any, messages: Any) -> dict[str, tuple[str, str]]:
    """device → (health name, message), checking the pool and the stamps on the way."""
    found = {}
    for device in response.devices:
        assert device.device.pool_name == NODE
        assert abs(device.last_updated_time - time.time()) < 5, device
        assert device.health_check_timeout_seconds == 15  # three 0.2 s intervals, at least 15 s
        found[device.device.device_name] = (messages.HealthStatus.Name(device.health), device.message)
    return found


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_a_chip_turning_unhealthy_and_back_reaches_the_stream(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer], version: str
) -> None:
    _, api = resource_api
    config = settings(short_tmp)
    messages, stubs = VERSIONS[version]
    healthy_text = fake_devices.read_text()
    # The second chip (minor 1) reports over-temperature.
    sick_text = healthy_text.replace("health: 0", "health: 4", 2).replace("health: 4", "health: 0", 1)

    async def scenario() -> tuple[list[str], list[dict[str, tuple[str, str]]], float]:
        async with running(config, fake_devices, api):
            registration = grpc.aio.insecure_channel(f"unix://{config.registration_socket}")
            info = await reg_grpc.RegistrationStub(registration).GetInfo(reg.InfoRequest())  # type: ignore[no-untyped-call]
            await registration.close()
            channel = grpc.aio.insecure_channel(f"unix://{config.dra_socket}")
            stream = stubs.DRAResourceHealthStub(channel).NodeWatchResources(
                messages.NodeWatchResourcesRequest()
            )  # type: ignore[no-untyped-call]
            seen = [report(await stream.read(), messages)]
            fake_devices.write_text(sick_text)
            started = time.monotonic()
            while seen[-1]["gpu-1"][0] != "UNHEALTHY":
                seen.append(report(await asyncio.wait_for(stream.read(), 5), messages))
            to_unhealthy = time.monotonic() - started
            fake_devices.write_text(healthy_text)
            while seen[-1]["gpu-1"][0] != "HEALTHY":
                seen.append(report(await asyncio.wait_for(stream.read(), 5), messages))
            # Nothing changes now: reports keep coming, one per interval, with fresh stamps.
            quiet = [report(await asyncio.wait_for(stream.read(), 2), messages) for _ in range(3)]
            stream.cancel()
            await channel.close()
            return list(info.supported_versions), seen + quiet, to_unhealthy

    versions, seen, to_unhealthy = asyncio.run(scenario())
    assert versions == ["v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
    assert seen[0] == {name: ("HEALTHY", "") for name in ("gpu-0", "gpu-1", "gpu-2", "gpu-3")}
    sick = next(r for r in seen if r["gpu-1"][0] == "UNHEALTHY")
    assert sick["gpu-1"] == ("UNHEALTHY", "over temperature (health 0x4)"), sick
    assert all(sick[name] == ("HEALTHY", "") for name in ("gpu-0", "gpu-2", "gpu-3"))
    assert seen[-1] == seen[0]
    assert to_unhealthy < 2, to_unhealthy  # a few 0.2 s health rounds


def test_a_kubelet_that_goes_away_leaves_the_plugin_serving(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    """Streams opened and dropped (as a restarting kubelet does) cost nothing lasting: a new one
    gets its first report at once."""
    _, api = resource_api
    config = settings(short_tmp)

    async def scenario() -> int:
        async with running(config, fake_devices, api):
            for _ in range(5):
                channel = grpc.aio.insecure_channel(f"unix://{config.dra_socket}")
                stream = health_v1_grpc.DRAResourceHealthStub(channel).NodeWatchResources(  # type: ignore[no-untyped-call]
                    health_v1.NodeWatchResourcesRequest()
                )
                await asyncio.wait_for(stream.read(), 2)
                await channel.close()
            channel = grpc.aio.insecure_channel(f"unix://{config.dra_socket}")
            stream = health_v1_grpc.DRAResourceHealthStub(channel).NodeWatchResources(  # type: ignore[no-untyped-call]
                health_v1.NodeWatchResourcesRequest()
            )
            first = await asyncio.wait_for(stream.read(), 2)
            await channel.close()
            return len(first.devices)

    assert asyncio.run(scenario()) == 4
