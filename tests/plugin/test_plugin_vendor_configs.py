"""The config files users already have: the ConfigMaps Iluvatar's ix-device-plugin 4.4 ships, its
flags' command-line and environment forms, and the corner cases NVIDIA's own config tests hold."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from ix_gpu.config.input_files import ConfigError
from ix_gpu.config.plugin_config import parse_plugin_config, parse_plugin_yaml, with_vendor_flags
from ix_gpu.config.plugin_flags import VENDOR_FLAGS
from ix_gpu.node import agent
from tests.plugin.kubelet_fake import FakeKubelet
from tests.support.cli import ix_gpu
from tests.support.plugin_process import PluginProcess

SHIPPED = Path(__file__).parent / "fixtures/ix-device-plugin-4.4"
CONFIGMAPS = sorted(p.name for p in SHIPPED.glob("*.yaml"))

pytestmark = pytest.mark.timeout(60)


def test_the_three_shipped_configmaps_are_there() -> None:
    assert CONFIGMAPS == ["helm-chart.yaml", "ix-device-plugin-volcano.yaml", "ix-device-plugin.yaml"]


@pytest.mark.parametrize("name", CONFIGMAPS)
def test_each_shipped_configmap_loads_unchanged_with_its_meaning(name: str) -> None:
    config = parse_plugin_yaml((SHIPPED / name).read_bytes(), name)
    runtime = config.runtime()
    assert runtime.resource_name == "iluvatar.com/gpu"
    assert (runtime.splitboard, runtime.replicas, runtime.reset_gpu) == (False, 1, False)
    assert runtime.usevolcano is (name == "ix-device-plugin-volcano.yaml")


@pytest.mark.parametrize("name", CONFIGMAPS)
def test_ix_gpu_plugin_starts_on_each_and_advertises_what_4_4_does(
    short_tmp: Path, fake_devices: Path, name: str
) -> None:
    """4.4 with ``splitboard: false`` and no sharing: one device per board, under iluvatar.com/gpu
    (examples/fake-devices.yaml: two boards of two chips). The Volcano one (``usevolcano: true``)
    starts too, outside a cluster, saying that Volcano's choice cannot be read there: the file is
    the whole cluster's, so it is a warning, where ``--usevolcano`` is refused
    (:func:`test_usevolcano_on_the_command_line_needs_the_cluster`)."""
    directory = short_tmp / "dp"
    directory.mkdir()

    async def scenario() -> None:
        kubelet = FakeKubelet(directory)
        await kubelet.start()
        plugin = PluginProcess(
            short_tmp, directory, fake_devices.read_text(), (SHIPPED / name).read_text(), short_tmp
        ).start()
        try:
            await kubelet.wait_for(lambda: kubelet.updates, timeout=20, what="registration")
            assert [r.request.resource_name for r in kubelet.registrations] == ["iluvatar.com/gpu"]
            assert len(kubelet.last_update().devices) == 2
            said = (
                "flags.usevolcano is on, but without NODE_NAME and cluster access" in plugin.log.read_text()
            )
            assert said is (name == "ix-device-plugin-volcano.yaml"), plugin.log_tail()
        finally:
            plugin.stop()
            await kubelet.stop()

    asyncio.run(scenario())


def test_usevolcano_on_the_command_line_needs_the_cluster(short_tmp: Path, fake_devices: Path) -> None:
    """As ``--dra-driver``: asked for by the process's own flags (or USE_VOLCANO), it is refused
    where this node's pods cannot be read."""
    (short_tmp / "dp").mkdir()
    for flags, env in ((("--usevolcano",), None), ((), {"USE_VOLCANO": "true"})):
        result = ix_gpu("plugin", "--backend", "fake", "--fake-devices", str(fake_devices),
                        "--device-plugin-dir", str(short_tmp / "dp"), "--metrics-port", "0",
                        "--config", str(SHIPPED / "ix-device-plugin.yaml"), *flags, env=env)  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert "--usevolcano (USE_VOLCANO) needs NODE_NAME and cluster access" in result.stderr


