"""The chart's PrometheusRule (metrics.prometheusRule): off by default, the thresholds from values,
every alert with a runbook section in docs/runbooks.md, and every metric an alert names one that
ix-gpu serves. `promtool check/test rules` on the rendered rules is in the real-Kubernetes tier
(tests/k8s/test_alert_rules.py), where Prometheus' own tools are installed."""

from __future__ import annotations

import re

import pytest

from tests.chart.rendering import HelmError, find, render
from tests.support.paths import ROOT

ON = {"metrics": {"prometheusRule": {"enabled": True}}}
ALERTS = {
    "IxGpuChipUnhealthy",
    "IxGpuChipTemperatureHigh",
    "IxGpuChipMemoryNearlyFull",
    "IxGpuTelemetryMissing",
    "IxGpuDevicePluginNotRegistered",
    "IxGpuDraNotRegistered",
    "IxGpuDraPrepareFailures",
    "IxGpuWebhookAdmissionErrors",
    "IxGpuWebhookLatencyHigh",
    "IxGpuWebhookCertificateExpiring",
    "IxGpuNamespaceCacheStale",
    "IxGpuAdmittedWithoutInjection",
}


def rules(values: dict[str, object]) -> dict[str, dict[str, object]]:
    rule = find(render(values), "PrometheusRule")
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


def test_off_by_default_and_every_alert_when_on() -> None:
    assert not [o for o in render() if o["kind"] == "PrometheusRule"]
    assert set(rules(ON)) == ALERTS


def test_thresholds_come_from_values() -> None:
    values = {
        "metrics": {
            "prometheusRule": {
                "enabled": True,
                "chipTemperatureCelsius": 77,
                "chipMemoryUsedRatio": 0.8,
                "admissionP99Seconds": 0.25,
                "certificateExpiryDays": 30,
                "namespaceCacheStaleSeconds": 120,
                "namespaceCacheStaleFor": "1m",
                "chipTemperatureFor": "2m",
                "labels": {"release": "kube-prometheus"},
            }
        }
    }
    found = rules(values)
    assert found["IxGpuChipTemperatureHigh"]["expr"] == "ix_gpu_chip_temperature_celsius > 77"
    assert found["IxGpuChipTemperatureHigh"]["for"] == "2m"
    assert str(found["IxGpuChipMemoryNearlyFull"]["expr"]).endswith("> 0.8")
    assert str(found["IxGpuWebhookLatencyHigh"]["expr"]).endswith("> 0.25")
    assert str(found["IxGpuWebhookCertificateExpiring"]["expr"]).endswith("< 30")
    stale = found["IxGpuNamespaceCacheStale"]
    assert str(stale["expr"]).endswith("> 120") and stale["for"] == "1m"
    metadata = find(render(values), "PrometheusRule")["metadata"]
    assert metadata["labels"]["release"] == "kube-prometheus"
    with pytest.raises(HelmError, match="chipMemoryUsedRatio"):
        render({"metrics": {"prometheusRule": {"enabled": True, "chipMemoryUsedRatio": 1.5}}})


def test_every_alert_has_its_runbook_and_names_only_metrics_ix_gpu_serves() -> None:
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    anchors = {heading.lower() for heading in re.findall(r"^## (\w+)$", runbooks, re.MULTILINE)}
    served = set(
        re.findall(r'"(ix_gpu_[a-z_]+)', "".join(p.read_text() for p in (ROOT / "ix_gpu").rglob("*.py")))
    )
    for name, rule in rules(ON).items():
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert annotations["runbook"] == f"docs/runbooks.md#{name.lower()}", name
        assert name.lower() in anchors, f"docs/runbooks.md has no section {name}"
        for metric in re.findall(r"ix_gpu_[a-z_]+", str(rule["expr"])):
            base = re.sub(r"_(total|bucket|sum|count)$", "", metric)
            assert base in served, f"{name} names {metric}, which nothing serves"
