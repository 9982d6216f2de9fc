"""The webhook config schema: strict, camelCase, errors that name the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ix_gpu.devicemodel.schema_base import ConfigError
from ix_gpu.devicemodel.webhook_config import default_config, load_config, parse_config


def profile(**extra: Any) -> dict[str, Any]:
    return {"name": "p", "resources": ["a.com/gpu"], **extra}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"profile": []}, "profile: unknown key"),
        (
            {"profiles": [profile(volumes=[{"name": "v", "hostPath": "/a", "mountPath": "/b", "ro": 1}])]},
            "profiles[0].volumes[0].ro: unknown key",
        ),
        (
            {"profiles": [profile(volumes=[{"name": "v", "hostPath": "rel", "mountPath": "/b"}])]},
            "profiles[0].volumes[0].hostPath: Value error, must be an absolute path",
        ),
        (
            {"profiles": [profile(volumes=[{"name": "V_1", "hostPath": "/a", "mountPath": "/b"}])]},
            "profiles[0].volumes[0].name: Value error, must be a DNS label",
        ),
        (
            {"profiles": [profile(env=[{"name": "A", "value": "1", "mode": "prepend"}])]},
            "profiles[0].env[0].mode: Input should be 'set-if-absent', 'prepend-path', 'append-path' or "
            "'override'",
        ),
        ({"profiles": [profile(privileged="yes")]}, "profiles[0].privileged"),
        ({"profiles": [profile(), profile()]}, "duplicate profile name 'p'"),
        (
            {"profiles": [profile(env=[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}])]},
            "duplicate env name 'A'",
        ),
        ({"profiles": [{"name": "p", "resources": []}]}, "profiles[0].resources"),
        (
            {"profiles": [profile(tolerations=[{"operator": "Equal", "value": "x"}])]},
            "an empty key needs operator Exists",
        ),
        (
            {"profiles": [profile(affinity={"requiredNodeExpressions": [{"key": "k", "operator": "In"}]})]},
            "operator In needs at least one value",
        ),
        (
            {"workloads": [{"apiVersion": "v1", "kind": "Pod", "templatePaths": ["spec..template"]}]},
            "workloads[0].templatePaths",
        ),
        ({"apiVersion": "ix-gpu.io/v2"}, "apiVersion"),
        ({"policy": {"conflictPolicy": "overwrite"}}, "policy.conflictPolicy"),
    ],
)
def test_invalid_configs_name_the_field(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, "cfg.yaml")
    assert str(caught.value).startswith("cfg.yaml: ")
    assert message in str(caught.value)


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("profiles: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(scalar)


def test_empty_file_is_the_default(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty) == default_config()
    assert load_config(None) == default_config()


def test_default_profiles_inject_no_device_nodes_and_no_privilege() -> None:
    for item in default_config().profiles:
        assert item.privileged.value == "never"
        assert item.device_nodes.inject is False
        assert all(not v.host_path.startswith("/dev/") for v in item.all_volumes())


def test_digest_tracks_content() -> None:
    base = default_config()
    assert base.digest() == default_config().digest()
    changed = parse_config({"policy": {"privilegedNamespaces": ["x"]}})
    assert changed.digest() != base.digest()


def test_default_yaml_round_trips() -> None:
    import yaml

    text = default_config().to_yaml()
    assert parse_config(yaml.safe_load(text)) == default_config()
