"""The mutation core: (object, operation, namespace facts, config) → ops, warnings, decision.

A pure function — no I/O, no clock, no globals — so it is trivially testable, safe to call for
dry runs, and the same code answers ``ix-gpu mutate`` on a laptop and the apiserver in a cluster.
The HTTPS service, the namespace cache and TLS are a shell around it.

Order of questions, cheapest and most decisive first: is this kind ours, is the namespace or
object opted out, does any container ask for a configured GPU resource (and validly), and only
then what to add.
"""

from __future__ import annotations

from typing import Any

from devicemodel import labels
from webhook.compiled_config import CompiledConfig
from webhook.decision import Decision, MutationResult, NamespaceFacts, denied, skipped
from webhook.gpu_requests import GpuContainer, GpuRequestError, gpu_containers
from webhook.pod_injection import InjectionDenied, InjectionRun, inject_template
from webhook.templates import PodTemplate, find_templates

_PSA_HOST_ACCESS_FORBIDDEN = ("baseline", "restricted")


def _string_map(container: Any, key: str) -> dict[str, Any]:
    value = container.get(key) if isinstance(container, dict) else None
    return value if isinstance(value, dict) else {}


def _opted_out(keys: Any) -> bool:
    """``ix-gpu.io/inject: disabled`` in an object's annotation or label map (a JSON dict)."""
    return keys.__class__ is dict and keys.get(labels.INJECT) == labels.INJECT_DISABLED


def _psa_level(namespace: NamespaceFacts) -> str | None:
    level = namespace.labels.get(labels.PSA_ENFORCE) if namespace.known else None
    return level if isinstance(level, str) else None


def _privileged_block(namespace: NamespaceFacts, config: CompiledConfig) -> str | None:
    if not config.namespace_may_be_privileged(namespace.name):
        return f'namespace "{namespace.name}" is not in policy.privilegedNamespaces'
    if not namespace.known:
        return f'the Pod Security level of namespace "{namespace.name}" is unknown'
    level = _psa_level(namespace)
    if level in _PSA_HOST_ACCESS_FORBIDDEN:
        return f'namespace "{namespace.name}" enforces Pod Security "{level}"'
    return None


def _host_path_block(namespace: NamespaceFacts) -> str | None:
    level = _psa_level(namespace)
    if level in _PSA_HOST_ACCESS_FORBIDDEN:
        return f'namespace "{namespace.name}" enforces Pod Security "{level}", which rejects hostPath'
    return None


def _gpu_types(*annotation_maps: dict[str, Any]) -> list[str]:
    for annotation_map in annotation_maps:
        raw = annotation_map.get(labels.GPU_TYPE)
        if isinstance(raw, str) and raw.strip():
            values = [labels.label_value(part) for part in raw.split(",")]
            return [v for v in dict.fromkeys(values) if v]
    return []


def mutate(obj: Any, operation: str, namespace: NamespaceFacts, config: CompiledConfig) -> MutationResult:
    """Decide what to inject into ``obj`` (a Pod, TFJob or configured CRD, as a plain dict)."""
    if operation != "CREATE":
        return skipped(f"operation {operation} is not mutated")
    if not isinstance(obj, dict):
        return skipped("no object to mutate")
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return skipped("object has no apiVersion/kind")
    workload = config.workload(api_version, kind)
    if workload is None:
        return skipped(f"{kind} ({api_version}) is not a configured workload")
    if config.namespace_excluded(namespace.name):
        return skipped(f'namespace "{namespace.name}" is excluded by policy.excludedNamespaces')
    if namespace.known and labels.INJECT_DISABLED in (
        namespace.annotations.get(labels.INJECT),
        namespace.labels.get(labels.INJECT),
    ):
        return skipped(f'namespace "{namespace.name}" opted out ({labels.INJECT}={labels.INJECT_DISABLED})')
    metadata = _string_map(obj, "metadata")
    annotations = _string_map(metadata, "annotations")
    if labels.MIRROR_POD in annotations:
        return skipped("mirror pods are managed by the kubelet")
    if _opted_out(annotations) or _opted_out(metadata.get("labels")):
        return skipped(f"object opted out ({labels.INJECT}={labels.INJECT_DISABLED})")

    plans: list[tuple[PodTemplate, list[GpuContainer], list[str]]] = []
    opted_out_templates = 0
    try:
        for template in find_templates(obj, workload.template_paths):
            spec = template.body.get("spec")
            if not isinstance(spec, dict):
                continue
            template_annotations = _string_map(_string_map(template.body, "metadata"), "annotations")
            if template.pointer and _opted_out(template_annotations):
                opted_out_templates += 1
                continue
            containers = gpu_containers(spec, config, template.where)
            if containers:
                plans.append((template, containers, _gpu_types(template_annotations, annotations)))
    except GpuRequestError as exc:
        return denied(str(exc))
    if not plans:
        if opted_out_templates:
            return skipped("every GPU template opted out, or no container requests a configured GPU")
        return skipped("no container requests a configured GPU resource")

    run = InjectionRun(
        digest=config.digest,
        host_path_block=_host_path_block(namespace),
        privileged_block=_privileged_block(namespace, config),
    )
    try:
        for template, containers, gpu_types in plans:
            inject_template(template, containers, gpu_types, run)
    except InjectionDenied as exc:
        return denied(str(exc), run.warnings)

    warnings = [*run.warnings, *run.conflicts]
    profiles = tuple(run.profiles_used)
    if run.conflicts and config.policy.conflict_policy.value == "deny":
        return denied("conflicts with the user's settings: " + "; ".join(run.conflicts), run.warnings)
    if run.ops:
        return MutationResult(
            Decision.MUTATED, run.ops, warnings, f"injected {'+'.join(profiles)}@{config.digest}", profiles
        )
    return MutationResult(Decision.UNCHANGED, [], warnings, "already injected", profiles)
