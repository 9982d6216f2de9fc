"""The runc of the real-node tier, for every test and bench that runs ``runc`` itself (the CDI
hook's tests under ``runc create``, ``bench/adversarial_node.py``): the same binary each real
node's containerd runs, so what those tests prove holds for the tier's nodes.

It is runc v1.5.3 built from the Go module proxy by ``tests/k8s/build-runtime.sh runc`` (cached in
``~/.cache/ix-gpu``; a no-op once built, and a wait on the build's lock while scripts/test.sh
builds it beside the tests). Nothing falls back to a ``runc`` on PATH: Debian's is 1.1.5, which
follows an image's ``/dev`` link out of the root (``tests/node/test_tier_runc.py``).
``IX_GPU_RUNC`` names another runc, for the tier's nodes too (say ``/usr/sbin/runc`` to see what
the older one does)."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT

RUNTIME_SCRIPT = ROOT / "tests" / "k8s" / "build-runtime.sh"
MINIMUM = (1, 4)
"""The oldest runc the tier accepts: 1.4 has the fixes for CVE-2024-21626 and the 2025 runc CVEs
(mount targets and /dev entries resolved inside the root)."""


@functools.cache
def tier_runc() -> str:
    """The tier's runc (its path), built if it is not cached. Raises RuntimeError when the build
    fails (root only: runc's build needs libseccomp-dev, which node-packages.sh installs as root)."""
    named = os.environ.get("IX_GPU_RUNC")
    if named:
        return named
    result = subprocess.run(
        ["bash", str(RUNTIME_SCRIPT), "runc"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"tests/k8s/build-runtime.sh runc failed ({result.returncode}):\n{result.stderr[-6000:]}"
        )
    return str(Path((result.stdout.strip().splitlines() or [""])[-1]) / "runc")


def runc_version(runc: str) -> tuple[int, int, int]:
    """``runc --version``'s release, as numbers (``runc version 1.5.3`` → (1, 5, 3); a distribution's
    suffix, ``1.1.5+ds1``, is dropped)."""
    out = subprocess.run([runc, "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"^runc version (\d+)\.(\d+)\.(\d+)", out, re.MULTILINE)
    assert found, out
    major, minor, patch = (int(part) for part in found.groups())
    return major, minor, patch


def bench_runc(command: str) -> str | None:
    """The tier's runc for a bench (``command`` names it in messages): None after saying on stderr
    why there is none (not root, or the build failed); the bench then exits 2."""
    if os.geteuid() != 0:
        print(f"{command}: runc needs root", file=sys.stderr)
        return None
    try:
        return tier_runc()
    except RuntimeError as error:
        print(f"{command}: no runc: {error}", file=sys.stderr)
        return None
