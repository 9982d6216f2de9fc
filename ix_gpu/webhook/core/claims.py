"""Which containers get a GPU through DRA: ``spec.resourceClaims`` → claim facts → DeviceClass → profile.

A DRA pod names no GPU resource. Its containers reference entries of ``spec.resourceClaims``
(``resources.claims``); each entry names a ResourceClaim or a ResourceClaimTemplate in the pod's
namespace; their device requests name DeviceClasses; the config maps DeviceClass names to profiles
(``deviceClasses``). The core cannot read the claims: what they request comes in as *claim facts*,
like namespace facts (the service's watched cache; ``ix-gpu mutate --claim-template`` files).

A claim the facts do not know (the watch has not synced, the object is not there yet) is
``policy.claimLookupFailure``'s to decide: deny the object, or inject nothing for that claim and
say so in a warning. Facts are only asked for when a profile maps a DeviceClass and the template
has ``resourceClaims``: every other pod pays one dict lookup for this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from ix_gpu.config.webhook_config import NamespaceLookupFailure
from ix_gpu.webhook.core.compiled_config import CompiledConfig, CompiledProfile
from ix_gpu.webhook.core.gpu_requests import CONTAINER_LISTS, GpuContainer, GpuRequestError, describe

RESOURCE_CLAIM = "ResourceClaim"
RESOURCE_CLAIM_TEMPLATE = "ResourceClaimTemplate"
_POD_FIELDS = {"resourceClaimName": RESOURCE_CLAIM, "resourceClaimTemplateName": RESOURCE_CLAIM_TEMPLATE}

DeviceRequests = tuple[tuple[str, str], ...]
"""(request, deviceClassName) per device request of a claim; a ``firstAvailable`` alternative is
named ``request/subrequest``, as a container's ``resources.claims[].request`` names it."""

ClaimKey = tuple[str, str | None, str]
"""(kind, namespace, name); namespace None: any namespace (a manifest that names none)."""


class ClaimFacts(Protocol):
    def device_requests(self, kind: str, namespace: str, name: str) -> DeviceRequests | None:
        """What the claim or claim template requests; None when it is not known. Called on the
        event loop and in forked children: no I/O, no locks."""


def device_requests(obj: Any) -> DeviceRequests:
    """The device requests of a ResourceClaim or ResourceClaimTemplate (plain dicts, resource.k8s.io
    v1's ``exactly`` or v1beta1's class on the request); empty for anything else."""
    kind = obj.get("kind") if isinstance(obj, dict) else None
    spec = obj.get("spec") if kind in (RESOURCE_CLAIM, RESOURCE_CLAIM_TEMPLATE) else None
    if kind == RESOURCE_CLAIM_TEMPLATE:
        spec = spec.get("spec") if isinstance(spec, dict) else None
    devices = spec.get("devices") if isinstance(spec, dict) else None
    requests = devices.get("requests") if isinstance(devices, dict) else None
    found: list[tuple[str, str]] = []
    for request in requests if isinstance(requests, list) else ():
        name = request.get("name") if isinstance(request, dict) else None
        if not isinstance(name, str):
            continue
        exactly = request.get("exactly")
        device_class = (exactly if isinstance(exactly, dict) else request).get("deviceClassName")
        if isinstance(device_class, str) and device_class:
            found.append((name, device_class))
        alternatives = request.get("firstAvailable")
        for sub in alternatives if isinstance(alternatives, list) else ():
            sub_name = sub.get("name") if isinstance(sub, dict) else None
            sub_class = sub.get("deviceClassName") if isinstance(sub, dict) else None
            if isinstance(sub_name, str) and isinstance(sub_class, str) and sub_class:
                found.append((f"{name}/{sub_name}", sub_class))
    return tuple(found)


def claim_key(obj: Any) -> ClaimKey | None:
    """(kind, namespace or None, name) of a ResourceClaim or ResourceClaimTemplate, else None."""
    kind = obj.get("kind") if isinstance(obj, dict) else None
    metadata = obj.get("metadata") if kind in (RESOURCE_CLAIM, RESOURCE_CLAIM_TEMPLATE) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(kind, str) or not isinstance(name, str) or not name:
        return None
    namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    return kind, namespace if isinstance(namespace, str) and namespace else None, name


