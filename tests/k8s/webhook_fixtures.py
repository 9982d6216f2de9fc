"""Helpers for the webhook end-to-end tests (test_webhook_e2e.py): the config of the real
``ix-gpu webhook`` process (``tests.support.webhook_process``), its MutatingWebhookConfiguration (with
the CEL matchConditions) and raw API calls that keep the response's Warning headers.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.k8s.k8s_tier import KubeAPI
from tests.support.cli import ix_gpu
from tests.support.paths import ROOT

GPU_RESOURCES = ("iluvatar.com/gpu", "nvidia.com/gpu")
INJECTED = "ix-gpu.io/injected"
INJECT = "ix-gpu.io/inject"
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
SUITE_LABEL = "e2e.ix-gpu.io/suite"
SCOPE_LABEL = "e2e.ix-gpu.io/webhook"


# --------------------------------------------------------------------------- config


def webhook_config(privileged_namespaces: list[str]) -> dict[str, Any]:
    """The built-in config, with the seed's nvidia profile (device nodes by hostPath, CUDA libraries
    prepended to LD_LIBRARY_PATH, privileged allowed) and privileged allowed for Iluvatar too, in the
    given namespaces only."""
    config: dict[str, Any] = yaml.safe_load(ix_gpu("config", "default", check=True).stdout)
    # The built-in nvidia profile leaves the driver to the container toolkit; these tests check
    # the seed's hostPath recipe, kept as an example config.
    example = yaml.safe_load((ROOT / "examples" / "nvidia-hostpath-driver.yaml").read_text())
    config["profiles"] = example["profiles"]
    for profile in config["profiles"]:
        profile["privileged"] = "allowed"
        if profile["name"] == "nvidia":
            profile["deviceNodes"]["inject"] = True
    config["policy"]["privilegedNamespaces"] = list(privileged_namespaces)
    return config


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    ix_gpu("config", "validate", str(path), check=True)
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
