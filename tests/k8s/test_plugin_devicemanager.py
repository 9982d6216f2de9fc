"""The real ``ix-gpu plugin`` process judged by the kubelet's own device manager (kubelet-harness):
the seed's capacities, Allocate's run options, re-registration after a kubelet restart, health
flips from the fake devices file and the all-Unhealthy farewell on SIGTERM."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.k8s.k8s_tier import KubeletHarness
from tests.k8s.plugin_inputs import RESOURCE, chip_uuids, devices_yaml, example_devices, poll, seed_config
from tests.support.paths import ROOT
from tests.support.plugin_process import PluginProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

REGISTER_S = 20.0
"""Deadline for a plugin's (re-)registration; the measured times are printed."""

MINOR = {c["uuid"]: c["minor"] for b in example_devices()["boards"] for c in b["chips"]}
CONTROL_NODES = example_devices()["controlNodes"]
CDI_SCHEMA = json.loads((ROOT / "tests" / "node" / "data" / "cdi-spec.schema.json").read_text())

StartPlugin = Callable[..., tuple[KubeletHarness, PluginProcess]]


@pytest.fixture
def start_plugin(
    kubelet_harness: Callable[..., KubeletHarness],
    k8s_log_dir: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[StartPlugin]:
    """``start_plugin(devices, config, resource=RESOURCE)``: a fresh device manager, then the plugin
    serving into its directory; returns both once ``resource`` is registered with at least one device."""
    plugins: list[PluginProcess] = []
    test = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)[:60]

    def start(devices: str, config: str, resource: str = RESOURCE) -> tuple[KubeletHarness, PluginProcess]:
        harness = kubelet_harness()
        n = len(plugins)
        plugin = PluginProcess(
            tmp_path / f"plugin{n}",
            harness.dir,
            devices,
            config,
            k8s_log_dir,
            name=f"ix-gpu-plugin-{test}-{n}",
        ).start()
        plugins.append(plugin)
        _, took = poll(harness, lambda r: r["capacity"].get(resource, 0) > 0, REGISTER_S, "registration")
        print(f"registered in {took:.2f}s")
        return harness, plugin

    yield start
    for plugin in plugins:
        plugin.stop()


def counts(reply: dict[str, Any]) -> tuple[int, int]:
    return reply["capacity"].get(RESOURCE, 0), reply["allocatable"].get(RESOURCE, 0)


def healthy_ids(reply: dict[str, Any]) -> set[str]:
    return set(reply["healthy_devices"].get(RESOURCE, {}))


def allocate(harness: KubeletHarness, pod: str, count: int) -> dict[str, Any]:
    return harness.allocate(f"{pod}-uid/{pod}", "main", {RESOURCE: count})


# --------------------------------------------------------------------------- the seed's numbers


@pytest.mark.parametrize(
    ("boards", "splitboard", "replicas", "expected_ids"),
    [
        pytest.param(1, False, None, ["e00"], id="one-board-1"),
        pytest.param(1, True, None, ["e00", "e01"], id="one-board-splitboard-2"),
        pytest.param(None, False, None, ["e00", "e02"], id="example-2"),
        pytest.param(None, True, None, ["e00", "e01", "e02", "e03"], id="example-splitboard-4"),
        pytest.param(
            None, False, 4, [f"e0{b}::{i}" for b in (0, 2) for i in range(4)], id="two-gpus-replicas4-8"
        ),
    ],
)
def test_capacity_is_the_seeds(
    start_plugin: StartPlugin,
    boards: int | None,
    splitboard: bool,
    replicas: int | None,
    expected_ids: list[str],
) -> None:
    harness, _ = start_plugin(devices_yaml(boards), seed_config(splitboard=splitboard, replicas=replicas))
    reply = harness.capacity()
    # Device IDs: a chip's UUID (splitboard), a board's first chip's UUID, "<id>::<replica>" when shared.
    prefix = "GPU-7d0d7c1e-6f0a-5a4c-9b51-0a1b2c3d4"
    assert counts(reply) == (len(expected_ids), len(expected_ids)), reply
    assert healthy_ids(reply) == {prefix + i for i in expected_ids}


