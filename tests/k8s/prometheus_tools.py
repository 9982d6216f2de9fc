"""Prometheus' own tools for the tier. ``promtool`` (check and unit-test the chart's alert rules,
lint what the agents serve) comes from Debian's ``prometheus`` package (2.42 on this machine's
mirror), fetched once with ``apt-get download`` and unpacked into
``~/.cache/ix-gpu/promtool-<version>/``; no package is installed. ``IX_GPU_PROMTOOL`` overrides
with a promtool binary. Debian builds Prometheus without Kubernetes service discovery, so the live
Prometheus of the real-node tier is built from the module proxy instead (:func:`prometheus`). Also
the Grafana dashboard's queries, as Prometheus is asked them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.k8s.k8s_tier import build_go_command
from tests.support.paths import ROOT

CACHE = Path.home() / ".cache" / "ix-gpu"


def promtool() -> Path:
    override = os.environ.get("IX_GPU_PROMTOOL")
    if override:
        return Path(override)
    cached = sorted(CACHE.glob("promtool-*/promtool"))
    if cached:
        return cached[-1]
    with tempfile.TemporaryDirectory(prefix="ix-gpu-prometheus-") as work:
        subprocess.run(["apt-get", "download", "prometheus"], cwd=work, check=True, capture_output=True)
        (deb,) = Path(work).glob("prometheus_*.deb")
        version = deb.name.split("_")[1]
        subprocess.run(["dpkg-deb", "-x", str(deb), str(Path(work) / "x")], check=True)
        target = CACHE / f"promtool-{version}"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(work) / "x" / "usr" / "bin" / "promtool", target / "promtool")
    return target / "promtool"


PROMETHEUS_VERSION = "v0.316.0"
"""Prometheus 3.16.0's Go module version."""


def prometheus() -> Path:
    """Prometheus, built with Kubernetes discovery only by ``build-go-command.sh prometheus``
    (cached there); ``IX_GPU_PROMETHEUS_BIN`` names a directory with one instead."""
    return build_go_command("prometheus", PROMETHEUS_VERSION, "IX_GPU_PROMETHEUS_BIN")


DASHBOARD = ROOT / "charts" / "ix-gpu" / "dashboards" / "ix-gpu.json"
GRAFANA_ALL = {"$node": ".*", "$namespace": ".*", "$__rate_interval": "5m"}


def dashboard_queries(dashboard: dict[str, Any] | None = None) -> dict[str, str]:
    """Each panel's queries by ``<panel title> <refId>``, Grafana's variables filled as for "All";
    ``dashboard``: the parsed JSON (default: the chart's file)."""
    out = {}
    panels = (dashboard or json.loads(DASHBOARD.read_text()))["panels"]
    for panel in panels:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_ALL.items():
                expr = expr.replace(variable, value)
            out[f"{panel['title']} {target['refId']}"] = expr
    return out
