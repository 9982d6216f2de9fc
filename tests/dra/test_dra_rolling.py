"""Two instances of the DRA plugin on one node, as a DaemonSet rolling with ``maxSurge`` has for a
moment (:mod:`ix_gpu.dra.sockets`): each serves and registers on sockets of its own, the kubelet
may prepare a claim through one and unprepare it through the other, only the newer one writes the
node's slices, and a dead instance's sockets are cleared away. With the kubelet's own plugin
manager on real nodes: tests/k8s/test_real_nodes_dra.py (the DRA plugin's rollout)."""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import json
import os
import socket
import time
from pathlib import Path

import grpc
import pytest

from ix_gpu.dra.api import dra_v1_pb2 as dra
from ix_gpu.dra.api import pluginregistration_v1_pb2 as reg
from ix_gpu.dra.api import pluginregistration_v1_pb2_grpc as reg_grpc
from ix_gpu.dra.app import DraSettings
from ix_gpu.dra.sockets import newer_instance_serves
from ix_gpu.kube.apiserver import ApiServer
from tests.dra.dra_testkit import DRIVER, NODE, claim, dra_client, result, running, settings
from tests.dra.fake_resource_api import FakeResourceApi
from tests.support.cli import ix_gpu
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.timeout(60)

SLICE = f"{NODE}-{DRIVER}"
OLD_ID = "0c5e2a6d-0000-4000-8000-00000000000a"
NEW_ID = "0c5e2a6d-0000-4000-8000-00000000000b"
UIDS = [f"1f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f{k}" for k in range(3)]


def instance(root: Path, socket_id: str | None, **changes: object) -> DraSettings:
    return dataclasses.replace(settings(root), socket_id=socket_id, **changes)  # type: ignore[arg-type]


def test_with_an_id_both_sockets_are_the_instances_own_and_get_info_names_its_endpoint(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    _, api = resource_api
    config = instance(short_tmp, OLD_ID)
    assert config.registration_socket == short_tmp / "registry" / f"{DRIVER}-{OLD_ID}-reg.sock"
    assert config.dra_socket == short_tmp / "plugins" / DRIVER / f"dra-{OLD_ID}.sock"
    assert instance(short_tmp, None).dra_socket.name == "dra.sock"

    async def scenario() -> reg.PluginInfo:
        async with running(config, fake_devices, api):
            channel = grpc.aio.insecure_channel(f"unix://{config.registration_socket}")
            info: reg.PluginInfo = await reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest())  # type: ignore[no-untyped-call]
            await channel.close()
            return info

    info = asyncio.run(scenario())
    assert info.name == DRIVER and info.endpoint == str(config.dra_socket)
    # The chart's pod UID is a valid id; a path-like one is a usage error (exit 2, one line).
    answer = ix_gpu("dra", "--socket-id", "../x", env={"NODE_NAME": NODE})
    assert answer.returncode == 2 and "--socket-id" in answer.stderr, answer.stderr