# --------------------------------------------------------------------------- Allocate


def test_allocate_two_gives_device_nodes_and_visible_devices(start_plugin: StartPlugin) -> None:
    harness, _ = start_plugin(devices_yaml(), seed_config(splitboard=True))
    first = allocate(harness, "a", 2)
    assert first["ok"], first
    envs = {e["name"]: e["value"] for e in first["envs"]}
    visible = envs["IX_VISIBLE_DEVICES"].split(",")
    assert sorted(visible) == first["device_ids"][RESOURCE]
    # GetPreferredAllocation, honoured by the real kubelet: both chips on one board.
    assert sorted(visible) in chip_uuids()
    expected_nodes = [f"/dev/iluvatar{MINOR[u]}" for u in visible] + CONTROL_NODES
    assert sorted(first["devices"], key=lambda d: d["host_path"]) == [
        {"host_path": p, "container_path": p, "permissions": "rw"} for p in sorted(expected_nodes)
    ]
    assert first["mounts"] == [] and first["cdi_devices"] == []

    too_many = allocate(harness, "b", 3)
    assert not too_many["ok"]
    assert "Requested: 3, Available: 2" in too_many["error"], too_many

    second = allocate(harness, "c", 2)
    assert second["ok"], second
    assert set(second["device_ids"][RESOURCE]).isdisjoint(visible)
    assert not allocate(harness, "d", 1)["ok"]


# --------------------------------------------------------------------------- kubelet restart


def test_kubelet_restart_plugin_reregisters(start_plugin: StartPlugin) -> None:
    harness, plugin = start_plugin(devices_yaml(), seed_config(splitboard=True))
    before = allocate(harness, "a", 2)
    assert before["ok"], before
    restarted = harness.call("restart")
    assert restarted["ok"], restarted
    just_after = counts(harness.capacity())
    reply, took = poll(harness, lambda r: counts(r) == (4, 4), REGISTER_S, "re-registration")
    print(f"re-registered {took:.2f}s after the kubelet restart (capacity right after restart: {just_after})")
    assert healthy_ids(reply) == {u for board in chip_uuids() for u in board}
    assert plugin.socket.is_socket()
    # The restarted kubelet read its checkpoint: pod a keeps its chips, the rest are still free.
    after = allocate(harness, "b", 2)
    assert after["ok"], after
    assert set(after["device_ids"][RESOURCE]).isdisjoint(before["device_ids"][RESOURCE])
    assert not allocate(harness, "c", 1)["ok"]


# --------------------------------------------------------------------------- health


def test_unhealthy_chip_leaves_allocatable_and_recovers(start_plugin: StartPlugin) -> None:
    interval, recover = 0.5, 3
    harness, plugin = start_plugin(
        devices_yaml(), seed_config(splitboard=True, interval_s=interval, recover=recover)
    )
    poll(harness, lambda r: counts(r) == (4, 4), REGISTER_S, "all four chips healthy")
    sick = chip_uuids()[0][1]

    plugin.set_devices(devices_yaml(unhealthy=[sick]))
    reply, dropped = poll(harness, lambda r: counts(r) != (4, 4), 10, "health flip")
    print(f"allocatable dropped {dropped:.2f}s after the fake devices file changed")
    assert counts(reply) == (4, 3), reply
    assert sick not in healthy_ids(reply)
    assert dropped <= 1.0 + interval, f"took {dropped:.2f}s, more than 1 s + the {interval} s interval"

    plugin.set_devices(devices_yaml())
    reply, recovered = poll(harness, lambda r: counts(r) != (4, 3), 10, "recovery")
    print(f"recovered {recovered:.2f}s after the fake devices file was healthy again")
    assert counts(reply) == (4, 4), reply
    # Hysteresis: recoverAfter healthy checks, one interval apart, not the first healthy read.
    assert (recover - 1) * interval <= recovered <= recover * interval + 1.0, f"{recovered:.2f}s"


# --------------------------------------------------------------------------- SIGTERM


