"""A real Prometheus (3.16, built from the module proxy: :mod:`tests.k8s.prometheus_tools`)
beside the tier's cluster, scraping what the chart's ServiceMonitor selects through
``kubernetes_sd_configs`` against the tier's apiserver, and evaluating the chart's PrometheusRule.

No Prometheus Operator runs here, so :func:`scrape_jobs` writes the scrape configuration the
Operator generates from a ServiceMonitor: endpoints discovery in the monitor's namespaces, the
Service kept by the monitor's label selector and each endpoint by its port name, the Operator's
own target labels (``namespace``, ``service``, ``pod``, ``container``, ``job``, ``endpoint``;
pods that ended dropped), then the endpoint's ``relabelings`` and ``honorLabels``, scheme, path,
interval and TLS (its CA read from the Secret the monitor names). So what is proven about the
labels is what a cluster running the Operator sees from the chart's own ServiceMonitor.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.k8s.k8s_tier import KubeAPI
from tests.k8s.pods import request_ok
from tests.k8s.prometheus_tools import prometheus
from tests.support.net import free_port
from tests.support.processes import Process, start_process
from tests.support.waiting import wait_until

RELABEL_KEYS = {"sourceLabels": "source_labels", "targetLabel": "target_label"}


def label_name(key: str) -> str:
    """A Kubernetes label key as the Kubernetes discovery's meta label suffix."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def operator_target_labels() -> list[dict[str, Any]]:
    """The target labels the Operator gives every ServiceMonitor target, in its order."""
    meta = "__meta_kubernetes_"
    return [
        {"source_labels": [f"{meta}namespace"], "target_label": "namespace"},
        {"source_labels": [f"{meta}service_name"], "target_label": "service"},
        {"source_labels": [f"{meta}pod_name"], "target_label": "pod"},
        {"source_labels": [f"{meta}pod_container_name"], "target_label": "container"},
        {"action": "drop", "source_labels": [f"{meta}pod_phase"], "regex": "(Failed|Succeeded)"},
        {"source_labels": [f"{meta}service_name"], "target_label": "job"},
    ]


def scrape_jobs(monitor: dict[str, Any], api: KubeAPI, work: Path) -> list[dict[str, Any]]:
    """One scrape job per endpoint of ``monitor``, as the Operator writes them (module docstring);
    discovery authenticates with the tier's admin token."""
    spec = monitor["spec"]
    token = work / "token"
    token.write_text(api.token)
    discovery = {
        "role": "endpoints",
        "api_server": api.url,
        "tls_config": {"ca_file": str(api.ca_path)},
        "authorization": {"credentials_file": str(token)},
        "namespaces": {"names": spec["namespaceSelector"]["matchNames"]},
    }
    keep_service = [
        {
            "action": "keep",
            "source_labels": [
                f"__meta_kubernetes_service_label_{label_name(key)}",
                f"__meta_kubernetes_service_labelpresent_{label_name(key)}",
            ],
            "regex": f"{re.escape(value)};true",
        }
        for key, value in spec["selector"]["matchLabels"].items()
    ]
    meta = monitor["metadata"]
    jobs = []
    for index, endpoint in enumerate(spec["endpoints"]):
        port = endpoint["port"]
        relabel = [
            *keep_service,
            {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": port},
            *operator_target_labels(),
            {"target_label": "endpoint", "replacement": port},
            *({RELABEL_KEYS.get(k, k): v for k, v in r.items()} for r in endpoint.get("relabelings", [])),
        ]
        job: dict[str, Any] = {
            "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{index}",
            "honor_labels": bool(endpoint.get("honorLabels", False)),
            "scrape_interval": endpoint["interval"],
            "scrape_timeout": endpoint["interval"],
            "scheme": endpoint["scheme"],
            "metrics_path": endpoint["path"],
            "kubernetes_sd_configs": [discovery],
            "relabel_configs": relabel,
        }
        tls = endpoint.get("tlsConfig")
        if tls:
            secret = tls["ca"]["secret"]
            found = request_ok(api, "GET", f"/api/v1/namespaces/{meta['namespace']}/secrets/{secret['name']}")
            ca = work / f"ca-{index}.crt"
            ca.write_bytes(base64.b64decode(found["data"][secret["key"]]))
            job["tls_config"] = {"ca_file": str(ca), "server_name": tls["serverName"]}
        jobs.append(job)
    return jobs


@dataclass
class LivePrometheus:
    url: str
    process: Process
    interval_s: float

    def _get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as answer:
            reply = json.loads(answer.read())
        assert reply["status"] == "success", reply
        return reply["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` gives now: each sample's labels and value."""
        data = self._get("/api/v1/query", query=expr)
        if data["resultType"] == "scalar":
            return [{"labels": {}, "value": float(data["result"][1])}]
        return [{"labels": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def alerts(self) -> list[dict[str, Any]]:
        """Alerts pending or firing now (labels, state)."""
        return list(self._get("/api/v1/alerts")["alerts"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/targets", state="active")["activeTargets"])

    def stop(self) -> None:
        self.process.stop()


def start_prometheus(
    jobs: list[dict[str, Any]], rule_groups: list[dict[str, Any]], work: Path, log_dir: Path
) -> LivePrometheus:
    """Prometheus on a free loopback port with ``jobs`` and the rules ``rule_groups``, evaluated
    every second; data in ``work``. It refuses to start on a config or rule it cannot load."""
    rules = work / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups}, sort_keys=False, allow_unicode=True))
    config = work / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"evaluation_interval": "1s", "scrape_interval": "2s"},
                "rule_files": [str(rules)],
                "scrape_configs": jobs,
            },
            sort_keys=False,
        )
    )
    port = free_port()
    process = start_process(
        "prometheus",
        [
            str(prometheus()),
            f"--config.file={config}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        log_dir,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    try:
        wait_until(ready, "Prometheus /-/ready", 60, interval=0.25, process=process)
    except BaseException:
        process.stop()
        raise
    interval = min(float(job["scrape_interval"].rstrip("s")) for job in jobs)
    return LivePrometheus(url, process, interval)
