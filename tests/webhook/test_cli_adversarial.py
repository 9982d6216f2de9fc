"""``ix-gpu mutate`` and ``ix-gpu config validate`` on hostile or broken input, run as a user would.

Every input error is one line on stderr and exit code 2, refused before an alias bomb or a deep
document is expanded or walked; never a traceback. A GPU count the quantity code refuses is a denial
(exit 1) or an input error (exit 2), also one line.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

from ix_gpu.webhook import mutate_command
from ix_gpu.webhook.mutate_command import MutateOptions, run_mutate
from tests.support.cli import ix_gpu
from tests.support.paths import EXAMPLES
from tests.support.yaml_bombs import laughs

GPU_POD = (EXAMPLES / "gpu-pod.yaml").read_text()


def assert_one_line_error(result: Any, code: int = 2) -> str:
    assert result.returncode == code, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return str(lines[0])


BOMB_IN_TOLERATION = (
    GPU_POD
    + "  tolerations:\n  - key: example.com/bomb\n    operator: Exists\n    bomb:\n"
    + laughs(indent="      ", leaves=9)
)
BOMB_IN_SAME_NAME_VOLUME = (
    GPU_POD.replace(
        "    resources:\n",
        "    volumeMounts: [{name: ix-gpu-iluvatar-driver, mountPath: /x}]\n    resources:\n",
    )
    + "  volumes:\n  - name: ix-gpu-iluvatar-driver\n    hostPath:\n      path: /usr/local/corex\n    bomb:\n"
    + laughs(indent="      ", leaves=9)
)


@pytest.mark.parametrize(
    "manifest", [BOMB_IN_TOLERATION, BOMB_IN_SAME_NAME_VOLUME], ids=["toleration", "volume"]
)
def test_alias_bomb_is_refused_quickly(tmp_path: Path, manifest: str) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(manifest)
    started = time.monotonic()
    result = ix_gpu("mutate", "-f", str(path), timeout=30)
    assert time.monotonic() - started < 5
    line = assert_one_line_error(result)
    assert line.startswith(f"ix-gpu mutate: {path}: refused: ")
    assert "aliases expand to more than 100,000 nodes" in line


def test_bounded_aliases_in_a_manifest_still_work() -> None:
    manifest = GPU_POD.replace("    resources:\n", "    env: &env [{name: A, value: b}]\n    resources:\n")
    manifest += "  initContainers:\n  - {name: init, image: busybox, env: *env}\n"
    result = ix_gpu("mutate", "-f", "-", stdin=manifest)
    assert result.returncode == 0, result.stderr
    assert "&" not in result.stdout and "*env" not in result.stdout  # printed as a plain tree
    assert result.stdout.count("name: A") == 2


@pytest.mark.parametrize(
    "content",
    [
        "a: " + "[" * 10_000 + "]" * 10_000 + "\n",
        "[" * 10_000 + "]" * 10_000,  # as JSON, which is read under the same limits
        GPU_POD + "  x: " + "[" * 200 + "]" * 200 + "\n",
    ],
    ids=["yaml", "json", "in-a-pod"],
)
def test_deep_documents_are_one_line(tmp_path: Path, content: str) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(content)
    line = assert_one_line_error(ix_gpu("mutate", "-f", str(path)))
    assert "nested deeper than 100 levels" in line


@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        ('{"apiVersion": "v1", "kind": "Pod", "kind": "Pod"}', "duplicate key 'kind'"),
        ("a: 1\n---\nb: 2\nb: 3\n", "stdin: not valid YAML or JSON: line 4, column 1: duplicate key 'b'"),
        ("a: " + "9" * 5001, "cannot read this int"),
        ("a: 2001-99-99\n", None),  # kubectl keeps dates strings; so does mutate: not an error
    ],
)
def test_bad_manifests_on_stdin(stdin: str, message: str | None) -> None:
    result = ix_gpu("mutate", "-f", "-", stdin=stdin)
    if message is None:
        assert result.returncode == 0, result.stderr
        assert "2001-99-99" in result.stdout
        return
    assert message in assert_one_line_error(result)


def test_binary_and_huge_manifests(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage"
    garbage.write_bytes(bytes(range(256)) * 64)
    assert "not valid YAML or JSON: position" in assert_one_line_error(ix_gpu("mutate", "-f", str(garbage)))
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"a: " + b"x" * (16 * 1024 * 1024))
    line = assert_one_line_error(ix_gpu("mutate", "-f", str(huge)))
    assert line == f"ix-gpu mutate: {huge}: refused: larger than 16 MiB"


@pytest.mark.parametrize("count", [".nan", ".inf", "-.inf", "1.0e+400", "9" * 4300, "'" + "9" * 5001 + "'"])
def test_absurd_gpu_counts_are_never_a_traceback(count: str) -> None:
    manifest = GPU_POD.replace("iluvatar.com/gpu: 1 ", f"iluvatar.com/gpu: {count} ")
    assert count in manifest
    result = ix_gpu("mutate", "-f", "-", stdin=manifest)
    assert result.returncode in (1, 2), result
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_a_5001_digit_gpu_count_is_an_input_error() -> None:
    manifest = GPU_POD.replace("iluvatar.com/gpu: 1 ", f"iluvatar.com/gpu: {'9' * 5001} ")
    line = assert_one_line_error(ix_gpu("mutate", "-f", "-", stdin=manifest))
    assert "stdin: not valid YAML or JSON: line 14" in line


# --- config validate and --config --------------------------------------------------------------


TWO_POLICIES = """\
apiVersion: ix-gpu.io/v1alpha1
kind: WebhookConfig
policy:
  privilegedNamespaces: [ml-team]
