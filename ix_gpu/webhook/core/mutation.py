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

from ix_gpu.config.webhook_config import Workload
from ix_gpu.devicemodel import labels
from ix_gpu.webhook.core.claims import UNKNOWN_CLAIMS, ClaimFacts, claim_containers
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import Decision, MutationResult, NamespaceFacts, denied, skipped
from ix_gpu.webhook.core.gpu_requests import GpuContainer, GpuRequestError, gpu_containers
from ix_gpu.webhook.core.injection_record import strip_stale
from ix_gpu.webhook.core.injection_run import InjectionDenied, InjectionRun
from ix_gpu.webhook.core.pod_injection import inject_template
from ix_gpu.webhook.core.templates import PodTemplate, TemplateKeyError, find_templates

_PSA_LEVELS = ("privileged", "baseline", "restricted")
_PSA_HOST_ACCESS_FORBIDDEN = ("baseline", "restricted")


def _string_map(container: Any, key: str) -> dict[str, Any]:
    value = container.get(key) if isinstance(container, dict) else None
    return value if isinstance(value, dict) else {}


def _opted_out(keys: Any) -> bool:
    """``ix-gpu.io/inject: disabled`` in an object's annotation or label map (a JSON dict)."""
    return isinstance(keys, dict) and keys.get(labels.INJECT) == labels.INJECT_DISABLED


def _psa_enforced(namespace: NamespaceFacts) -> tuple[str, str] | None:
    """(level, why) that PodSecurity admission enforces in the namespace, read as it reads the
    label: an exact, case-sensitive ``privileged``/``baseline``/``restricted``; any other value
    (``Restricted``, ``restricted `` or ``""``) is an error that PodSecurity resolves to
    ``restricted``. No label (or unknown facts): None, the cluster's default, which this webhook
    cannot see and takes to be ``privileged``, Kubernetes' own default."""
    level = namespace.labels.get(labels.PSA_ENFORCE) if namespace.known else None
    if not isinstance(level, str):
        return None
    if level in _PSA_LEVELS:
        return level, f'namespace "{namespace.name}" enforces Pod Security "{level}"'
    shown = level if len(level) <= 40 else level[:39] + "…"
    return "restricted", (
        f'namespace "{namespace.name}" enforces Pod Security "restricted" (its label value {shown!r} '
        "is not a level, which PodSecurity admission reads as restricted)"
    )


def _privileged_block(namespace: NamespaceFacts, config: CompiledConfig) -> str | None:
    if not config.namespace_may_be_privileged(namespace.name):
        return f'namespace "{namespace.name}" is not in policy.privilegedNamespaces'
    if not namespace.known:
        return f'the Pod Security level of namespace "{namespace.name}" is unknown'
    enforced = _psa_enforced(namespace)
    if enforced is not None and enforced[0] in _PSA_HOST_ACCESS_FORBIDDEN:
        return enforced[1]
    return None


def _host_path_block(namespace: NamespaceFacts) -> str | None:
    enforced = _psa_enforced(namespace)
    if enforced is not None and enforced[0] in _PSA_HOST_ACCESS_FORBIDDEN:
        return f"{enforced[1]}, which rejects hostPath"
    return None


MAX_TEMPLATES = 64
"""Pod templates per object (a TFJob has a handful of replica types). More is refused rather than
walked: each template's patch ops and warnings grow the response."""
MAX_GPU_CONTAINERS = 256
"""GPU containers per object, checked before anything is injected."""
MAX_PATCH_OPS = 2000
"""A GPU pod needs tens of ops. This bounds the response an object can make us build and send."""
MAX_GPU_TYPES = 16
"""Models one ``gpu-type`` annotation may list. Each becomes a value of a required node-affinity
expression; a cluster has a handful of GPU models, and an unbounded list (tens of thousands of
values in a 1 MB annotation) would cost seconds of CPU per merge."""
MAX_GPU_TYPE_CHARS = 1024


