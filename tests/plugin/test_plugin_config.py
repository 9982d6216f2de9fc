"""The plugin config schema: the seed's ConfigMap verbatim, our additions, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from ix_gpu.config.input_files import ConfigError
from ix_gpu.config.plugin_config import (
    DeviceIdStrategy,
    ReplicaPolicy,
    load_plugin_config,
    parse_plugin_config,
)

# The ``ix-config`` value from the seed's ConfigMap, byte for byte (trailing space included).
SEED_CONFIGMAP_VALUE = "flags:\n  splitboard: false\nsharing:\n  timeSlicing:\n      replicas: 4 \n"


def test_seed_configmap_content_loads_verbatim(tmp_path: Path) -> None:
    path = tmp_path / "ix-config"
    path.write_text(SEED_CONFIGMAP_VALUE)
    config = load_plugin_config(path)
    assert config.flags.splitboard is False
    assert config.replicas == 4
    assert config.resource_name is None


def test_defaults() -> None:
    config = parse_plugin_config({})
    assert config.replicas == 1
    assert config.flags.splitboard is False
    assert config.health.interval_seconds == 5
    assert config.health.recover_after == 3
    assert config.device_id_strategy is DeviceIdStrategy.UUID
    assert config.allocation.replica_policy is ReplicaPolicy.SPREAD
    assert config.labels.enabled is False
    assert config.sharing.time_slicing.fail_requests_greater_than_one is False


def test_our_additions_under_camel_case_keys() -> None:
    config = parse_plugin_config(
        {
            "resourceName": "iluvatar.com/vgpu",
            "sharing": {"timeSlicing": {"replicas": 2, "failRequestsGreaterThanOne": True}},
            "health": {"intervalSeconds": 0.5, "recoverAfter": 5},
            "deviceIdStrategy": "index",
            "allocation": {"replicaPolicy": "pack"},
            "labels": {"enabled": True},
        }
    )
    assert config.resource_name == "iluvatar.com/vgpu"
    assert config.sharing.time_slicing.fail_requests_greater_than_one is True
    assert config.health.interval_seconds == 0.5
    assert config.health.recover_after == 5
    assert config.device_id_strategy is DeviceIdStrategy.INDEX
    assert config.allocation.replica_policy is ReplicaPolicy.PACK
    assert config.labels.enabled is True


@pytest.mark.parametrize("replicas", [0, -1])
def test_replicas_below_one_names_the_field(replicas: int) -> None:
    with pytest.raises(ConfigError, match=r"sharing\.timeSlicing\.replicas: .*at least 1"):
        parse_plugin_config({"sharing": {"timeSlicing": {"replicas": replicas}}})


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        ({"flags": {"splitBoard": True}}, "flags.splitBoard: unknown key"),
        ({"sharing": {"timeslicing": {"replicas": 2}}}, "sharing.timeslicing: unknown key"),
        ({"replica": 4}, "replica: unknown key"),
        ({"deviceIdStrategy": "serial"}, "deviceIdStrategy"),
        ({"health": {"recoverAfter": 0}}, "health.recoverAfter"),
        ({"resourceName": "gpu"}, "resourceName"),
    ],
)
def test_bad_keys_and_values_are_named(doc: dict[str, object], where: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_plugin_config(doc, "ix-config")
    assert where in str(info.value)
    assert str(info.value).startswith("ix-config: ")


def test_corrupt_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "ix-config"
    path.write_text("flags: [splitboard\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_plugin_config(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_plugin_config(tmp_path / "missing")


def test_digest_changes_with_content_only() -> None:
    a = parse_plugin_config({"flags": {"splitboard": True}})
    b = parse_plugin_config({"flags": {"splitboard": True}})
    c = parse_plugin_config({"flags": {"splitboard": False}})
    assert a.digest() == b.digest() != c.digest()


@pytest.mark.parametrize("labels_enabled", [False, True])
def test_the_plugin_validates_its_config_once_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, labels_enabled: bool
) -> None:
    """Start-up validated the config twice: first only to learn whether node labels need cluster
    access, in a child interpreter of its own before the shared one started (0.3-0.5 s of the 1 s
    start budget), then again. Now once, and cluster access is asked for after it, only when the
    config enables labels (here: not in a cluster, so none)."""
    from ix_gpu.cli import build_parser
    from ix_gpu.node import agent, config_loader
    from ix_gpu.plugin import startup
    from ix_gpu.process import json_logging
    from ix_gpu.process.usage import UsageError
    from tests.support.paths import FAKE_DEVICES

    monkeypatch.setattr(json_logging, "configure", lambda level: None)  # keep pytest's log capture
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    loads: list[str] = []
    real_load = config_loader.load_runtime_config
    monkeypatch.setattr(
        config_loader,
        "load_runtime_config",
        lambda content, source, overrides=None: loads.append(source) or real_load(content, source, overrides),
    )
    connects: list[str | None] = []
    real_connect = agent.connect
    monkeypatch.setattr(agent, "connect", lambda path: connects.append(path) or real_connect(path))
    config = tmp_path / "ix-config"
    config.write_text(f"labels:\n  enabled: {str(labels_enabled).lower()}\n")
    args = build_parser().parse_args(
        [
            *("plugin", "--backend", "fake", "--fake-devices", str(FAKE_DEVICES), "--config", str(config)),
            *("--device-plugin-dir", str(tmp_path / "missing")),
        ]
    )
    # Everything is loaded before the socket directory is checked, so this stops right after.
    with pytest.raises(UsageError, match="not a directory"):
        startup.run_plugin(args)
    assert loads == [str(config)]
    assert connects == ([None] if labels_enabled else [])