policy:
  privilegedNamespaces: ["*"]
"""


def test_config_with_two_policy_blocks_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "webhook.yaml"
    path.write_text(TWO_POLICIES)
    line = assert_one_line_error(ix_gpu("config", "validate", str(path)))
    assert line == (
        f"ix-gpu config: {path}: not valid YAML: line 5, column 1: duplicate key 'policy' (first on line 3)"
    )
    line = assert_one_line_error(
        ix_gpu("mutate", "-f", str(EXAMPLES / "gpu-pod.yaml"), "--config", str(path))
    )
    assert line.startswith(f"ix-gpu mutate: invalid config: {path}: ") and "duplicate key 'policy'" in line


@pytest.mark.parametrize(
    "content",
    [
        bytes(range(256)) * 16,
        b"\x7fELF\x02\x01\x01\x00" + bytes(100),
        b"\xff\xfe\x00\xd8",
        b"policy: {privilegedNamespaces: [\x00]}",
    ],
    ids=["all-bytes", "elf", "utf16-half", "nul"],
)
def test_config_validate_on_binary_garbage(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "garbage.yaml"
    path.write_bytes(content)
    line = assert_one_line_error(ix_gpu("config", "validate", str(path)))
    assert line.startswith(f"ix-gpu config: {path}: not valid YAML: ")


def test_config_validate_limits(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(
        "apiVersion: ix-gpu.io/v1alpha1\nkind: WebhookConfig\nx:\n" + laughs(indent="  ", leaves=9)
    )
    assert "refused" in assert_one_line_error(ix_gpu("config", "validate", str(bomb)))
    deep = tmp_path / "deep.yaml"
    deep.write_text("policy: " + "[" * 10_000 + "]" * 10_000)
    assert "nested deeper than 100" in assert_one_line_error(ix_gpu("config", "validate", str(deep)))
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# " + b"x" * (1024 * 1024))
    assert "larger than 1 MiB" in assert_one_line_error(ix_gpu("config", "validate", str(big)))
    missing = tmp_path / "missing.yaml"
    assert "cannot read" in assert_one_line_error(ix_gpu("config", "validate", str(missing)))


def test_config_validate_still_says_invalid_with_exit_1_for_a_bad_field(tmp_path: Path) -> None:
    path = tmp_path / "webhook.yaml"
    path.write_text("policy: {conflictPolicy: overwrite}\n")
    line = assert_one_line_error(ix_gpu("config", "validate", str(path)), code=1)
    # The field, and the line it is on (webhook config errors name the line, as plugin config ones do).
    assert line.startswith(f"invalid: {path}: line 1: policy.conflictPolicy")


# --- a bug in the mutation is reported, not hidden ---------------------------------------------


@pytest.mark.parametrize("verbose", [False, True])
def test_an_internal_error_is_a_denial_naming_the_exception(
    monkeypatch: pytest.MonkeyPatch, verbose: bool
) -> None:
    def broken(*args: Any) -> Any:
        raise KeyError("spec")

    monkeypatch.setattr(mutate_command, "mutate", broken)
    stdin = io.StringIO(GPU_POD + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n")
    stdout, stderr = io.StringIO(), io.StringIO()
    code = run_mutate(MutateOptions(filename="-", verbose=verbose), stdin, stdout, stderr)
    assert code == 1
    lines = stderr.getvalue().splitlines()
    assert lines[0] == (
        "ix-gpu mutate: Pod/corex-example denied: internal error in the ix-gpu webhook: KeyError: 'spec'"
        + ("" if verbose else " (-v for the traceback)")
    )
    if verbose:
        assert "Traceback" in stderr.getvalue()
    else:
        assert len(lines) == 2  # one line per document
    assert stdout.getvalue() == ""


def test_metadata_of_the_wrong_type_is_not_a_crash() -> None:
    for metadata in ("[1, 2]", "{namespace: [x]}", "{name: {a: b}}"):
        doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": "PLACEHOLDER"}
        text = json.dumps(doc).replace('"PLACEHOLDER"', metadata)
        result = ix_gpu("mutate", "-f", "-", stdin=text)
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
