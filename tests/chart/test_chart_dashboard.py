"""The chart's Grafana dashboard (metrics.dashboard): off by default; when on, a ConfigMap with the
label Grafana's sidecar selects, holding the chart's dashboards/ix-gpu.json; the JSON is a
dashboard whose every query names only metrics ix-gpu serves, through the data-source variable,
with panels that do not overlap. Prometheus parses and evaluates the queries in the real-Kubernetes
tier (tests/k8s/test_alert_rules.py), where its tools are installed."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.chart.rendering import find, render
from tests.support.paths import ROOT

ON = {"metrics": {"dashboard": {"enabled": True}}}
DASHBOARD = ROOT / "charts" / "ix-gpu" / "dashboards" / "ix-gpu.json"


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def queries() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def test_off_by_default_and_a_sidecar_configmap_when_on() -> None:
    assert not [
        o for o in render() if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")
    ]
    config_map = find(render(ON), "ConfigMap", "ixg-ix-gpu-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "ix-gpu-system"
    assert json.loads(config_map["data"]["ix-gpu.json"]) == dashboard()  # the file, byte for byte in JSON


def test_namespace_labels_and_annotations_come_from_values() -> None:
    values = {
        "metrics": {
            "dashboard": {
                "enabled": True,
                "namespace": "monitoring",
                "labels": {"grafana_dashboard": "ix"},
                "annotations": {"grafana_folder": "GPUs"},
            }
        }
    }
    metadata = find(render(values), "ConfigMap", "ixg-ix-gpu-dashboard")["metadata"]
    assert metadata["namespace"] == "monitoring"
    assert metadata["labels"]["grafana_dashboard"] == "ix"
    assert metadata["annotations"] == {"grafana_folder": "GPUs"}


def test_the_rows_the_dashboard_promises() -> None:
    rows = [p["title"] for p in dashboard()["panels"] if p["type"] == "row"]
    assert rows == ["Cluster", "Per node and chip", "Per namespace and pod", "Webhook", "Node agents"]
    names = [v["name"] for v in dashboard()["templating"]["list"]]
    assert names == ["datasource", "node", "namespace"]


def test_every_query_names_only_metrics_ix_gpu_serves_through_the_datasource_variable() -> None:
    served = set(
        re.findall(r'"(ix_gpu_[a-z_]+)', "".join(p.read_text() for p in (ROOT / "ix_gpu").rglob("*.py")))
    )
    assert queries()
    for expr in queries():
        metrics = re.findall(r"ix_gpu_[a-z_]+", expr)
        assert metrics, expr
        for metric in metrics:
            # prometheus_client adds the suffixes; a figure's metric (ix_gpu.node.telemetry) has its own.
            family = re.sub(r"_(total|bucket|sum|count)$", "", metric)
            assert metric in served or family in served, f"{metric} in {expr}"
    for panel in dashboard()["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_panels_do_not_overlap_and_fit_the_grid() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in dashboard()["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids))
