"""A started process whose stdout and stderr go to a log file, and how to stop it.

Every suite that starts a binary (the ix-gpu CLI, etcd, kube-apiserver, the kubelet) uses this one
type, so that waits can fail fast when the process dies and failures can quote its log. Output goes
to a file, not a pipe: a pipe nobody reads fills up and stalls the process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file, or ``(no log)``."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclasses.dataclass
class Process:
    """A started binary whose stdout and stderr go to ``log``."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    killed: bool = False
    """Set by ``stop`` when the process had to be killed (it outlived the grace period)."""

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        """Everything in the log so far."""
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 40) -> str:
        return tail(self.log, lines)

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM by PID, SIGKILL after ``grace_s`` (``killed`` tells); returns the exit status."""
        if self.popen.poll() is not None:
            return self.popen.returncode
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.killed = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)
        return self.popen.returncode


def start_process(
    name: str,
    argv: Sequence[str],
    log_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Process:
    """Start ``argv``; its output is appended to ``<log_dir>/<name>.log``."""
    log = log_dir / f"{name}.log"
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            cwd=cwd,
        )
    return Process(name=name, popen=popen, log=log)
