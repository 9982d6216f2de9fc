"""What every ix-gpu command writes where: a reader that stops reading early (``| head -1``) ends
the command quietly, as it ends ``cat``."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.cli import IX_GPU, _environment, ix_gpu
from tests.support.paths import FAKE_DEVICES, ROOT


@pytest.mark.parametrize(
    "args",
    [
        ("devices", "--backend", "fake", "--fake-devices", str(FAKE_DEVICES)),
        ("config", "schema"),
    ],
)
def test_a_closed_pipe_ends_the_command_without_a_traceback(args: tuple[str, ...]) -> None:
    child = subprocess.Popen(
        [*IX_GPU, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=_environment(None),
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # the reader is gone before the first byte is written
    stderr = child.stderr.read().decode()
    assert child.wait(timeout=60) == 141  # 128 + SIGPIPE, as a shell reports `cat` in that place
    assert stderr == ""


@pytest.mark.parametrize("command", ["plugin", "dra"])
def test_the_node_agents_help_names_every_kubeconfig_user_they_take(command: str) -> None:
    """Client certificates work (tests/kube/test_kubeconfig.py); the help must not say otherwise."""
    text = " ".join(ix_gpu(command, "--help", check=True).stdout.split())
    assert "token users only" not in text
    assert "a token, a tokenFile or a client certificate" in text
