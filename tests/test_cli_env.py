"""Every long option of every ix-gpu command can come from an IX_GPU_* environment variable, the
command line wins, bad values are one-line usage errors naming the variable; ``--version``."""

from __future__ import annotations

from pathlib import Path

import pytest

from ix_gpu.cli import build_parser
from ix_gpu.process.usage import env_name
from tests.support.cli import ix_gpu
from tests.support.paths import EXAMPLES, FAKE_DEVICES


def _parse(argv: list[str]) -> object:
    return build_parser().parse_args(argv)


def test_env_names_follow_the_long_option() -> None:
    assert env_name("--log-level") == "IX_GPU_LOG_LEVEL"
    assert env_name("--metrics-port") == "IX_GPU_METRICS_PORT"


def test_a_value_from_the_environment_is_typed_and_the_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IX_GPU_PORT", "9443")
    monkeypatch.setenv("IX_GPU_LOG_LEVEL", "DEBUG")
    args = _parse(["webhook"])
    assert args.port == 9443  # type: ignore[attr-defined]
    assert args.log_level == "debug"  # type: ignore[attr-defined]
    assert _parse(["webhook", "--port", "8000"]).port == 8000  # type: ignore[attr-defined]


def test_flags_and_lists_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IX_GPU_PATCH", "true")
    monkeypatch.setenv("IX_GPU_NAMESPACE_LABEL", "a=b,c=d")
    args = _parse(["mutate", "-f", "x.yaml"])
    assert args.patch is True  # type: ignore[attr-defined]
    assert args.namespace_label == [("a", "b"), ("c", "d")]  # type: ignore[attr-defined]
    monkeypatch.setenv("IX_GPU_PATCH", "off")
    assert _parse(["mutate", "-f", "x.yaml"]).patch is False  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("IX_GPU_PORT", "tcp://10.0.0.1:443", "IX_GPU_PORT='tcp://10.0.0.1:443': expected a port number"),
        ("IX_GPU_LOG_LEVEL", "loud", "IX_GPU_LOG_LEVEL='loud': invalid choice"),
        ("IX_GPU_PATCH", "maybe", "IX_GPU_PATCH='maybe': expected one of"),
    ],
)
def test_a_bad_value_in_the_environment_is_a_one_line_usage_error(
    variable: str, value: str, message: str
) -> None:
    command = ["mutate", "-f", "-"] if variable == "IX_GPU_PATCH" else ["webhook"]
    result = ix_gpu(*command, env={variable: value})
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_help_names_the_variables() -> None:
    out = ix_gpu("plugin", "--help", check=True).stdout
    assert "[env IX_GPU_METRICS_PORT]" in " ".join(out.split())


def test_version() -> None:
    result = ix_gpu("--version", check=True)
    assert result.stdout.startswith("ix-gpu ")
    assert result.stdout.split()[1][0].isdigit(), result.stdout


def test_ix_gpu_version_in_the_environment_is_not_a_flag() -> None:
    # --version only prints; a variable of that name (a build's or an image's) must change nothing.
    result = ix_gpu("config", "default", env={"IX_GPU_VERSION": "0.1.0"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("apiVersion: ix-gpu.io/v1alpha1")


def test_the_plugin_config_has_a_variable_of_its_own(tmp_path: Path) -> None:
    # One IX_GPU_CONFIG for the webhook config and the plugin config broke whichever it was not for.
    webhook_config = tmp_path / "webhook.yaml"
    webhook_config.write_text(ix_gpu("config", "default", check=True).stdout)
    plugin_config = tmp_path / "ix-config"
    plugin_config.write_text("sharing:\n  timeSlicing:\n    replicas: 2\n")
    devices = ("devices", "--backend", "fake", "--fake-devices", str(FAKE_DEVICES))
    env = {"IX_GPU_CONFIG": str(webhook_config)}
    assert "2 devices" in ix_gpu(*devices, env=env, check=True).stdout
    env["IX_GPU_PLUGIN_CONFIG"] = str(plugin_config)
    assert "4 devices" in ix_gpu(*devices, env=env, check=True).stdout
    mutate = ix_gpu("mutate", "-f", str(EXAMPLES / "gpu-pod.yaml"), env=env)
    assert mutate.returncode == 0, mutate.stderr
    assert "[env IX_GPU_PLUGIN_CONFIG]" in " ".join(ix_gpu("plugin", "--help", check=True).stdout.split())
    assert "[env IX_GPU_CONFIG]" in " ".join(ix_gpu("webhook", "--help", check=True).stdout.split())