def test_a_claim_prepared_by_one_instance_is_unprepared_by_the_other_and_no_record_is_lost(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    """The checkpoint is one file for both: the new instance unprepares the old one's claim, and
    the old one, writing after that, neither brings that claim back nor drops the new one's."""
    fake, api = resource_api
    for k, uid in enumerate(UIDS):
        fake.add_claim("default", f"c{k}", uid, [result(f"gpu-{k}")])
    old, new = instance(short_tmp, OLD_ID), instance(short_tmp, NEW_ID)

    async def prepare(client: object, k: int) -> str:
        request = dra.NodePrepareResourcesRequest(claims=[claim(UIDS[k], f"c{k}")])
        answer = await client.NodePrepareResources(request)  # type: ignore[attr-defined]
        return str(answer.claims[UIDS[k]].error)

    async def scenario() -> None:
        async with running(old, fake_devices, api), dra_client(old) as to_old:
            assert await prepare(to_old, 0) == ""
            async with running(new, fake_devices, api), dra_client(new) as to_new:
                assert await prepare(to_new, 1) == ""
                gone = await to_new.NodeUnprepareResources(
                    dra.NodeUnprepareResourcesRequest(claims=[claim(UIDS[0], "c0")])
                )
                assert gone.claims[UIDS[0]].error == ""
                assert await prepare(to_old, 2) == ""
                # Asked again, the old instance answers the new one's claim from the file.
                assert await prepare(to_old, 1) == ""

    asyncio.run(scenario())
    recorded = json.loads(old.checkpoint.read_text())["claims"]
    assert sorted(recorded) == sorted(UIDS[1:]), recorded
    specs = sorted(p.name for p in (short_tmp / "cdi").iterdir())
    assert specs == sorted(f"iluvatar.com-gpu-claim-{uid}.json" for uid in UIDS[1:])
    # Claim 1 was read from the API server once, by the new instance: the old one found it recorded.
    assert fake.count("GET", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1") == 1


def test_only_the_newer_instance_writes_the_slices_and_the_older_takes_over_when_it_goes(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    """An upgrade that changes the config: the old instance publishes chips (splitboard), the new
    one boards. While both serve, the slice stays the new one's; with the new one gone (a rollback
    that ends it), the old one publishes its own layout again."""
    fake, api = resource_api
    old, new = instance(short_tmp, OLD_ID), instance(short_tmp, NEW_ID, splitboard=False)

    def names() -> list[str]:
        return [d["name"] for d in fake.slices.get(SLICE, {}).get("spec", {}).get("devices", [])]

    async def scenario() -> list[list[str]]:
        seen: list[list[str]] = []
        async with running(old, fake_devices, api):
            await wait_until_async(lambda: names() == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], "the old layout")
            async with running(new, fake_devices, api):
                await wait_until_async(lambda: names() == ["board-0", "board-2"], "the new layout")
                for _ in range(8):  # several health rounds of both (0.2 s)
                    await asyncio.sleep(0.1)
                    seen.append(names())
            await wait_until_async(
                lambda: names() == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], "the old again", 5
            )
        return seen

    seen = asyncio.run(scenario())
    assert all(layout == ["board-0", "board-2"] for layout in seen), seen


def test_sockets_a_dead_instance_left_are_removed_and_a_live_ones_kept(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    """A pod killed without cleaning up leaves both its sockets: the next instance removes them
    (the kubelet then unregisters the dead endpoint), not the sockets of one that serves."""
    _, api = resource_api
    dead = instance(short_tmp, "dead")
    for path in (dead.registration_socket, dead.dra_socket):
        path.parent.mkdir(parents=True, exist_ok=True)
        bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bound.bind(str(path))  # bound, never listening: what a killed process leaves
        bound.close()
    other_driver = short_tmp / "registry" / "other.example.com-reg.sock"
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(other_driver))
    other.close()
    old, new = instance(short_tmp, OLD_ID), instance(short_tmp, NEW_ID)

    async def scenario() -> tuple[bool, bool, Path | None, Path | None]:
        async with running(old, fake_devices, api), running(new, fake_devices, api):
            kept = old.registration_socket.exists() and old.dra_socket.exists()
            gone = not dead.registration_socket.exists() and not dead.dra_socket.exists()
            newer_than_old = await asyncio.to_thread(newer_instance_serves, old.dra_socket)
            newer_than_new = await asyncio.to_thread(newer_instance_serves, new.dra_socket)
        return kept, gone, newer_than_old, newer_than_new

    kept, gone, newer_than_old, newer_than_new = asyncio.run(scenario())
    assert kept and gone
    assert newer_than_old == new.dra_socket and newer_than_new is None
    assert other_driver.exists(), "another driver's socket is not ours to remove"


def test_stopping_the_registration_socket_goes_first_and_the_service_answers_a_while_more(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    """The kubelet unregisters an instance when its plugin watcher sees the registration socket
    gone; a call it sends to the stopping instance until then is answered, not cut off."""
    _, api = resource_api
    config = instance(short_tmp, OLD_ID, unregister_grace=1.0)

    async def scenario() -> tuple[bool, str]:
        async with running(config, fake_devices, api) as app, dra_client(config) as client:
            app.stop.set()
            await wait_until_async(
                lambda: not config.registration_socket.exists(), "the registration socket gone"
            )
            serving = config.dra_socket.exists()
            answer = await client.NodeUnprepareResources(
                dra.NodeUnprepareResourcesRequest(claims=[claim(UIDS[0], "c0")])
            )
            await wait_until_async(lambda: not config.dra_socket.exists(), "the DRA socket gone", 5)
            return serving, str(answer.claims[UIDS[0]].error)

    serving, error = asyncio.run(scenario())
    assert serving and error == ""


def test_a_checkpoint_lock_held_too_long_costs_the_claim_an_error_not_a_stuck_call(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    """Another instance holding the checkpoint's lock (a write stuck on the disk): the claim's
    prepare fails with the reason after the bound, which the kubelet retries."""
    fake, api = resource_api
    fake.add_claim("default", "c0", UIDS[0], [result("gpu-0")])
    config = instance(short_tmp, OLD_ID)
    config.checkpoint.parent.mkdir(parents=True, exist_ok=True)
    holder = os.open(f"{config.checkpoint}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)

    async def scenario() -> tuple[str, float]:
        async with running(config, fake_devices, api) as app, dra_client(config) as client:
            app.preparer.checkpoint.lock_wait = 0.3
            started = time.monotonic()
            answer = await client.NodePrepareResources(
                dra.NodePrepareResourcesRequest(claims=[claim(UIDS[0], "c0")])
            )
            return str(answer.claims[UIDS[0]].error), time.monotonic() - started

    try:
        error, took = asyncio.run(scenario())
    finally:
        os.close(holder)
    assert "held by another process" in error and took < 3, (error, took)