def test_sigterm_leaves_devices_unhealthy_in_the_kubelet(start_plugin: StartPlugin) -> None:
    harness, plugin = start_plugin(devices_yaml(), seed_config())
    assert counts(harness.capacity()) == (2, 2)
    assert plugin.terminate() == 0, plugin.log_tail()
    reply, took = poll(harness, lambda r: counts(r)[1] == 0, 5, "all devices Unhealthy")
    print(f"allocatable 0 {took:.2f}s after the plugin exited")
    assert counts(reply) == (2, 0), reply
    assert healthy_ids(reply) == set()
    assert not plugin.socket.exists()
    assert not allocate(harness, "a", 1)["ok"]


# --------------------------------------------------------------------------- NVIDIA's config format

SHARED = RESOURCE + ".shared"


def nvidia_config(
    replicas: int, *, splitboard: bool = False, fail_requests_greater_than_one: bool = False
) -> str:
    """NVIDIA k8s-device-plugin's config file (api/config/v1) as its README writes it, naming our
    resource; ``splitboard`` adds the seed's flag beside NVIDIA's."""
    return (
        "version: v1\n"
        "flags:\n"
        "  migStrategy: none\n" + ("  splitboard: true\n" if splitboard else "") + "sharing:\n"
        "  timeSlicing:\n"
        "    renameByDefault: true\n"
        f"    failRequestsGreaterThanOne: {'true' if fail_requests_greater_than_one else 'false'}\n"
        "    resources:\n"
        f"    - name: {RESOURCE}\n"
        f"      replicas: {replicas}\n"
    )


@pytest.mark.parametrize(("splitboard", "units"), [(False, 2), (True, 4)], ids=["boards", "splitboard"])
def test_nvidia_format_rename_by_default_advertises_shared_capacity(
    start_plugin: StartPlugin, splitboard: bool, units: int
) -> None:
    harness, _ = start_plugin(devices_yaml(), nvidia_config(4, splitboard=splitboard), resource=SHARED)
    reply, _ = poll(harness, lambda r: r["capacity"].get(SHARED, 0) == units * 4, REGISTER_S, "capacity")
    # boards (or chips, split) x 4 replicas, all under <resource>.shared; nothing under the old name.
    assert reply["capacity"][SHARED] == reply["allocatable"][SHARED] == units * 4, reply
    assert RESOURCE not in reply["capacity"], reply
    assert len(reply["healthy_devices"][SHARED]) == units * 4
    assert all("::" in device for device in reply["healthy_devices"][SHARED])


def test_nvidia_format_fail_requests_greater_than_one(start_plugin: StartPlugin) -> None:
    harness, _ = start_plugin(
        devices_yaml(), nvidia_config(4, fail_requests_greater_than_one=True), resource=SHARED
    )
    two = harness.allocate("a-uid/a", "main", {SHARED: 2})
    assert not two["ok"], two
    print(f"the kubelet's answer to 2 shared devices: {two['error']}")
    assert "maximum request size for shared resources is 1" in two["error"], two
    assert "failRequestsGreaterThanOne" in two["error"], two
    one = harness.allocate("b-uid/b", "main", {SHARED: 1})
    assert one["ok"], one
    (device,) = one["device_ids"][SHARED]
    assert "::" in device


# --------------------------------------------------------------------------- CDI


