"""Every long option of every ix-gpu command can come from an IX_GPU_* environment variable, the
command line wins, bad values are one-line usage errors naming the variable; ``--version``."""

from __future__ import annotations

import pytest

from ix_gpu.cli import build_parser
from ix_gpu.runtime.usage import env_name
from tests.support.cli import ix_gpu


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