def run_devices(fake_devices: Path, config: Path, *flags: str, env: dict[str, str] | None = None) -> str:
    """``ix-gpu devices`` on the fake backend; its output (checked: exit 0)."""
    result = ix_gpu("devices", "--config", str(config), "--backend", "fake",
                    "--fake-devices", str(fake_devices), *flags, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def devices(fake_devices: Path, config: Path, *flags: str, env: dict[str, str] | None = None) -> int:
    """How many devices ``ix-gpu devices`` says it would advertise (its first line)."""
    found = re.search(
        r"resource iluvatar\.com/gpu, (\d+) devices", run_devices(fake_devices, config, *flags, env=env)
    )
    assert found, "ix-gpu devices printed no summary line"
    return int(found.group(1))


def test_the_flags_and_their_variables_win_over_the_file_as_in_4_4(
    tmp_path: Path, fake_devices: Path
) -> None:
    """Command line over environment over file; an empty variable means false (Go's parse of it)."""
    config = SHIPPED / "ix-device-plugin.yaml"  # splitboard: false
    assert devices(fake_devices, config) == 2
    assert devices(fake_devices, config, env={"SPLIT_BOARD": "true"}) == 4
    assert devices(fake_devices, config, "--splitboard") == 4
    assert devices(fake_devices, config, "--splitboard=false", env={"SPLIT_BOARD": "1"}) == 2
    split = tmp_path / "split.yaml"
    split.write_text("flags:\n  splitboard: true\n")
    assert devices(fake_devices, split) == 4
    assert devices(fake_devices, split, env={"SPLIT_BOARD": ""}) == 2
    bad = ix_gpu("devices", "--config", str(config), "--backend", "fake",
                 "--fake-devices", str(fake_devices), env={"RESET_GPU": "maybe"})  # fmt: skip
    assert bad.returncode == 2 and "RESET_GPU" in bad.stderr and "maybe" in bad.stderr


def test_reset_with_time_slicing_is_refused_naming_both(tmp_path: Path, fake_devices: Path) -> None:
    with pytest.raises(ConfigError, match=r"sharing: .*time-slicing .*flags\.reset_gpu: true"):
        parse_plugin_config({"flags": {"reset_gpu": True}, "sharing": {"timeSlicing": {"replicas": 4}}})
    shared = parse_plugin_config({"sharing": {"timeSlicing": {"replicas": 4}}})
    with pytest.raises(ConfigError, match=r"ix-config with the flags reset_gpu=true: sharing: "):
        with_vendor_flags(shared, {"reset_gpu": True}, "ix-config")
    config = tmp_path / "shared.yaml"
    config.write_text("sharing:\n  timeSlicing:\n    replicas: 4\n")
    refused = ix_gpu("devices", "--config", str(config), "--backend", "fake",
                     "--fake-devices", str(fake_devices), "--reset_gpu")  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "with the flags reset_gpu=true" in refused.stderr and "time-slicing" in refused.stderr
    # One replica shares nothing: 4.4 refuses any replicas with reset_gpu, ix-gpu only sharing.
    assert parse_plugin_config({"flags": {"reset_gpu": True}, "sharing": {"timeSlicing": {"replicas": 1}}})


@pytest.mark.parametrize(
    "time_slicing",
    [{}, {"resources": []}, {"renameByDefault": True}, {"replicas": 2, "resources": []}],
    ids=["empty", "no-resources", "only-rename", "replicas-and-empty-resources"],
)
def test_a_time_slicing_that_shares_nothing_is_refused(time_slicing: dict[str, object]) -> None:
    """As NVIDIA's ``replicas_test.go`` has it: "no resources specified"."""
    with pytest.raises(ConfigError, match=r"sharing\.timeSlicing: .*no resources specified"):
        parse_plugin_config({"sharing": {"timeSlicing": time_slicing}}, "ix-config")


def test_the_agents_flag_table_is_the_schemas() -> None:
    assert agent.VENDOR_FLAGS == VENDOR_FLAGS


def test_help_names_the_vendor_variables() -> None:
    result = ix_gpu("plugin", "--help")
    assert result.returncode == 0
    for key, variable in VENDOR_FLAGS.items():
        assert f"--{key}" in result.stdout and variable in result.stdout