def test_cdi_strategy_the_kubelet_gets_cdi_names_that_resolve_in_the_written_spec(
    start_plugin: StartPlugin, tmp_path: Path
) -> None:
    """deviceListStrategy: cdi: the plugin writes the spec before it advertises, Allocate answers
    fully qualified CDI names (no device specs; the spec has the nodes) plus the visible-devices
    variable, and every name the kubelet reports resolves to a device of the spec, which is valid
    against the schema written from the CDI spec's documented fields."""
    spec_dir = tmp_path / "cdi"
    cdi = f"deviceListStrategy: cdi\ncdi:\n  specDir: {spec_dir}\n"
    config = seed_config(splitboard=False, replicas=2) + cdi
    harness, _ = start_plugin(devices_yaml(), config)
    spec_file = spec_dir / "iluvatar.com-gpu.json"
    spec = json.loads(spec_file.read_text())
    jsonschema.validate(spec, CDI_SCHEMA)
    names = {device["name"]: device for device in spec["devices"]}
    assert len(names) == 4  # two boards x 2 replicas

    reply = allocate(harness, "a", 1)
    assert reply["ok"], reply
    assert reply["devices"] == [] and reply["mounts"] == []
    (cdi_name,) = reply["cdi_devices"]  # the harness reports the names
    kind, _, name = cdi_name.partition("=")
    assert kind == RESOURCE and name in names
    (device_id,) = reply["device_ids"][RESOURCE]
    assert name == device_id
    envs = {e["name"]: e["value"] for e in reply["envs"]}
    board_chips = next(chips for chips in chip_uuids() if device_id.startswith(chips[0]))
    assert sorted(envs["IX_VISIBLE_DEVICES"].split(",")) == sorted(board_chips)
    nodes = [n["path"] for n in names[name]["containerEdits"]["deviceNodes"]]
    assert sorted(nodes) == sorted(f"/dev/iluvatar{MINOR[u]}" for u in board_chips)
    # No variable in the spec (it would replace the pod's); the driver's libraries go into the
    # container's linker cache through the hook.
    assert "env" not in spec["containerEdits"]
    (hook,) = spec["containerEdits"]["hooks"]
    assert hook["hookName"] == "createContainer" and hook["args"][-1] == "/usr/local/corex/lib64"


def test_cdi_strategy_with_an_unwritable_spec_dir_advertises_nothing(
    kubelet_harness: Callable[..., KubeletHarness], k8s_log_dir: Path, tmp_path: Path
) -> None:
    """Pods must wait, not fail with "unresolvable CDI devices": no spec, no devices."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    config = seed_config() + f"deviceListStrategy: cdi\ncdi:\n  specDir: {blocker}/cdi\n"
    harness = kubelet_harness()
    name = "ix-gpu-plugin-cdi-blocked"
    plugin = PluginProcess(tmp_path / "plugin", harness.dir, devices_yaml(), config, k8s_log_dir, name=name)
    plugin.start()
    try:
        wait_until(
            lambda: "cannot write the CDI spec" in plugin.log.read_text(),
            "the plugin to say it cannot write the spec",
            REGISTER_S,
            details=plugin.log_tail,
        )
        time.sleep(1.0)  # a registration, had there been one with devices, has happened by now
        assert harness.capacity()["capacity"].get(RESOURCE, 0) == 0
    finally:
        plugin.stop()


# --------------------------------------------------------------------------- a rolling update


def test_a_second_instance_takes_over_without_the_allocatable_dropping(
    start_plugin: StartPlugin, tmp_path: Path, k8s_log_dir: Path
) -> None:
    """A DaemonSet rolling with maxSurge: the new pod's plugin starts and registers while the old
    one still serves, then the old one is stopped. The device manager must count the node's devices
    allocatable throughout (sampled every 20 ms): a GPU pod admitted meanwhile would otherwise be
    rejected (UnexpectedAdmissionError), and the scheduler sees the node empty."""
    harness, old = start_plugin(devices_yaml(), seed_config())
    assert counts(harness.capacity()) == (2, 2)
    seen: list[int] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            seen.append(counts(harness.capacity())[1])
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    new = PluginProcess(
        tmp_path / "plugin-new", harness.dir, devices_yaml(), seed_config(), k8s_log_dir,
        name="ix-gpu-plugin-rolling-new", extra_args=("--socket-id", "new"),
    ).start()  # fmt: skip
    try:
        registered = "registered iluvatar.com/gpu"
        wait_until(lambda: registered in new.log.read_text(), "the new instance's registration", REGISTER_S)
        time.sleep(0.5)
        assert old.terminate() == 0, old.log_tail()
        time.sleep(3)
    finally:
        sampling.set()
        sampler.join()
    print(f"allocatable over the handover ({len(seen)} samples): min {min(seen)}, last {seen[-1]}")
    assert min(seen) == 2 and counts(harness.capacity()) == (2, 2), seen
    assert allocate(harness, "after", 1)["ok"]
    new.stop()
