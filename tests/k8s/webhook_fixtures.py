"""Helpers for the webhook end-to-end tests (test_webhook_e2e.py): the real ``ix-gpu webhook`` process,
its MutatingWebhookConfiguration (with the CEL matchConditions), raw API calls that keep the
response's Warning headers, and bounded polling.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.k8s.k8s_tier import KubeAPI, Process, free_port, start_process, tail

REPO = Path(__file__).resolve().parents[2]
GPU_RESOURCES = ("iluvatar.com/gpu", "nvidia.com/gpu")
INJECTED = "ix-gpu.io/injected"
INJECT = "ix-gpu.io/inject"
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
SUITE_LABEL = "e2e.ix-gpu.io/suite"
SCOPE_LABEL = "e2e.ix-gpu.io/webhook"


def ix_gpu(*args: str) -> str:
    """Run the ``ix-gpu`` CLI of this checkout; returns stdout (raises with stderr on failure)."""
    result = subprocess.run(
        [sys.executable, "-m", "ix_gpu", *args], cwd=REPO, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"ix-gpu {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result.stdout


def generate_certs(out: Path) -> Path:
    """``ix-gpu certs generate`` for 127.0.0.1 (the apiserver dials the webhook by IP)."""
    ix_gpu("certs", "generate", "--out", str(out), "--ip", "127.0.0.1", "--dns", "localhost")
    return out


# --------------------------------------------------------------------------- config


def webhook_config(privileged_namespaces: list[str]) -> dict[str, Any]:
    """The built-in config, with the seed's nvidia profile (device nodes by hostPath, CUDA libraries
    prepended to LD_LIBRARY_PATH, privileged allowed) and privileged allowed for Iluvatar too, in the
    given namespaces only."""
    config: dict[str, Any] = yaml.safe_load(ix_gpu("config", "default"))
    for profile in config["profiles"]:
        profile["privileged"] = "allowed"
        if profile["name"] == "nvidia":
            profile["deviceNodes"]["inject"] = True
    config["policy"]["privilegedNamespaces"] = list(privileged_namespaces)
    return config


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    ix_gpu("config", "validate", str(path))
    return path


# --------------------------------------------------------------------------- CEL matchConditions

_GPU_LIST = "[" + ", ".join(f"'{r}'" for r in GPU_RESOURCES) + "]"
_WANTS_GPU = (
    "((has(s.containers) ? s.containers : []) + (has(s.initContainers) ? s.initContainers : []))"
    ".exists(c, has(c.resources) && ("
    f"(has(c.resources.limits) && c.resources.limits.exists(r, r in {_GPU_LIST})) || "
    f"(has(c.resources.requests) && c.resources.requests.exists(r, r in {_GPU_LIST}))))"
)
_POD_SPECS = (
    "(request.resource.resource == 'pods' ? (has(object.spec) ? [object.spec] : []) : "
    "(has(object.spec) && has(object.spec.tfReplicaSpecs) ? "
    "object.spec.tfReplicaSpecs.map(k, object.spec.tfReplicaSpecs[k])"
    ".filter(t, has(t.template) && has(t.template.spec)).map(t, t.template.spec) : []))"
)
REQUESTS_GPU_CEL = f"{_POD_SPECS}.exists(s, {_WANTS_GPU})"
"""True when some container or initContainer of the Pod (or of a TFJob replica template) names an
Iluvatar or NVIDIA GPU in its limits or requests."""


def mutating_webhook_configuration(
    name: str,
    url: str,
    ca_bundle: bytes,
    scope: dict[str, str],
    *,
    failure_policy: str = "Fail",
    match_conditions: bool = True,
    reinvocation: str = "IfNeeded",
    tfjobs: bool = True,
    timeout_s: int = 10,
) -> dict[str, Any]:
    """ix-gpu's registration: url + caBundle, pods (and kubeflow.org tfjobs) CREATE, opt-out label
    excluded by namespaceSelector; ``scope`` labels keep the suite's webhooks off other tests' namespaces."""
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]
    if tfjobs:
        rules.append(
            {
                "apiGroups": ["kubeflow.org"],
                "apiVersions": ["*"],
                "operations": ["CREATE"],
                "resources": ["tfjobs"],
            }
        )
    webhook: dict[str, Any] = {
        "name": "gpu.ix-gpu.io",
        "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()},
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "matchPolicy": "Equivalent",
        "reinvocationPolicy": reinvocation,
        "failurePolicy": failure_policy,
        "timeoutSeconds": timeout_s,
        "rules": rules,
        "namespaceSelector": {
            "matchLabels": dict(scope),
            "matchExpressions": [{"key": INJECT, "operator": "NotIn", "values": ["disabled"]}],
        },
    }
    if match_conditions:
        webhook["matchConditions"] = [{"name": "requests-gpu", "expression": REQUESTS_GPU_CEL}]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [webhook],
    }


# --------------------------------------------------------------------------- API calls


@dataclasses.dataclass
class ApiResponse:
    status: int
    body: Any
    warnings: list[str]

    def ok(self) -> bool:
        return 200 <= self.status < 300


_WARNING = re.compile(r'^\s*\d{3}\s+\S+\s+"((?:[^"\\]|\\.)*)"')


def parse_warning(header: str) -> str:
    """``299 - "text"`` → ``text`` (RFC 7234 warn-text, as the apiserver writes it)."""
    match = _WARNING.match(header)
    return match.group(1).replace('\\"', '"').replace("\\\\", "\\") if match else header


def api(
    kube: KubeAPI,
    method: str,
    path: str,
    body: Any = None,
    query: dict[str, str] | None = None,
    timeout: float = 40,
    content_type: str = "application/json",
) -> ApiResponse:
    """A raw call to the real apiserver that keeps the Warning headers (kube_api.request drops them)."""
    url = kube.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {kube.token}", "Content-Type": content_type},
    )
    try:
        with urllib.request.urlopen(req, context=kube.ssl_context(), timeout=timeout) as resp:
            status, raw, headers = resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as err:
        status, raw, headers = err.code, err.read(), err.headers
    try:
        decoded: Any = json.loads(raw)
    except ValueError:
        decoded = raw.decode(errors="replace")
    return ApiResponse(status, decoded, [parse_warning(h) for h in headers.get_all("Warning") or []])


def must(resp: ApiResponse) -> Any:
    assert resp.ok(), f"HTTP {resp.status}: {resp.body}"
    return resp.body


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 30, interval: float = 0.2) -> Any:
    """Poll until check() returns something truthy (returned); bounded."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


