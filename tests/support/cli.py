"""The ``ix-gpu`` CLI of this checkout as a subprocess, the way a user runs it.

``python -m ix_gpu`` with the checkout first on ``PYTHONPATH`` (whether or not it is installed in
the venv) and without ``KUBERNETES_SERVICE_HOST`` (so nothing takes the test machine for a Pod).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.processes import Process, start_process

IX_GPU = (sys.executable, "-m", "ix_gpu")
"""The command line that runs the CLI; arguments follow."""


def _environment(env: Mapping[str, str] | None) -> dict[str, str]:
    result = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    result["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), result.get("PYTHONPATH")]))
    result.update(env or {})
    return result


def ix_gpu(
    *args: str,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``ix-gpu ARGS`` to completion in the checkout (``env`` adds to the environment).

    With ``check``, a non-zero exit raises ``RuntimeError`` quoting stderr."""
    result = subprocess.run(
        [*IX_GPU, *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_environment(env),
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"ix-gpu {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result


def ix_gpu_process(
    name: str, *args: str, log_dir: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> Process:
    """Start ``ix-gpu ARGS`` in the background; its output goes to ``<log_dir>/<name>.log``."""
    return start_process(name, [*IX_GPU, *args], log_dir, env=_environment(env), cwd=cwd or ROOT)
