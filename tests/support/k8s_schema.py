"""Validate objects against the Kubernetes OpenAPI schemas shipped by ``kubernetes-validate``.

``kubernetes_validate.validate`` rebuilds its validator on every call (~30 ms); property tests call
it thousands of times, so validators are cached per (version, kind). Strict schemas reject unknown
fields, which is what catches a misplaced patch path.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import jsonschema
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource


@lru_cache(maxsize=64)
def _validator(version: str, kind: str, api_version: str) -> jsonschema.protocols.Validator:
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema_dir = f"v{version}-local-strict"
    schema = schema_contents(
        f"kubernetes-json-schema/{schema_dir}/{kind.lower()}-{group_version}.json", version
    )
    definitions = schema_contents(f"kubernetes-json-schema/{schema_dir}/_definitions.json", version)
    registry: Registry[Any] = Resource.from_contents(definitions) @ (
        Resource.from_contents(schema) @ Registry()
    )
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def validate(obj: dict[str, Any], version: str = "1.35.0") -> None:
    """Raise ``jsonschema.ValidationError`` when ``obj`` is not valid for Kubernetes ``version``."""
    _validator(version, obj["kind"], obj["apiVersion"]).validate(obj)


def validate_pod_template(template: dict[str, Any], version: str = "1.35.0") -> None:
    """A pod template (e.g. from a TFJob) checked as the template of a core/v1 PodTemplate."""
    validate(
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}, version
    )