# --------------------------------------------------------------------------- the webhook process


class WebhookServer:
    """The real ``ix-gpu webhook`` in a subprocess on 127.0.0.1, with certificates made by
    ``ix-gpu certs generate``; ``stop()`` and ``start()`` keep the port."""

    def __init__(self, name: str, config: Path, cert_dir: Path, kubeconfig: Path, log_dir: Path) -> None:
        self.name = name
        self.config = config
        self.cert_dir = cert_dir
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.port = free_port()
        self.process: Process | None = None

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.base + "/mutate"

    @property
    def ca_bundle(self) -> bytes:
        return (self.cert_dir / "ca.crt").read_bytes()

    def _context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert_dir / "ca.crt"))

    def get(self, path: str, timeout: float = 5) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.base + path, context=self._context(), timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def post_review(self, review: dict[str, Any], timeout: float = 10) -> dict[str, Any]:
        req = urllib.request.Request(
            self.url,
            data=json.dumps(review).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, context=self._context(), timeout=timeout) as resp:
            result: dict[str, Any] = json.loads(resp.read())
        return result

    def start(self, timeout_s: float = 60, wait_ready: bool = True) -> WebhookServer:
        """Start the process; by default wait for /readyz (else only for /healthz)."""
        argv = [
            sys.executable, "-m", "ix_gpu", "webhook",
            "--config", str(self.config),
            "--cert-dir", str(self.cert_dir),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--kubeconfig", str(self.kubeconfig),
        ]  # fmt: skip
        self.process = start_process(f"ix-gpu-webhook-{self.name}", argv, self.log_dir)
        self.wait_ready(timeout_s, "/readyz" if wait_ready else "/healthz")
        return self

    def wait_ready(self, timeout_s: float = 60, path: str = "/readyz") -> None:
        """/readyz 200: serving TLS, config loaded, namespace cache synced with the apiserver."""
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.process.alive():
                raise RuntimeError(f"ix-gpu webhook exited: {self.process.log}\n{tail(self.process.log)}")
            try:
                if self.get(path, timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"ix-gpu webhook not ready in {timeout_s:g}s: {tail(self.process.log)}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        status, raw = self.get("/metrics")
        assert status == 200, raw
        samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for line in raw.decode().splitlines():
            if not line or line.startswith("#"):
                continue
            match = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)$", line)
            if match:
                labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
                samples[(match.group(1), labels)] = float(match.group(3))
        return samples

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.metrics().items() if n == name and wanted <= ls)

    def admissions(self, **labels: str) -> float:
        return self.metric("ix_gpu_admission_requests_total", **labels)