def _gpu_types(*annotation_maps: dict[str, Any]) -> list[str]:
    """The models the nearest ``ix-gpu.io/gpu-type`` annotation names, as the plugin spells them
    in the ``ix-gpu.io/gpu.product`` node label (:func:`labels.gpu_product_value` on both sides)."""
    for annotation_map in annotation_maps:
        raw = annotation_map.get(labels.GPU_TYPE)
        if not isinstance(raw, str) or not raw.strip():
            continue
        if len(raw) > MAX_GPU_TYPE_CHARS:
            raise GpuRequestError(
                f"annotation {labels.GPU_TYPE} is {len(raw)} characters long; "
                f"at most {MAX_GPU_TYPE_CHARS} (a comma-separated list of GPU models)"
            )
        parts = raw.split(",")
        if len(parts) > MAX_GPU_TYPES:
            raise GpuRequestError(
                f"annotation {labels.GPU_TYPE} lists {len(parts)} GPU models; at most {MAX_GPU_TYPES}"
            )
        values = [labels.gpu_product_value(part) for part in parts]
        return [v for v in dict.fromkeys(values) if v]
    return []


def mutate(
    obj: Any,
    operation: str,
    namespace: NamespaceFacts,
    config: CompiledConfig,
    claims: ClaimFacts = UNKNOWN_CLAIMS,
) -> MutationResult:
    """Decide what to inject into ``obj`` (a Pod, TFJob or configured CRD, as a plain dict).
    ``claims``: what the DRA claims in the namespace request (see :mod:`.claims`).

    Three steps, each able to answer on its own: whether the object is ours to look at
    (:func:`_screen`), which of its templates ask for GPUs (:func:`_plan`), and what to add to
    them (:func:`_inject`)."""
    screened = _screen(obj, operation, namespace, config)
    if isinstance(screened, MutationResult):
        return screened
    planned = _plan(obj, screened, namespace, config, claims)
    if isinstance(planned, MutationResult):
        return planned
    if not planned.plans:
        return _nothing_to_inject(planned)
    return _inject(planned, namespace, config)


_Screened = tuple[str, Workload, dict[str, Any]]
"""What the first step read of an object that may be ours: its kind, its workload config and its
annotations (a plain tuple: one is made per review, and a NamedTuple costs several times more)."""


class _Plan:
    """The second step's findings: the GPU templates, and what else it met on the way."""

    __slots__ = ("claim_warnings", "kind", "opted_out_templates", "plans", "stale_ops")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.plans: list[tuple[PodTemplate, list[GpuContainer], list[str]]] = []
        self.stale_ops: list[dict[str, Any]] = []
        """Ops that take back what an injection under another config recorded."""
        self.claim_warnings: tuple[str, ...] = ()
        self.opted_out_templates = 0


def _screen(
    obj: Any, operation: str, namespace: NamespaceFacts, config: CompiledConfig
) -> _Screened | MutationResult:
    """Is this a configured workload being created, and not opted out? The cheapest and most
    decisive questions, asked before any template is read."""
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
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    annotations = metadata.get("annotations")
    if not isinstance(annotations, dict):
        annotations = {}
    if labels.MIRROR_POD in annotations:
        return skipped("mirror pods are managed by the kubelet")
    if annotations.get(labels.INJECT) == labels.INJECT_DISABLED or _opted_out(metadata.get("labels")):
        return skipped(f"object opted out ({labels.INJECT}={labels.INJECT_DISABLED})")
    return kind, workload, annotations


