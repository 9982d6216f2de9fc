"""The cluster operator's webhook configuration: profiles, workloads and policy.

A *profile* says what a container that asks for a matching GPU resource gets (driver volumes,
env, privileged, scheduling). *Workloads* say which kinds are mutated and where their pod templates
live, so new CRDs are supported by configuration alone. *Policy* holds opt-outs and gating.

The built-in default (:func:`default_config`) is derived from :mod:`ix_gpu.devicemodel.vendors`, so the
facts about a vendor are written once. :func:`json_schema` is the JSON Schema of these models, the
one schema of the config (``ix-gpu config schema``; the Helm chart's ``values.schema.json`` embeds it).
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, field_validator

from ix_gpu.config.schema_base import load_yaml_file, parse_document
from ix_gpu.config.webhook_profile import (
    ConfigModel,
    DeviceNodes,
    EnvMode,
    EnvVar,
    HostPathType,
    HostPathVolume,
    NamespacePattern,
    NonEmpty,
    Profile,
    Toleration,
    require_unique,
)
from ix_gpu.devicemodel.vendors import ILUVATAR, NVIDIA, Vendor

API_VERSION: Literal["ix-gpu.io/v1alpha1"] = "ix-gpu.io/v1alpha1"
KIND: Literal["WebhookConfig"] = "WebhookConfig"

_PATH_SEGMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[\*\])?$|^\*$")

_GLOB_CHARS = frozenset("*?[")


class Workload(ConfigModel):
    """A kind the webhook mutates and where its pod templates are."""

    api_version: NonEmpty
    """Exact (``kubeflow.org/v1``) or glob (``kubeflow.org/*``)."""
    kind: NonEmpty
    template_paths: tuple[NonEmpty, ...] = Field(min_length=1)
    """Dotted paths to PodTemplateSpecs: ``spec.tfReplicaSpecs.*.template`` (``*`` = every map key),
    ``spec.replica_specs[*].template`` (``[*]`` = every list item), or ``.`` for a Pod itself."""
    resource: Annotated[str, Field(max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")] | None = Field(
        default=None,
        # Left out of dumps while unset, so configs that never name it keep their digest.
        exclude_if=lambda value: value is None,
    )
    """The kind's plural resource name (``tfjobs``), under which the Helm chart registers the webhook
    for it. Default: the guess Kubernetes makes from the kind (lower case; ``-s`` → ``-ses``, ``-y`` →
    ``-ies``, else ``+s``). The webhook itself matches objects by apiVersion and kind."""

    def resource_name(self) -> str:
        """``resource``, else the guess client-go makes for a kind it has no mapping for
        (``UnsafeGuessKindToResource``): lower case, then ``-s`` → ``-ses``, ``-y`` → ``-ies``,
        anything else + ``s``. ``*`` for a kind glob. The chart's template makes the same guess."""
        if self.resource:
            return self.resource
        if _GLOB_CHARS & set(self.kind):
            return "*"
        singular = self.kind.lower()
        if singular.endswith("s"):
            return singular + "es"
        if singular.endswith("y"):
            return singular[:-1] + "ies"
        return singular + "s"

    @field_validator("template_paths")
    @classmethod
    def _paths(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for path in value:
            if path == ".":
                continue
            if not all(_PATH_SEGMENT.match(seg) for seg in path.split(".")):
                raise ValueError(f"{path!r}: segments are names, '*' or name[*], joined by '.'")
        # Two paths that can reach the same template inject into it twice: duplicate volume names
        # in one patch, which the apiserver refuses for every object of the kind.
        for later, path in enumerate(value):
            for earlier in range(later):
                if _paths_overlap(value[earlier], path):
                    raise ValueError(
                        f"templatePaths[{earlier}] {value[earlier]!r} and templatePaths[{later}] {path!r} "
                        "can reach the same pod template, which would be injected twice; keep one"
                    )
        return value


def _path_steps(path: str) -> list[str | None]:
    """A template path as the walk takes it: a map key, ``None`` for every key (``*``), ``"[*]"``
    for every list item (``name[*]`` is the key ``name``, then every item)."""
    steps: list[str | None] = []
    for segment in [] if path == "." else path.split("."):
        if segment == "*":
            steps.append(None)
        elif segment.endswith("[*]"):
            steps += [segment[:-3], "[*]"]
        else:
            steps.append(segment)
    return steps


def _paths_overlap(first: str, second: str) -> bool:
    """Whether one node of some object is at both paths: as long, and at each step the same key,
    or ``*`` and any key (a list item is never a map key)."""
    a, b = _path_steps(first), _path_steps(second)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x == y:
            continue
        if "[*]" in (x, y) or (x is not None and y is not None):
            return False
    return True


class NamespaceLookupFailure(StrEnum):
    """What to do when facts the decision needs cannot be learned (a namespace, a resource claim)."""

    ALLOW_UNMODIFIED = "allow-unmodified"
    DENY = "deny"


class ConflictPolicy(StrEnum):
    KEEP_USER = "keep-user"
    """Keep the user's value and warn, naming the field (default)."""
    DENY = "deny"


class Policy(ConfigModel):
    excluded_namespaces: tuple[NamespacePattern, ...] = ("kube-system", "kube-public", "kube-node-lease")
    """Namespace names or globs (``team-*``; ``*`` and ``?``) the webhook leaves alone. The chart
    puts names into the webhook's namespaceSelector and globs into its matchConditions."""
    privileged_namespaces: tuple[NamespacePattern, ...] = ()
    """Namespaces (names or globs) where a profile with ``privileged: allowed|required`` may set
    privileged."""
    conflict_policy: ConflictPolicy = ConflictPolicy.KEEP_USER
    namespace_lookup_failure: NamespaceLookupFailure = NamespaceLookupFailure.DENY
    """What the service does when it cannot learn a namespace's annotations and labels within its
    lookup budget (a namespace created a moment ago, read while the API server restarts): ``deny``
    refuses the GPU object with a retriable message, which controllers and clients retry;
    ``allow-unmodified`` admits it with no injection (it then fails on its GPU node, far from
    its cause), warns, and counts ``ix_gpu_admission_allowed_unmodified_total``. ``deny`` is what
    a webhook registered with ``failurePolicy: Fail`` promises, and the default."""
    claim_lookup_failure: NamespaceLookupFailure = NamespaceLookupFailure.DENY
    """What the webhook does when a container references a resource claim whose device classes it
    cannot learn (its watch has not synced, or the ResourceClaim or ResourceClaimTemplate is not
    there yet): ``deny`` (default) refuses the object; ``allow-unmodified`` injects nothing for that
    claim, warns and counts. Only asked when a profile names ``deviceClasses``."""
    keep_image_library_path_in_claims: bool = Field(
        default=True,
        # Left out of dumps while true, so configs that never name it keep their digest.
        exclude_if=lambda value: value is True,
    )
    """A container that gets its GPUs only through DRA claims (none in its limits) keeps its
    image's ``LD_LIBRARY_PATH``: there a profile's ``LD_LIBRARY_PATH`` of mode ``prepend-path`` or
    ``append-path`` acts as ``prepend-path-if-set`` or ``append-path-if-set`` (merged into a value
    the container's spec sets, none added where it sets none). A claim's CDI spec puts the driver
    in the container's linker cache, so the variable is not needed to find it. ``false``: the
    profile's mode in every GPU container (for nodes whose runtime cannot run the CDI spec's
    hook)."""


def _builtin_workloads() -> tuple[Workload, ...]:
    return (
        Workload(api_version="v1", kind="Pod", template_paths=(".",)),
        Workload(
            api_version="kubeflow.org/v1", kind="TFJob", template_paths=("spec.tfReplicaSpecs.*.template",)
        ),
        # tf-operator's TfJob of 2017 (mlkube.io), as in its GPU discussion.
        Workload(
            api_version="mlkube.io/v1beta1", kind="TfJob", template_paths=("spec.replica_specs[*].template",)
        ),
    )


class WebhookConfig(ConfigModel):
    api_version: Literal["ix-gpu.io/v1alpha1"] = API_VERSION
    kind: Literal["WebhookConfig"] = KIND
    profiles: tuple[Profile, ...] = Field(default_factory=lambda: default_profiles())
    workloads: tuple[Workload, ...] = Field(default_factory=_builtin_workloads)
    """Replaces the built-in list when given: start from ``ix-gpu config default``."""
    policy: Policy = Policy()

    # Field validators, not one model validator: the error then names the list ("profiles: ...")
    # and both entries, which is what an operator reading a crash-looping pod's log needs.
    @field_validator("profiles")
    @classmethod
    def _unique_profiles(cls, profiles: tuple[Profile, ...]) -> tuple[Profile, ...]:
        require_unique("profile name", [p.name for p in profiles], "profiles")
        return profiles

    @field_validator("workloads")
    @classmethod
    def _unique_workloads(cls, workloads: tuple[Workload, ...]) -> tuple[Workload, ...]:
        require_unique("workload", [f"{w.api_version} {w.kind}" for w in workloads], "workloads")
        return workloads

    def to_yaml(self) -> str:
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return yaml.safe_dump(data, sort_keys=False)


def vendor_profile(vendor: Vendor) -> Profile:
    """The built-in profile for a vendor: driver libraries and env where the vendor's runtime does
    not provide them, scheduling, nothing privileged."""
    driver: tuple[HostPathVolume, ...] = ()
    env: tuple[EnvVar, ...] = ()
    if not vendor.runtime_provides_driver:
        driver = (
            HostPathVolume(
                name=f"ix-gpu-{vendor.name}-driver",
                host_path=vendor.driver_root,
                type=HostPathType.DIRECTORY,
                mount_path=vendor.driver_root,
                read_only=True,
            ),
        )
        env = (EnvVar(name="LD_LIBRARY_PATH", value=vendor.library_dir, mode=EnvMode.PREPEND_PATH),)
    nodes = (vendor.device_node(0), *vendor.control_nodes)
    device_volumes = tuple(
        HostPathVolume(
            name="ix-gpu-dev-" + path.removeprefix("/dev/").replace("_", "-"),
            host_path=path,
            type=HostPathType.CHAR_DEVICE,
            mount_path=path,
        )
        for path in nodes
    )
    return Profile(
        name=vendor.name,
        resources=(vendor.resource_name,),
        device_classes=vendor.device_classes,
        volumes=driver,
        device_nodes=DeviceNodes(inject=False, volumes=device_volumes),
        env=env,
        # GPU nodes are commonly tainted with their resource name; tolerate that taint only.
        tolerations=(Toleration(key=vendor.resource_name, operator="Exists", effect="NoSchedule"),),
    )


def default_profiles() -> tuple[Profile, ...]:
    return (vendor_profile(ILUVATAR), vendor_profile(NVIDIA))


def default_config() -> WebhookConfig:
    return WebhookConfig()


JSON_SCHEMA_ID = "urn:ix-gpu:webhook-config:v1alpha1"
"""``$id`` of :func:`json_schema`: its ``#/definitions/...`` references resolve inside it, also where
another schema embeds it (the chart's ``values.schema.json``, under ``config``)."""


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft-07, which Helm and editors read) of :class:`WebhookConfig` files.

    Generated from the models, so nothing is written twice: keys are camelCase, unknown keys are
    rejected (``additionalProperties: false``), enums and required fields as the models say.
    Kubernetes' rules for names (:mod:`k8s_names`) are in it as far as a pattern can say them;
    the rest (lengths of name parts, operator rules, unique names, overlapping paths) is code, which
    ``ix-gpu config validate`` and the webhook's loader apply.
    """
    schema = WebhookConfig.model_json_schema(by_alias=True, ref_template="#/definitions/{model}")
    definitions = schema.pop("$defs", {})
    for model in (schema, *definitions.values()):
        for field in model.get("properties", {}).values():
            # pydantic's field titles ("Hostpath") only repeat the key, badly capitalised.
            field.pop("title", None)
        # A dict with checked keys comes out as patternProperties, which lets any other key pass:
        # say it as draft-07 does, every key must match.
        for field in model.get("properties", {}).values():
            patterns = field.pop("patternProperties", None)
            if patterns:
                ((key_pattern, value_schema),) = patterns.items()
                field["propertyNames"] = {"pattern": key_pattern}
                field["additionalProperties"] = value_schema
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": JSON_SCHEMA_ID,
        **schema,
        "definitions": dict(sorted(definitions.items())),
    }


def parse_config(data: Any, source: str = "config") -> WebhookConfig:
    return parse_document(WebhookConfig, data, source)


def load_config(path: str | Path | None) -> WebhookConfig:
    """The config at ``path``, or the built-in default when ``path`` is None."""
    if path is None:
        return default_config()
    return load_yaml_file(WebhookConfig, path)


__all__ = [
    "WebhookConfig",
    "default_config",
    "json_schema",
    "load_config",
    "parse_config",
]
