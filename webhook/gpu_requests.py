"""Which containers of a pod spec ask for a configured GPU resource, and how many.

Both ``containers`` and ``initContainers`` count: an init container that warms a model on the GPU
needs the driver as much as the main one. A quantity that cannot be a GPU count is an error that
names the container and resource — for a TFJob the apiserver would not catch it until the
operator creates the Pods, far away from the user who wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from devicemodel.quantities import QuantityError, gpu_count
from webhook.compiled_config import CompiledConfig, CompiledProfile

CONTAINER_LISTS = ("initContainers", "containers")


class GpuRequestError(ValueError):
    """An invalid GPU request; the message is shown to the user as the denial reason."""


@dataclass(frozen=True, slots=True)
class GpuContainer:
    list_name: str
    index: int
    name: str
    body: dict[str, Any]
    profiles: tuple[CompiledProfile, ...]
    """Matching profiles, in config order."""


def _describe(name: str, where: str) -> str:
    return f'container "{name}"' + (f" in {where}" if where else "")


def _resource_map(resources: Any, key: str) -> dict[str, Any]:
    value = resources.get(key) if isinstance(resources, dict) else None
    return value if isinstance(value, dict) else {}


def _count(raw: Any, name: str, where: str, resource: str, field: str) -> int:
    try:
        return gpu_count(raw)
    except QuantityError as exc:
        raise GpuRequestError(
            f"{_describe(name, where)}: {field} of {resource}: {exc}; GPU counts must be whole numbers >= 0"
        ) from None


def gpu_containers(spec: dict[str, Any], config: CompiledConfig, where: str) -> list[GpuContainer]:
    """The containers of ``spec`` that request at least one GPU of a configured resource."""
    found: list[GpuContainer] = []
    for list_name in CONTAINER_LISTS:
        containers = spec.get(list_name)
        if not isinstance(containers, list):
            continue
        for index, container in enumerate(containers):
            if not isinstance(container, dict):
                continue
            resources = container.get("resources")
            limits = _resource_map(resources, "limits")
            requests = _resource_map(resources, "requests")
            if not limits and not requests:
                continue
            name = str(container.get("name", f"#{index}"))
            profiles: dict[int, CompiledProfile] = {}
            for resource in (*limits, *(r for r in requests if r not in limits)):
                if not isinstance(resource, str):
                    continue
                matched = config.profiles_for(resource)
                if not matched:
                    continue
                if _gpus_requested(limits, requests, resource, name, where) > 0:
                    for profile in matched:
                        profiles[profile.index] = profile
            if profiles:
                ordered = tuple(profiles[i] for i in sorted(profiles))
                found.append(GpuContainer(list_name, index, name, container, ordered))
    return found


def _gpus_requested(
    limits: dict[str, Any], requests: dict[str, Any], resource: str, name: str, where: str
) -> int:
    # Extended resources cannot be overcommitted: a request needs an equal limit.
    if resource not in limits:
        _count(requests[resource], name, where, resource, "request")
        raise GpuRequestError(
            f"{_describe(name, where)}: {resource} is requested but has no limit; "
            "set resources.limits (requests may be omitted and then equal the limit)"
        )
    limit = _count(limits[resource], name, where, resource, "limit")
    if resource in requests:
        request = _count(requests[resource], name, where, resource, "request")
        if request != limit:
            raise GpuRequestError(
                f"{_describe(name, where)}: {resource} request ({request}) must equal its limit ({limit})"
            )
    return limit