def _plan(
    obj: dict[str, Any],
    screened: _Screened,
    namespace: NamespaceFacts,
    config: CompiledConfig,
    claims: ClaimFacts,
) -> _Plan | MutationResult:
    """The object's pod templates that ask for a configured GPU, each with its GPU containers and
    GPU types, or the denial of a request the webhook will not serve."""
    kind, workload, annotations = screened
    plan = _Plan(kind)
    try:
        templates = find_templates(obj, workload.template_paths, MAX_TEMPLATES)
    except TemplateKeyError as bad_key:
        return denied(str(bad_key))
    if len(templates) > MAX_TEMPLATES:
        return denied(f"{kind} holds more than {MAX_TEMPLATES} pod templates, the most the webhook handles")
    gpu_container_count = 0
    try:
        for found in templates:
            if not isinstance(found.body.get("spec"), dict):
                continue
            if found.body is obj:  # a Pod: its own metadata, read above
                template_annotations = annotations
            else:
                template_annotations = _string_map(_string_map(found.body, "metadata"), "annotations")
            if found.pointer and _opted_out(template_annotations):
                plan.opted_out_templates += 1
                continue
            # Injected under another config: take back what that injection recorded, then decide
            # on the template as it is without it (see injection_record). Most templates carry no
            # record: one lookup in a map already read, and nothing else, decides that.
            template = found
            if labels.INJECTED_ITEMS in template_annotations:
                template, removal = strip_stale(found, config.digest)
                plan.stale_ops.extend(removal)
            spec = template.body["spec"]
            containers = gpu_containers(
                spec, config, template.where, MAX_GPU_CONTAINERS - gpu_container_count
            )
            if "resourceClaims" in spec and config.device_classes:  # DRA: see .claims
                containers, warned = claim_containers(
                    spec, containers, config, claims, namespace.name, template.where
                )
                plan.claim_warnings += warned
            if containers:
                gpu_container_count += len(containers)
                if gpu_container_count > MAX_GPU_CONTAINERS:
                    # Refused before any injection work: each GPU container costs patch ops.
                    return denied(
                        f"{kind} has more than {MAX_GPU_CONTAINERS} containers asking for GPUs, "
                        "the most the webhook handles"
                    )
                gpu_types = (
                    _gpu_types(template_annotations, annotations)
                    if labels.GPU_TYPE in template_annotations or labels.GPU_TYPE in annotations
                    else []
                )
                plan.plans.append((template, containers, gpu_types))
    except GpuRequestError as bad_request:  # (its own name: mypyc types a name once per function)
        return denied(str(bad_request))
    return plan


def _nothing_to_inject(plan: _Plan) -> MutationResult:
    """No template asks for a GPU: why, and any stale injection taken back."""
    if plan.claim_warnings:
        reason = (
            "resource claims the webhook could not learn; allowed unmodified by policy.claimLookupFailure"
        )
        decision = Decision.MUTATED if plan.stale_ops else Decision.SKIPPED
        return MutationResult(
            decision, plan.stale_ops, [*plan.claim_warnings], reason, allowed_unknown="claim"
        )
    if plan.stale_ops:
        reason = "removed what an earlier config injected; nothing to inject now"
        return MutationResult(Decision.MUTATED, plan.stale_ops, [], reason)
    if plan.opted_out_templates:
        return skipped("every GPU template opted out, or no container requests a configured GPU")
    return skipped("no container requests a configured GPU resource")


def _inject(plan: _Plan, namespace: NamespaceFacts, config: CompiledConfig) -> MutationResult:
    """What the configured profiles add to the planned templates, bounded and checked against
    the namespace's facts and the conflict policy."""
    run = InjectionRun(
        digest=config.digest,
        host_path_block=_host_path_block(namespace),
        # Read only where a profile wants privileged: not worked out (a message formatted per
        # review) for configs where none does.
        privileged_block=_privileged_block(namespace, config) if config.any_privileged else None,
    )
    run.ops += plan.stale_ops  # first: the injection ops below are computed on the stripped templates
    if plan.claim_warnings:
        run.warnings += plan.claim_warnings
    try:
        for template, containers, gpu_types in plan.plans:
            inject_template(template, containers, gpu_types, run)
    except InjectionDenied as exc:
        return denied(str(exc), run.warnings)

    if len(run.ops) > MAX_PATCH_OPS:
        return denied(
            f"injecting into this {plan.kind} takes {len(run.ops)} patch operations; at most "
            f"{MAX_PATCH_OPS} (split the workload, or opt it out)"
        )
    unchecked = bool(run.host_paths_added) and not namespace.known
    if unchecked:
        run.warnings.append(
            f'hostPath volumes injected without checking Pod Security: namespace "{namespace.name}" '
            "could not be read (no cluster access); a namespace enforcing baseline or restricted "
            "will reject this pod"
        )
    warnings = [*run.warnings, *run.conflicts]
    profiles = tuple(run.profiles_used)
    if run.conflicts and config.policy.conflict_policy.value == "deny":
        return denied("conflicts with the user's settings: " + "; ".join(run.conflicts), run.warnings)
    allowed_unknown = "claim" if plan.claim_warnings else ""
    if run.ops:
        reason = f"injected {'+'.join(profiles)}@{config.digest}"
        return MutationResult(
            Decision.MUTATED, run.ops, warnings, reason, profiles, unchecked, allowed_unknown
        )
    return MutationResult(
        Decision.UNCHANGED, [], warnings, "already injected", profiles, False, allowed_unknown
    )
