"""The DRA plugin over its real unix sockets, with grpcio as the kubelet and a fake API server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import jsonschema
import pytest

from ix_gpu.dra.api import dra_v1_pb2 as dra
from ix_gpu.dra.api import pluginregistration_v1_pb2 as reg
from ix_gpu.dra.api import pluginregistration_v1_pb2_grpc as reg_grpc
from ix_gpu.kube.apiserver import ApiServer
from tests.dra.dra_testkit import DRIVER, NODE, claim, dra_client, result, running, settings
from tests.dra.fake_resource_api import RESOURCE, FakeResourceApi
from tests.support.cli import ix_gpu
from tests.support.waiting import wait_until_async

CDI_SCHEMA = json.loads((Path(__file__).parents[1] / "node" / "data" / "cdi-spec.schema.json").read_text())

pytestmark = pytest.mark.timeout(60)

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
SLICE = f"{NODE}-{DRIVER}"


def test_registration_get_info_names_the_dra_socket(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    _, api = resource_api
    config = settings(short_tmp)

    async def scenario() -> tuple[reg.PluginInfo, dra.NodeUnprepareResourcesResponse]:
        async with running(config, fake_devices, api) as app:
            channel = grpc.aio.insecure_channel(f"unix://{config.registration_socket}")
            stub = reg_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            info = await stub.GetInfo(reg.InfoRequest())
            await stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True))
            await channel.close()
            assert app.registration.registered
            # The endpoint GetInfo names is serving (the kubelet dials it next).
            async with dra_client(config) as client:
                answer = await client.NodeUnprepareResources(
                    dra.NodeUnprepareResourcesRequest(claims=[claim(UID)])
                )
        return info, answer

    info, answer = asyncio.run(scenario())
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(short_tmp / "plugins" / DRIVER / "dra.sock")
    # The node service, then the health streams (tests/dra/test_dra_health_stream.py).
    services = ["v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
    assert list(info.supported_versions) == services
    assert config.registration_socket.name == f"{DRIVER}-reg.sock"
    # Unprepare of a claim the plugin never saw is a success, with an entry for it.
    assert set(answer.claims) == {UID} and answer.claims[UID].error == ""
    assert not config.registration_socket.exists() and not config.dra_socket.exists()


def test_prepare_writes_a_cdi_spec_per_claim_and_is_idempotent(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    fake.add_claim("default", "claim", UID, [result("gpu-1"), result("nic-0", driver="other.example.com")])
    config = settings(short_tmp)

    async def scenario() -> list[dra.NodePrepareResourcesResponse]:
        async with running(config, fake_devices, api), dra_client(config) as client:
            request = dra.NodePrepareResourcesRequest(claims=[claim(UID)])
            return [await client.NodePrepareResources(request) for _ in range(3)]

    answers = asyncio.run(scenario())
    entry = answers[0].claims[UID]
    assert entry.error == ""
    assert [
        (d.pool_name, d.device_name, list(d.request_names), list(d.cdi_device_ids)) for d in entry.devices
    ] == [(NODE, "gpu-1", ["gpu"], [f"iluvatar.com/gpu={UID}-gpu-1"])]
    assert all(a == answers[0] for a in answers[1:])
    # Retries are answered from the checkpoint: the claim was read once.
    assert fake.count("GET", f"{RESOURCE}/namespaces/default/resourceclaims/") == 1
    spec = json.loads((short_tmp / "cdi" / f"iluvatar.com-gpu-claim-{UID}.json").read_text())
    assert spec["kind"] == "iluvatar.com/gpu"
    assert spec["devices"] == [
        {"name": f"{UID}-gpu-1", "containerEdits": {"deviceNodes": [{"path": "/dev/iluvatar1"}]}}
    ]
    # The one variable: the visible devices, which no Allocate carries here. No LD_LIBRARY_PATH
    # (it would replace the pod's); the driver's library directory goes into the linker cache.
    assert spec["containerEdits"]["env"] == ["IX_VISIBLE_DEVICES=GPU-7d0d7c1e-6f0a-5a4c-9b51-0a1b2c3d4e01"]
    (hook,) = spec["containerEdits"]["hooks"]
    assert hook["hookName"] == "createContainer" and hook["args"][-1] == "/usr/local/corex/lib64"
    assert {"path": "/dev/itrctl"} in spec["containerEdits"]["deviceNodes"]
    jsonschema.validate(spec, CDI_SCHEMA)


def test_restart_between_prepare_and_unprepare_still_removes_the_spec(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    fake.add_claim("default", "claim", UID, [result("gpu-0"), result("gpu-2", request="second")])
    config = settings(short_tmp)
    spec = short_tmp / "cdi" / f"iluvatar.com-gpu-claim-{UID}.json"

    async def prepare() -> dra.NodePrepareResourcesResponse:
        async with running(config, fake_devices, api), dra_client(config) as client:
            return await client.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=[claim(UID)]))

    async def after_restart() -> tuple[dra.NodePrepareResourcesResponse, dra.NodeUnprepareResourcesResponse]:
        async with running(config, fake_devices, api), dra_client(config) as client:
            again = await client.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=[claim(UID)]))
            gone = await client.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(claims=[claim(UID)]))
            return again, gone

    first = asyncio.run(prepare())
    assert first.claims[UID].error == "" and spec.exists()
    del fake.claims[("default", "claim")]  # the claim is gone from the API server, as after pod deletion
    again, gone = asyncio.run(after_restart())
    assert again == first  # the restarted plugin answers from its checkpoint
    assert gone.claims[UID].error == ""
    assert not spec.exists()
    assert json.loads(config.checkpoint.read_text())["claims"] == {}


def test_claim_errors_are_per_claim(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api
    fake.add_claim("default", "ok", "uid-ok", [result("gpu-3")])
    fake.add_claim("default", "pending", "uid-pending", None)
    fake.add_claim("default", "replaced", "uid-new", [result("gpu-0")])
    fake.add_claim("default", "elsewhere", "uid-elsewhere", [result("gpu-0", pool="node2")])
    fake.add_claim("default", "absent-device", "uid-absent", [result("gpu-9")])
    config = settings(short_tmp)
    claims = [
        claim("uid-ok", "ok"),
        claim("uid-pending", "pending"),
        claim("uid-old", "replaced"),
        claim("uid-elsewhere", "elsewhere"),
        claim("uid-absent", "absent-device"),
        claim("uid-missing", "missing"),
    ]

    async def scenario() -> dra.NodePrepareResourcesResponse:
        async with running(config, fake_devices, api), dra_client(config) as client:
            return await client.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=claims))

    answer = asyncio.run(scenario())
    errors = {uid: entry.error for uid, entry in answer.claims.items()}
    assert errors["uid-ok"] == ""
    assert "is not allocated" in errors["uid-pending"]
    assert "uid 'uid-new'" in errors["uid-old"]
    assert "pool 'node2'" in errors["uid-elsewhere"]
    assert "gpu-9 is not on this node" in errors["uid-absent"]
    assert "404" in errors["uid-missing"]
    assert set(json.loads(config.checkpoint.read_text())["claims"]) == {"uid-ok"}


@pytest.mark.parametrize(
    ("splitboard", "names", "memory", "chips"),
    [
        (True, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], "32768Mi", 1),
        (False, ["board-0", "board-2"], "65536Mi", 2),
    ],
)
def test_resource_slice_lists_chips_or_boards(
    short_tmp: Path,
    fake_devices: Path,
    resource_api: tuple[FakeResourceApi, ApiServer],
    splitboard: bool,
    names: list[str],
    memory: str,
    chips: int,
) -> None:
    fake, api = resource_api
    config = settings(short_tmp, splitboard=splitboard)

    async def scenario() -> None:
        async with running(config, fake_devices, api):
            await wait_until_async(lambda: SLICE in fake.slices, "the ResourceSlice")
            await asyncio.sleep(0.5)  # a few health rounds: nothing changed, nothing written

    asyncio.run(scenario())
    assert fake.count("POST") == 1 and fake.count("PUT") == 0
    stored = fake.slices[SLICE]
    assert stored["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": f"uid-{NODE}", "controller": True}
    ]
    spec = stored["spec"]
    assert spec["driver"] == DRIVER and spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == names
    first = spec["devices"][0]
    assert first["capacity"] == {"memory": {"value": memory}}
    assert first["attributes"] == {
        "vendor": {"string": "iluvatar"},
        "product": {"string": "BI-V150"},  # the ix-gpu.io/gpu.product label's value
        # A board's own, never its first chip's (tests/dra/test_dra_partitionable.py)
        "uuid": {"string": f"{'' if chips == 1 else 'board-'}GPU-7d0d7c1e-6f0a-5a4c-9b51-0a1b2c3d4e00"},
        "index": {"int": 0},
        "board": {"string": "board0"},
        "chips": {"int": chips},
        "wholeBoard": {"bool": chips == 2},  # a BI-V150 board has two chips
        "defaultForm": {"bool": True},  # the plain layout has one form
        "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
        "resource.kubernetes.io/numaNode": {"int": 0},
        "driverVersion": {"version": "4.1.0"},
    }
    assert all("taints" not in d for d in spec["devices"])


@pytest.mark.parametrize("mode", ["taint", "remove"])
def test_unhealthy_chip_is_tainted_or_removed_and_the_generation_bumped(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer], mode: str
) -> None:
    fake, api = resource_api
    config = settings(short_tmp, unhealthy="taint" if mode == "taint" else "remove")
    healthy_text = fake_devices.read_text()
    # The second chip (minor 1) reports over-temperature.
    sick_text = healthy_text.replace("health: 0", "health: 4", 2).replace("health: 4", "health: 0", 1)

    def generation() -> int:
        stored = fake.slices.get(SLICE)
        return int(stored["spec"]["pool"]["generation"]) if stored else 0

    async def scenario() -> tuple[list[dict[str, object]], list[dict[str, object]]]:
        async with running(config, fake_devices, api):
            await wait_until_async(lambda: generation() == 1, "first slice")
            fake_devices.write_text(sick_text)
            await wait_until_async(lambda: generation() == 2, "slice after the chip failed", timeout=15)
            sick = fake.slices[SLICE]["spec"]["devices"]
            fake_devices.write_text(healthy_text)
            await wait_until_async(lambda: generation() == 3, "slice after recovery", timeout=15)
            return sick, fake.slices[SLICE]["spec"]["devices"]

    sick, recovered = asyncio.run(scenario())
    if mode == "taint":
        assert [d["name"] for d in sick] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
        taints = {d["name"]: d.get("taints") for d in sick}
        assert taints["gpu-1"] == [
            {
                "key": f"{DRIVER}/unhealthy",
                "value": "over-temperature-health-0x4",
                "effect": "NoSchedule",
                "timeAdded": "2026-01-01T00:00:00Z",
            }
        ]
        assert taints["gpu-0"] is None
    else:
        assert [d["name"] for d in sick] == ["gpu-0", "gpu-2", "gpu-3"]
    assert [d["name"] for d in recovered] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert all("taints" not in d for d in recovered)
    assert fake.count("PUT") == 2  # one write per change, none in between


def test_restarted_plugin_continues_the_generation_without_rewriting(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    fake, api = resource_api

    async def once(splitboard: bool) -> None:
        async with running(settings(short_tmp, splitboard=splitboard), fake_devices, api):
            await wait_until_async(
                lambda: SLICE in fake.slices and fake.count("GET", f"{RESOURCE}/resourceslices"), ""
            )
            await asyncio.sleep(0.3)

    asyncio.run(once(True))
    asyncio.run(once(True))
    assert fake.slices[SLICE]["spec"]["pool"]["generation"] == 1 and fake.count("PUT") == 0
    asyncio.run(once(False))
    assert fake.slices[SLICE]["spec"]["pool"]["generation"] == 2
    assert [d["name"] for d in fake.slices[SLICE]["spec"]["devices"]] == ["board-0", "board-2"]


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ([], {}, "--node-name (or NODE_NAME) is required"),
        (["--driver-name", "GPU_Iluvatar"], {"NODE_NAME": "n1"}, "--driver-name 'GPU_Iluvatar'"),
        (["--backend", "fake"], {"NODE_NAME": "n1"}, "--backend fake needs --fake-devices FILE"),
        (["--unhealthy", "ignore"], {"NODE_NAME": "n1"}, "invalid choice"),
        (["--driver-root", "corex"], {"NODE_NAME": "n1"}, "--driver-root 'corex': must be an absolute path"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args: list[str], env: dict[str, str], message: str) -> None:
    done = ix_gpu("dra", *args, env=env)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
