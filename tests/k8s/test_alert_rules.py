"""The chart's alert rules and dashboard, as Prometheus reads them: ``promtool check rules`` on what
the chart renders, and ``promtool test rules`` driving every alert from series shaped as the plugin and the
webhook write them, firing after its ``for:`` and not before, and not firing below its threshold.
Annotations are checked as Prometheus expands them. Every query of the Grafana dashboard, with
Grafana's variables filled as for "All", is parsed as a recording rule, and the per-pod join is
evaluated on a chip shared by two pods."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.rendering import find, render
from tests.k8s.conftest import _tier_requested
from tests.k8s.prometheus_tools import dashboard_queries, promtool

CHIP = 'node="gpu-a",uuid="GPU-1",index="1",board="board0",product="Iluvatar BI-V150"'
CHIP_LABELS = {
    "node": "gpu-a",
    "uuid": "GPU-1",
    "index": "1",
    "board": "board0",
    "product": "Iluvatar BI-V150",
}
OTHER = 'node="gpu-a",uuid="GPU-2",index="2",board="board1",product="Iluvatar BI-V150"'
WEBHOOK = 'namespace="ix-gpu-system"'


def alert(name: str, eval_time: str, *expected: dict[str, Any]) -> dict[str, Any]:
    return {"eval_time": eval_time, "alertname": name, "exp_alerts": list(expected)}


def runbook(name: str) -> str:
    return f"docs/runbooks.md#{name.lower()}"


UNIT_TESTS: dict[str, Any] = {
    "rule_files": ["rules.yml"],
    "evaluation_interval": "1m",
    "tests": [
        {
            "interval": "1m",
            "input_series": [
                # GPU-1 overheats at minute 2 and stays; GPU-2 has its bits at 0.
                {
                    "series": f'ix_gpu_chip_health_problem{{{CHIP},problem="over temperature"}}',
                    "values": "0 0 1x20",
                },
                {"series": f'ix_gpu_chip_health_problem{{{CHIP},problem="ECC error"}}', "values": "0x22"},
                {
                    "series": f'ix_gpu_chip_health_problem{{{OTHER},problem="over temperature"}}',
                    "values": "0x22",
                },
                {"series": f"ix_gpu_chip_temperature_celsius{{{CHIP}}}", "values": "60 60 91x20"},
                {"series": f"ix_gpu_chip_temperature_celsius{{{OTHER}}}", "values": "84x22"},
                {"series": f"ix_gpu_chip_memory_used_bytes{{{CHIP}}}", "values": "0 0 97x20"},
                {"series": f"ix_gpu_chip_memory_total_bytes{{{CHIP}}}", "values": "100x22"},
                {"series": f"ix_gpu_chip_memory_used_bytes{{{OTHER}}}", "values": "90x22"},
                {"series": f"ix_gpu_chip_memory_total_bytes{{{OTHER}}}", "values": "100x22"},
                {"series": f"ix_gpu_chip_telemetry_stale{{{CHIP}}}", "values": "0 0 1x20"},
                {"series": f"ix_gpu_chip_telemetry_stale{{{OTHER}}}", "values": "0x22"},
                {"series": 'ix_gpu_plugin_registered{node="gpu-a"}', "values": "1 1 0x20"},
                {"series": 'ix_gpu_plugin_registered{node="gpu-b"}', "values": "1x22"},
                {"series": 'ix_gpu_dra_registered{node="gpu-a"}', "values": "1 1 0x20"},
                {"series": 'ix_gpu_dra_registered{node="gpu-b"}', "values": "1x22"},
                # One DRA plugin fails a prepare a minute from minute 2; the other failed 3 long ago.
                {
                    "series": 'ix_gpu_dra_prepare_failures_total{node="gpu-a",reason="read"}',
                    "values": "0 0 1+1x20",
                },
                {"series": 'ix_gpu_dra_prepare_failures_total{node="gpu-b",reason="read"}', "values": "3x22"},
                # One webhook replica stops hearing from the API server at minute 2; the other hears.
                {
                    "series": f'ix_gpu_namespace_cache_staleness_seconds{{{WEBHOOK},pod="wh-a"}}',
                    "values": "30 30 400x20",
                },
                {
                    "series": f'ix_gpu_namespace_cache_staleness_seconds{{{WEBHOOK},pod="wh-b"}}',
                    "values": "30x22",
                },
                # A namespace lookup fails under allow-unmodified at minute 2, once.
                {
                    "series": f'ix_gpu_admission_allowed_unmodified_total{{{WEBHOOK},lookup="namespace"}}',
                    "values": "0 0 1x20",
                },
                {
                    "series": f'ix_gpu_admission_allowed_unmodified_total{{{WEBHOOK},lookup="claim"}}',
                    "values": "0x22",
                },
                # Internal errors from minute 2; 100 admissions a minute, 10 of them between 0.5
                # and 1 s from minute 2 (p99 0.95 s), none before.
                {
                    "series": 'ix_gpu_admission_internal_errors_total{namespace="ix-gpu-system"}',
                    "values": "0 0 1+1x20",
                },
                {
                    "series": 'ix_gpu_admission_duration_seconds_bucket{le="0.5"}',
                    "values": "0+100x2 200+90x20",
                },
                {"series": 'ix_gpu_admission_duration_seconds_bucket{le="1"}', "values": "0+100x22"},
                {"series": 'ix_gpu_admission_duration_seconds_bucket{le="+Inf"}', "values": "0+100x22"},
                # Ten days left at time 0 (promtool's clock starts at the epoch).
                {"series": "ix_gpu_serving_certificate_expiry_timestamp_seconds", "values": "864000x22"},
            ],
            "alert_rule_test": [
                alert("IxGpuChipUnhealthy", "2m"),  # not for its 1m yet
                alert(
                    "IxGpuChipUnhealthy",
                    "4m",
                    {
                        "exp_labels": {**CHIP_LABELS, "problem": "over temperature", "severity": "critical"},
                        "exp_annotations": {
                            "summary": "GPU GPU-1 (index 1) on gpu-a: over temperature",
                            "description": "ixmlDeviceGetHealth reports over temperature; the device plugin "
                            "advertises it Unhealthy and the DRA plugin taints it, so no new pod gets it.",
                            "runbook": runbook("IxGpuChipUnhealthy"),
                        },
                    },
                ),
                alert("IxGpuChipTemperatureHigh", "5m"),  # 84 °C never fires; 91 °C not for 5m yet
                alert(
                    "IxGpuChipTemperatureHigh",
                    "8m",
                    {
                        "exp_labels": {**CHIP_LABELS, "severity": "warning"},
                        "exp_annotations": {
                            "summary": "GPU GPU-1 on gpu-a at 91 °C",
                            "description": "Above 85 °C (metrics.prometheusRule.chipTemperatureCelsius) "
                            "for 5m.",
                            "runbook": runbook("IxGpuChipTemperatureHigh"),
                        },
                    },
                ),
                alert("IxGpuChipMemoryNearlyFull", "11m"),
                alert(
                    "IxGpuChipMemoryNearlyFull",
                    "13m",
                    {
                        "exp_labels": {**CHIP_LABELS, "severity": "warning"},
                        "exp_annotations": {
                            "summary": "GPU GPU-1 on gpu-a: 97% of its memory in use",
                            "description": "Above 0.95 of the chip's memory (metrics.prometheusRule."
                            "chipMemoryUsedRatio) for 10m; ix_gpu_chip_allocation on the same uuid names "
                            "the pods holding it.",
                            "runbook": runbook("IxGpuChipMemoryNearlyFull"),
                        },
                    },
                ),
                alert("IxGpuTelemetryMissing", "11m"),
                alert(
                    "IxGpuTelemetryMissing",
                    "13m",
                    {
                        "exp_labels": {**CHIP_LABELS, "severity": "warning"},
                        "exp_annotations": {
                            "summary": "No telemetry from GPU GPU-1 on gpu-a",
                            "description": "The device plugin has no reading of the chip newer than two "
                            "telemetry intervals: its library calls hang or fail.",
                            "runbook": runbook("IxGpuTelemetryMissing"),
                        },
                    },
                ),
                alert("IxGpuDevicePluginNotRegistered", "6m"),
                alert(
                    "IxGpuDevicePluginNotRegistered",
                    "8m",
                    {
                        "exp_labels": {"node": "gpu-a", "severity": "critical"},
                        "exp_annotations": {
                            "summary": "The device plugin on gpu-a is not registered with its kubelet",
                            "description": "No device-plugin GPU can be allocated on that node until it "
                            "registers again.",
                            "runbook": runbook("IxGpuDevicePluginNotRegistered"),
                        },
                    },
                ),
                alert("IxGpuDraNotRegistered", "6m"),
                alert(
                    "IxGpuDraNotRegistered",
                    "8m",
                    {
                        "exp_labels": {"node": "gpu-a", "severity": "critical"},
                        "exp_annotations": {
                            "summary": "The DRA plugin on gpu-a is not registered with its kubelet",
                            "description": "Pods with claims on that node's GPUs stay in ContainerCreating "
                            "until it registers.",
                            "runbook": runbook("IxGpuDraNotRegistered"),
                        },
                    },
                ),
                alert("IxGpuDraPrepareFailures", "6m"),
                alert(
                    "IxGpuDraPrepareFailures",
                    "8m",
                    {
                        "exp_labels": {"node": "gpu-a", "reason": "read", "severity": "warning"},
                        "exp_annotations": {
                            "summary": "The DRA plugin on gpu-a fails to prepare claims (read)",
                            "description": "Claims allocated on that node are refused at "
                            "NodePrepareResources; their pods stay in ContainerCreating. The plugin's log "
                            "and the pods' events say why.",
                            "runbook": runbook("IxGpuDraPrepareFailures"),
                        },
                    },
                ),
                alert("IxGpuWebhookAdmissionErrors", "2m"),
                alert(
                    "IxGpuWebhookAdmissionErrors",
                    "9m",
                    {
                        "exp_labels": {"namespace": "ix-gpu-system", "severity": "critical"},
                        "exp_annotations": {
                            "summary": "The ix-gpu webhook answers admissions with internal errors",
                            "description": "Reviews that hit a bug are denied "
                            "(ix_gpu_admission_internal_errors_total); GPU pods are not created.",
                            "runbook": runbook("IxGpuWebhookAdmissionErrors"),
                        },
                    },
                ),
                alert("IxGpuAdmittedWithoutInjection", "1m"),
                alert(
                    "IxGpuAdmittedWithoutInjection",
                    "3m",
                    {
                        "exp_labels": {
                            "namespace": "ix-gpu-system",
                            "lookup": "namespace",
                            "severity": "warning",
                        },
                        "exp_annotations": {
                            "summary": "ix-gpu admitted GPU objects without their injection: a namespace "
                            "could not be read",
                            "description": "policy.namespaceLookupFailure or claimLookupFailure is "
                            "allow-unmodified, and GPU pods were admitted with no driver setup in the last "
                            "10 minutes; they fail on their GPU nodes. deny refuses them instead, and their "
                            "creators retry.",
                            "runbook": runbook("IxGpuAdmittedWithoutInjection"),
                        },
                    },
                ),
                alert("IxGpuNamespaceCacheStale", "3m"),
                alert(
                    "IxGpuNamespaceCacheStale",
                    "5m",
                    {
                        "exp_labels": {"namespace": "ix-gpu-system", "pod": "wh-a", "severity": "warning"},
                        "exp_annotations": {
                            "summary": "ix-gpu webhook wh-a has heard nothing from the API server for 6m 40s",
                            "description": "Its namespace cache's list or watch is failing or silent "
                            "(above 300s, metrics.prometheusRule.namespaceCacheStaleSeconds): opt-outs and "
                            "labels changed since are not seen, and once webhook.cacheMaxStalenessSeconds "
                            "passes the replica turns not-ready.",
                            "runbook": runbook("IxGpuNamespaceCacheStale"),
                        },
                    },
                ),
                alert("IxGpuWebhookLatencyHigh", "11m"),
                alert(
                    "IxGpuWebhookLatencyHigh",
                    "18m",
                    {
                        "exp_labels": {"severity": "warning"},
                        "exp_annotations": {
                            "summary": "ix-gpu webhook admission p99 950ms",
                            "description": "Above 0.5s (metrics.prometheusRule.admissionP99Seconds); the "
                            "apiserver's own call to the webhook times out at its timeoutSeconds.",
                            "runbook": runbook("IxGpuWebhookLatencyHigh"),
                        },
                    },
                ),
                alert(
                    "IxGpuWebhookCertificateExpiring",
                    "1m",
                    {
                        "exp_labels": {"severity": "warning"},
                        "exp_annotations": {
                            "summary": "The ix-gpu webhook's serving certificate expires in 10.0 days",
                            "description": "Fewer than 14 days (metrics.prometheusRule."
                            "certificateExpiryDays) left; once it lapses the apiserver cannot call the "
                            "webhook.",
                            "runbook": runbook("IxGpuWebhookCertificateExpiring"),
                        },
                    },
                ),
            ],
        },
        {
            # Thirty days left: no alert on the certificate.
            "interval": "1m",
            "input_series": [
                {"series": "ix_gpu_serving_certificate_expiry_timestamp_seconds", "values": "2592000x5"}
            ],
            "alert_rule_test": [alert("IxGpuWebhookCertificateExpiring", "3m")],
        },
    ],
}


@pytest.fixture(scope="module")
def rules_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not _tier_requested(request.config):
        pytest.skip("real-Kubernetes tier: run with -m k8s (or IX_GPU_K8S=1)")
    work = tmp_path_factory.mktemp("alerts")
    rule = find(render({"metrics": {"prometheusRule": {"enabled": True}}}), "PrometheusRule")
    (work / "rules.yml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    (work / "tests.yml").write_text(yaml.safe_dump(UNIT_TESTS, sort_keys=False, allow_unicode=True))
    return work


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool()), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_promtool_checks_the_rendered_rules(rules_dir: Path) -> None:
    result = run_promtool("check", "rules", "rules.yml", cwd=rules_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 12 rules found" in result.stdout, result.stdout


def test_every_alert_fires_after_its_for_and_not_below_its_threshold(rules_dir: Path) -> None:
    covered = {t["alertname"] for group in UNIT_TESTS["tests"] for t in group["alert_rule_test"]}
    rendered = yaml.safe_load((rules_dir / "rules.yml").read_text())
    assert covered == {r["alert"] for g in rendered["groups"] for r in g["rules"]}
    result = run_promtool("test", "rules", "tests.yml", cwd=rules_dir)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_dashboard_query_parses_and_a_shared_chip_shows_on_each_pod(
    tmp_path: Path, rules_dir: Path
) -> None:
    queries = dashboard_queries()
    assert not [q for q in queries.values() if "$" in q], "a Grafana variable left unfilled"
    rules = [{"record": f"ix_gpu_dashboard:query_{i}", "expr": q} for i, q in enumerate(queries.values())]
    (tmp_path / "dashboard.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    result = run_promtool("check", "rules", "dashboard.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout, result.stdout

    holder = 'namespace="ml",container="main",claim=""'
    tests = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f"ix_gpu_chip_utilization_percent{{{CHIP}}}", "values": "40x3"},
                    {"series": f"ix_gpu_chip_utilization_percent{{{OTHER}}}", "values": "90x3"},
                    {"series": f'ix_gpu_chip_allocation{{{CHIP},{holder},pod="a"}}', "values": "1x3"},
                    {"series": f'ix_gpu_chip_allocation{{{CHIP},{holder},pod="b"}}', "values": "1x3"},
                    {"series": f"ix_gpu_chip_telemetry_stale{{{CHIP}}}", "values": "0x3"},
                    {"series": f"ix_gpu_chip_telemetry_stale{{{OTHER}}}", "values": "0x3"},
                ],
                "promql_expr_test": [
                    {
                        "expr": queries["Utilization of the chips each pod holds A"],
                        "eval_time": "2m",
                        # An empty label value is no label to Prometheus: a device-plugin holder
                        # has no claim label.
                        "exp_samples": [
                            {"labels": f'{{{CHIP},namespace="ml",container="main",pod="{pod}"}}', "value": 40}
                            for pod in ("a", "b")
                        ],
                    },
                    {
                        "expr": queries["GPUs (chips) A"],
                        "eval_time": "2m",
                        "exp_samples": [{"labels": "{}", "value": 2}],
                    },
                    {
                        "expr": queries["Chips in use A"],
                        "eval_time": "2m",
                        "exp_samples": [{"labels": "{}", "value": 1}],
                    },
                    {
                        "expr": queries["GPU containers by namespace A"],
                        "eval_time": "2m",
                        "exp_samples": [{"labels": '{namespace="ml"}', "value": 2}],
                    },
                ],
            }
        ],
    }
    (tmp_path / "dashboard-tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    result = run_promtool("test", "rules", "dashboard-tests.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
