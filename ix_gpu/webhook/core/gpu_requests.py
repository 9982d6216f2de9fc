"""Which containers of a pod spec ask for a configured GPU resource, and how many.

Both ``containers`` and ``initContainers`` count: an init container that warms a model on the GPU
needs the driver as much as the main one. A quantity that cannot be a GPU count is an error that
names the container and resource — for a TFJob the apiserver would not catch it until the
operator creates the Pods, far away from the user who wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ix_gpu.devicemodel.quantities import MAX_GPU_COUNT, QuantityError, gpu_count
from ix_gpu.webhook.core.compiled_config import CompiledConfig, CompiledProfile

CONTAINER_LISTS = ("initContainers", "containers")


class GpuRequestError(ValueError):
    """An invalid GPU request; the message is shown to the user as the denial reason."""


@dataclass(slots=True)  # not frozen: frozen __init__ costs ~3x on the hot path
class GpuContainer:
    list_name: str
    index: int
    name: str
    body: dict[str, Any]
    profiles: tuple[CompiledProfile, ...]
    """Matching profiles, in config order."""
    claims_only: bool = False
    """Its GPUs come only through DRA claims: no configured resource in its limits. Such a
    container gets each profile's ``claim_env``. One that also asks in its limits may be served
    by a device plugin that sets no linker cache (``envvar``), so it gets ``env``, as do those
    whose limits DRA serves through an extended resource: the webhook cannot tell by whom."""

    def __init__(
        self,
        list_name: str,
        index: int,
        name: str,
        body: dict[str, Any],
        profiles: tuple[CompiledProfile, ...],
        claims_only: bool = False,
    ) -> None:
        # Written out, not generated: mypyc compiles this one (see docs/design.md).
        self.list_name = list_name
        self.index = index
        self.name = name
        self.body = body
        self.profiles = profiles
        self.claims_only = claims_only


MAX_NAME_CHARS = 64
"""Names are echoed in denial messages; Kubernetes names are at most 63 characters anyway."""


def describe(name: str, where: str) -> str:
    """How a denial or warning names a container: `container "main" in <where>`."""
    if len(name) > MAX_NAME_CHARS:
        name = name[: MAX_NAME_CHARS - 1] + "…"
    return f'container "{name}"' + (f" in {where}" if where else "")


_NO_RESOURCES: dict[str, Any] = {}


def _count(raw: Any, name: str, where: str, resource: str, field: str) -> int:
    try:
        return gpu_count(raw)
    except QuantityError as exc:
        raise GpuRequestError(
            f"{describe(name, where)}: {field} of {resource}: {exc}; GPU counts must be whole numbers >= 0"
        ) from None


def gpu_containers(
    spec: dict[str, Any], config: CompiledConfig, where: str, at_most: int | None = None
) -> list[GpuContainer]:
    """The containers of ``spec`` that request at least one GPU of a configured resource. With
    ``at_most``, the scan stops once it has found one more than that: the caller refuses such an
    object anyway, and a 3 MB pod holds ten thousand containers (100 ms of checks)."""
    found: list[GpuContainer] = []
    profiles_for = config.profiles_for
    exact = config.exact_resources
    for list_name in CONTAINER_LISTS:
        containers = spec.get(list_name)
        if not isinstance(containers, list):
            continue
        for index, container in enumerate(containers):
            # ``type(...) is dict``: objects come from a JSON parser, and this loop runs for every
            # container of every admitted pod, GPU or not.
            resources = container.get("resources") if type(container) is dict else None
            if type(resources) is not dict:
                continue
            limits = resources.get("limits")
            if type(limits) is not dict:
                limits = _NO_RESOURCES
            requests = resources.get("requests")
            if type(requests) is not dict:
                requests = _NO_RESOURCES
            if exact is not None and exact.isdisjoint(limits) and exact.isdisjoint(requests):
                continue
            name = container.get("name")
            if not isinstance(name, str) or not name:
                name = f"#{index}"
            # The profiles of the first matching resource, as the config's memo holds them (in
            # config order); merged into a map by index only when a second resource matches.
            first: tuple[CompiledProfile, ...] = ()
            merged: dict[int, CompiledProfile] | None = None
            for resource in limits:
                if exact is not None and resource not in exact:
                    continue
                matched = profiles_for(resource) if type(resource) is str else ()
                if not matched:
                    continue
                limit = limits[resource]
                # Fast paths for the usual manifest (a plain integer limit, or digits as a string,
                # as gpu_count reads them; no request); anything else gets the full checks and
                # their messages.
                if type(limit) is str and len(limit) <= 18 and limit.isdigit() and limit.isascii():
                    if resource in requests:
                        limit = _gpus_requested(limits, requests, resource, name, where)
                    else:
                        limit = int(limit)
                elif type(limit) is not int or not 0 <= limit <= MAX_GPU_COUNT or resource in requests:
                    limit = _gpus_requested(limits, requests, resource, name, where)
                if limit > 0:
                    if not first:
                        first = matched
                        continue
                    if merged is None:
                        merged = {profile.index: profile for profile in first}
                    for profile in matched:
                        merged[profile.index] = profile
            if requests:
                for resource in requests:
                    if resource in limits or (exact is not None and resource not in exact):
                        continue
                    if type(resource) is str and profiles_for(resource):
                        _gpus_requested(limits, requests, resource, name, where)  # raises: no limit
            if first:
                ordered = first if merged is None else tuple(merged[i] for i in sorted(merged))
                found.append(GpuContainer(list_name, index, name, container, ordered))
                if at_most is not None and len(found) > at_most:
                    return found
    return found


def _gpus_requested(
    limits: dict[str, Any], requests: dict[str, Any], resource: str, name: str, where: str
) -> int:
    # Extended resources cannot be overcommitted: a request needs an equal limit.
    if resource not in limits:
        _count(requests[resource], name, where, resource, "request")
        raise GpuRequestError(
            f"{describe(name, where)}: {resource} is requested but has no limit; "
            "set resources.limits (requests may be omitted and then equal the limit)"
        )
    limit = _count(limits[resource], name, where, resource, "limit")
    if resource in requests:
        request = _count(requests[resource], name, where, resource, "request")
        if request != limit:
            raise GpuRequestError(
                f"{describe(name, where)}: {resource} request ({request}) must equal its limit ({limit})"
            )
    return limit
