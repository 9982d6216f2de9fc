"""Render and lint charts/ix-gpu with Helm's own Go SDK (PyPI ``helm-python-sdk``, Helm 4).

Renders are cached per values: the SDK is fast, but the suite renders the same values for
several assertions and the machine is shared.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import helm_python as helm
import yaml

from tests.support.paths import ROOT

CHART = ROOT / "charts" / "ix-gpu"
RELEASE = "ixg"
NAMESPACE = "ix-gpu-system"
KUBE_VERSIONS = ("1.30.0", "1.35.0")

# Values that make each certificate mode renderable (provided needs its Secret and CA).
CERT_MODES: dict[str, dict[str, Any]] = {
    "self": {},
    "certManager": {"certs": {"mode": "certManager"}},
    "provided": {"certs": {"mode": "provided", "provided": {"secretName": "my-tls", "caBundle": "Q0EgUEVN"}}},
}

HelmError = helm.HelmError


@lru_cache(maxsize=1)
def chart() -> helm.Chart:
    return helm.Chart.load(str(CHART))


@lru_cache(maxsize=64)
def _render(values_json: str, release: str, namespace: str) -> tuple[tuple[str, str], ...]:
    values = json.loads(values_json)
    out = chart().render(values, name=release, namespace=namespace, is_install=True)
    return tuple(sorted(out.items()))


def render_files(
    values: dict[str, Any] | None = None, release: str = RELEASE, namespace: str = NAMESPACE
) -> dict[str, str]:
    return dict(_render(json.dumps(values or {}, sort_keys=True), release, namespace))


def render(
    values: dict[str, Any] | None = None,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    *,
    hooks: bool = False,
) -> list[dict[str, Any]]:
    """The objects ``helm install`` creates (NOTES.txt excluded), in file order; with ``hooks``,
    also the hook objects (``helm test``'s pod and its RBAC), which an install does not create."""
    objects: list[dict[str, Any]] = []
    for path, text in render_files(values, release, namespace).items():
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc and (hooks or not is_hook(doc)))
    return objects


def is_hook(obj: dict[str, Any]) -> bool:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return "helm.sh/hook" in annotations


def notes(values: dict[str, Any] | None = None) -> str:
    files = render_files(values)
    return next(text for path, text in files.items() if path.endswith("NOTES.txt"))


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    hits = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in hits]}"
    return hits[0]


def kinds(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objects)


def lint(values: dict[str, Any] | None = None, kube_version: str = "1.35.0") -> dict[str, Any]:
    report: dict[str, Any] = helm.lint(
        str(CHART), values, strict=True, namespace=NAMESPACE, kube_version=f"v{kube_version}"
    )
    return report


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Deep merge of plain value trees (extra wins)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out
