"""Prometheus' own tools for the tier: ``promtool`` (check and unit-test the chart's alert rules)
and ``prometheus``, from Debian's ``prometheus`` package (2.42 on this machine's mirror), fetched
once with ``apt-get download`` and unpacked into ``~/.cache/ix-gpu/prometheus-<version>/``; no
package is installed and no daemon started. ``IX_GPU_PROMTOOL`` overrides with a promtool binary."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CACHE = Path.home() / ".cache" / "ix-gpu"


def promtool() -> Path:
    override = os.environ.get("IX_GPU_PROMTOOL")
    if override:
        return Path(override)
    cached = sorted(CACHE.glob("prometheus-*/promtool"))
    if cached:
        return cached[-1]
    with tempfile.TemporaryDirectory(prefix="ix-gpu-prometheus-") as work:
        subprocess.run(["apt-get", "download", "prometheus"], cwd=work, check=True, capture_output=True)
        (deb,) = Path(work).glob("prometheus_*.deb")
        version = deb.name.split("_")[1]
        subprocess.run(["dpkg-deb", "-x", str(deb), str(Path(work) / "x")], check=True)
        target = CACHE / f"prometheus-{version}"
        target.mkdir(parents=True, exist_ok=True)
        for name in ("promtool", "prometheus"):
            shutil.copy2(Path(work) / "x" / "usr" / "bin" / name, target / name)
    return target / "promtool"
