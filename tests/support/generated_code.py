"""Whether committed generated code (the gRPC stubs) matches a fresh run of its generator."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from tests.support.paths import ROOT


def stale_generated(out: Path, api: Path, names: Iterable[str]) -> list[str]:
    """Run scripts/gen_proto.sh into ``out`` and name the files of ``api`` (a folder relative to the
    checkout) whose committed bytes differ from the fresh ones."""
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen_proto.sh"), str(out)],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        capture_output=True,
    )
    return [name for name in names if (out / api / name).read_bytes() != (ROOT / api / name).read_bytes()]
