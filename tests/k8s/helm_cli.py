"""The helm CLI against a mini cluster, run as an operator runs it: the cluster's kubeconfig, the
release's namespace, values from a file, and helm's cache, config and data kept in the test's own
directory (nothing is read from or left in the user's home)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml


def run_helm(
    binary: Path, kubeconfig: Path, work: Path, namespace: str, *args: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``helm ARGS --namespace NAMESPACE``; its output captured, never raising on failure."""
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        **{f"HELM_{d}_HOME": str(work / f"helm-{d.lower()}") for d in ("CACHE", "CONFIG", "DATA")},
    }
    argv = [str(binary), *args, "--namespace", namespace]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)


def write_values(work: Path, values: dict[str, Any], revision: int) -> Path:
    """``values`` as ``work/values-<revision>.yaml`` (one file per install or upgrade, kept for a
    failure's post-mortem)."""
    path = work / f"values-{revision}.yaml"
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path