class KnownClaims:
    """Claim facts from manifests (``ix-gpu mutate``, tests); everything else is unknown."""

    def __init__(self, requests: Mapping[ClaimKey, DeviceRequests]) -> None:
        self._requests = dict(requests)

    @classmethod
    def of(cls, objects: Iterable[Any]) -> KnownClaims:
        """From ResourceClaim and ResourceClaimTemplate objects; others are left out."""
        return cls({key: device_requests(obj) for obj in objects if (key := claim_key(obj)) is not None})

    def device_requests(self, kind: str, namespace: str, name: str) -> DeviceRequests | None:
        found = self._requests.get((kind, namespace, name))
        return found if found is not None else self._requests.get((kind, None, name))


UNKNOWN_CLAIMS = KnownClaims({})
"""No facts: every claim is unknown (a core called without any)."""


def _pod_claims(spec: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """``spec.resourceClaims`` as pod claim name → (kind, object name)."""
    out: dict[str, tuple[str, str]] = {}
    entries = spec.get("resourceClaims")
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            continue
        for field, kind in _POD_FIELDS.items():
            target = entry.get(field)
            if isinstance(target, str) and target:
                out[entry["name"]] = (kind, target)
                break
    return out


def _referenced(requests: DeviceRequests, request: Any) -> list[str]:
    """Device classes a container gets from a claim: all of its requests, or the one it names
    (``req`` takes each of its alternatives, ``req/sub`` just that one)."""
    if not isinstance(request, str) or not request:
        return [device_class for _, device_class in requests]
    prefix = request + "/"
    return [cls for name, cls in requests if name == request or name.startswith(prefix)]


def claim_containers(
    spec: dict[str, Any],
    found: list[GpuContainer],
    config: CompiledConfig,
    facts: ClaimFacts,
    namespace: str,
    where: str,
) -> tuple[list[GpuContainer], tuple[str, ...]]:
    """``found`` (the containers asking through limits) plus those whose claims request a mapped
    DeviceClass, in container order, and the warnings for claims that could not be learned.
    Raises :class:`GpuRequestError` for such a claim under ``claimLookupFailure: deny``."""
    pod_claims = _pod_claims(spec)
    if not pod_claims:
        return found, ()
    by_position = {(c.list_name, c.index): c for c in found}
    warnings: list[str] = []
    deny = config.policy.claim_lookup_failure is NamespaceLookupFailure.DENY
    for list_name in CONTAINER_LISTS:
        containers = spec.get(list_name)
        for index, container in enumerate(containers if isinstance(containers, list) else ()):
            resources = container.get("resources") if isinstance(container, dict) else None
            refs = resources.get("claims") if isinstance(resources, dict) else None
            if not isinstance(refs, list) or not refs:
                continue
            name = container.get("name")
            if not isinstance(name, str) or not name:
                name = f"#{index}"
            profiles: dict[int, CompiledProfile] = {}
            for ref in refs:
                ref_name = ref.get("name") if isinstance(ref, dict) else None
                target = pod_claims.get(ref_name) if isinstance(ref_name, str) else None
                if target is None:
                    continue  # the apiserver refuses a reference to an undeclared claim
                kind, target_name = target
                requests = facts.device_requests(kind, namespace, target_name)
                if requests is None:
                    unknown = (
                        f'the device classes of {kind} "{target_name}" in namespace "{namespace}" are not '
                        "known to the webhook"
                    )
                    if deny:
                        raise GpuRequestError(
                            f"{describe(name, where)}: {unknown}; policy.claimLookupFailure is deny"
                        )
                    warnings.append(
                        f"ix-gpu did not inject GPU settings for {describe(name, where)}: {unknown} "
                        "(policy.claimLookupFailure)"
                    )
                    continue
                for device_class in _referenced(requests, ref.get("request")):
                    for profile in config.profiles_for_class(device_class):
                        profiles[profile.index] = profile
            if not profiles:
                continue
            existing = by_position.get((list_name, index))
            if existing is not None:
                profiles.update((p.index, p) for p in existing.profiles)
            ordered = tuple(profiles[i] for i in sorted(profiles))
            # Only through claims when its limits asked for no GPU (``found`` holds those that did).
            by_position[(list_name, index)] = GpuContainer(
                list_name, index, name, container, ordered, existing is None
            )
    order = {list_name: rank for rank, list_name in enumerate(CONTAINER_LISTS)}
    merged = sorted(by_position.values(), key=lambda c: (order[c.list_name], c.index))
    return merged, tuple(warnings)
