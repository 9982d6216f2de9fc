"""The webhook's runtime view of a :class:`~ix_gpu.config.webhook_config.WebhookConfig`.

Everything that can be computed once per config — Kubernetes-shaped volume/mount/env dicts,
resource-name → profile matches, workload lookup, the content digest — is computed here, so the
admission hot path does dictionary lookups instead of glob matching and model dumps.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any

from ix_gpu.config.webhook_config import WebhookConfig, Workload
from ix_gpu.config.webhook_profile import EnvMode, Privileged, Profile
from ix_gpu.webhook.core.record_items import item_digest, item_ref

# Resource names are user input; bound the match cache so odd names cannot grow memory forever.
_MATCH_CACHE_LIMIT = 4096
MAX_RESOURCE_NAME_CHARS = 253
"""A resource name is a qualified name: at most 253 characters. Longer keys can match no profile,
and are neither glob-matched nor remembered (4096 remembered 1 MB keys would be 4 GB)."""


@dataclass(frozen=True, slots=True)
class InjectedVolume:
    name: str
    volume: dict[str, Any]
    """The pod-level ``volumes`` entry."""
    mount: dict[str, Any]
    """The container-level ``volumeMounts`` entry."""
    volume_ref: str
    mount_ref: str
    """How ``injected-items`` names the volume (``<name>@<digest>``) and the mount (its digest: a
    mount's name is a volume's), digested here, once per config."""


@dataclass(frozen=True, slots=True)
class InjectedEnv:
    name: str
    value: str
    mode: str
    """An :class:`~ix_gpu.config.webhook_config.EnvMode` value as a plain string: comparing enum
    members costs several times a string comparison, and this is checked per GPU container."""


IF_SET_MODES = frozenset((EnvMode.PREPEND_PATH_IF_SET.value, EnvMode.APPEND_PATH_IF_SET.value))
"""Env modes that merge into a variable the container's spec sets and add none where it sets none."""

LIBRARY_PATH = "LD_LIBRARY_PATH"
_IF_SET_FORM = {
    EnvMode.PREPEND_PATH.value: EnvMode.PREPEND_PATH_IF_SET.value,
    EnvMode.APPEND_PATH.value: EnvMode.APPEND_PATH_IF_SET.value,
}


def env_in_claims(env: tuple[InjectedEnv, ...]) -> tuple[InjectedEnv, ...]:
    """``env`` as a container served only through DRA claims gets it: ``LD_LIBRARY_PATH`` of a path
    mode in its if-set form. A claim's CDI spec puts the driver in the container's linker cache, so
    the variable is not what finds it there, and a container entry would replace the image's own
    ``ENV LD_LIBRARY_PATH`` (``policy.keepImageLibraryPathInClaims``). The same tuple when nothing
    changes, so that callers can tell by identity."""
    if not any(e.name == LIBRARY_PATH and e.mode in _IF_SET_FORM for e in env):
        return env
    return tuple(
        InjectedEnv(e.name, e.value, _IF_SET_FORM[e.mode])
        if e.name == LIBRARY_PATH and e.mode in _IF_SET_FORM
        else e
        for e in env
    )


class ContainerFast:
    """What one profile gives a container that holds none of its mounts or env yet: the common
    case, done in one pass (see ``container_injection.merge_container``). Only for profiles that never
    set ``privileged`` and whose mount paths and env names are each distinct, so that nothing
    added can collide with something else added."""

    __slots__ = ("env", "env_names", "mine", "mount_paths", "mounts", "volume_names")

    def __init__(self, volumes: tuple[InjectedVolume, ...], env: tuple[InjectedEnv, ...]) -> None:
        self.volume_names = frozenset(v.name for v in volumes)
        self.mount_paths = frozenset(v.mount["mountPath"] for v in volumes)
        self.mounts = tuple(v.mount for v in volumes)
        # A variable of an if-set mode is never added: it only makes a container that sets it
        # take the general merge (its name is looked for), which merges into the user's value.
        added = tuple(e for e in env if e.mode not in IF_SET_MODES)
        self.env_names = frozenset(e.name for e in env)
        self.env = tuple((e.name, e.value) for e in added)
        self.mine = {
            (mounts_listed, env_listed): _mine(volumes, added, mounts_listed, env_listed)
            for mounts_listed in (False, True)
            for env_listed in (False, True)
        }
        """The container's part of the injection record, by whether its ``volumeMounts`` and
        ``env`` were lists already (shared, never modified: it only goes into the record's JSON)."""

    @staticmethod
    def of(
        volumes: tuple[InjectedVolume, ...], env: tuple[InjectedEnv, ...], privileged: str
    ) -> ContainerFast | None:
        paths = [v.mount["mountPath"] for v in volumes]
        names = [e.name for e in env]
        if (
            privileged != Privileged.NEVER.value
            or len(set(paths)) != len(paths)
            or len(set(names)) != len(names)
        ):
            return None
        return ContainerFast(volumes, env)


def _mine(
    volumes: tuple[InjectedVolume, ...], env: tuple[InjectedEnv, ...], mounts_listed: bool, env_listed: bool
) -> dict[str, Any]:
    """The record of a container that got every mount and env entry appended, built in the order
    the general merge builds it."""
    mine: dict[str, Any] = {}
    if volumes:
        mine["m"] = [v.mount_ref for v in volumes]
        if not mounts_listed:
            mine["new"] = ["m"]
    if env:
        if not env_listed:
            mine.setdefault("new", []).append("e")
        mine["e"] = [[e.name, e.value] for e in env]
    return mine


@dataclass(frozen=True, slots=True)
class CompiledProfile:
    name: str
    index: int
    """Position in the config: profiles apply in config order."""
    privileged: str
    """``never`` | ``allowed`` | ``required`` (plain string, as for env modes)."""
    volumes: tuple[InjectedVolume, ...]
    env: tuple[InjectedEnv, ...]
    node_selector: tuple[tuple[str, str], ...]
    node_requirements: tuple[dict[str, Any], ...]
    tolerations: tuple[dict[str, Any], ...]
    runtime_class_name: str | None
    source: Profile
    requirement_refs: tuple[str, ...]
    toleration_refs: tuple[str, ...]
    """How ``injected-items`` names each of ``node_requirements`` and ``tolerations``."""
    fast: ContainerFast | None
    """The one-pass merge for a container of this profile alone, where the profile allows it."""
    claim_env: tuple[InjectedEnv, ...]
    """``env`` for a container that gets its GPUs only through DRA claims (:func:`env_in_claims` under
    ``policy.keepImageLibraryPathInClaims``; else ``env`` itself)."""
    claim_fast: ContainerFast | None
    """``fast`` for such a container (``fast`` itself where ``claim_env`` is ``env``)."""


def _compile_profile(index: int, profile: Profile, fast_path: bool, keep_in_claims: bool) -> CompiledProfile:
    volumes = []
    for spec in profile.all_volumes():
        host_path: dict[str, Any] = {"path": spec.host_path}
        if spec.type is not None and spec.type.value:
            host_path["type"] = spec.type.value
        mount: dict[str, Any] = {"name": spec.name, "mountPath": spec.mount_path}
        if spec.read_only:
            mount["readOnly"] = True
        volume = {"name": spec.name, "hostPath": host_path}
        volumes.append(
            InjectedVolume(spec.name, volume, mount, item_ref(spec.name, volume), str(item_digest(mount)))
        )
    requirements = tuple(r.to_k8s() for r in profile.affinity.required_node_expressions)
    tolerations = tuple(t.to_k8s() for t in profile.tolerations)
    env = tuple(InjectedEnv(e.name, e.value, e.mode.value) for e in profile.env)
    fast = ContainerFast.of(tuple(volumes), env, profile.privileged.value) if fast_path else None
    in_claims = env_in_claims(env) if keep_in_claims else env
    claim_fast = fast
    if in_claims is not env and fast_path:
        claim_fast = ContainerFast.of(tuple(volumes), in_claims, profile.privileged.value)
    return CompiledProfile(
        name=profile.name,
        index=index,
        privileged=profile.privileged.value,
        volumes=tuple(volumes),
        env=env,
        node_selector=tuple(profile.node_selector.items()),
        node_requirements=requirements,
        tolerations=tolerations,
        runtime_class_name=profile.runtime_class_name,
        source=profile,
        requirement_refs=tuple(item_ref(r.get("key"), r) for r in requirements),
        toleration_refs=tuple(item_ref(t.get("key", ""), t) for t in tolerations),
        fast=fast,
        claim_env=in_claims,
        claim_fast=claim_fast,
    )


class CompiledConfig:
    """Read-only after construction except for one memo: which profiles match a resource name.

    The memo (:meth:`profiles_for`) is bounded and only ever gains entries whose value does not
    depend on when they were added, so one instance is safe to share between concurrent requests.
    """

    def __init__(self, config: WebhookConfig, *, fast_path: bool = True) -> None:
        """``fast_path=False`` leaves every profile without its :class:`ContainerFast`, so each
        container takes the general merge: the tests' reference for the fast path's answers."""
        self.digest = config.digest()
        keep = config.policy.keep_image_library_path_in_claims
        self.profiles = tuple(_compile_profile(i, p, fast_path, keep) for i, p in enumerate(config.profiles))
        self.policy = config.policy
        self.any_privileged = any(p.privileged != Privileged.NEVER.value for p in self.profiles)
        """Some profile sets or may set ``privileged`` (else no review needs to know whether its
        namespace allows it)."""
        self._excluded = NamePatterns(config.policy.excluded_namespaces)
        self._privileged = NamePatterns(config.policy.privileged_namespaces)
        self._workloads: dict[tuple[str, str], Workload] = {}
        self._workload_globs: list[Workload] = []
        for workload in config.workloads:
            if any(ch in workload.api_version + workload.kind for ch in "*?["):
                self._workload_globs.append(workload)
            else:
                self._workloads[(workload.api_version, workload.kind)] = workload
        self._matches: dict[str, tuple[CompiledProfile, ...]] = {}
        classes: dict[str, list[CompiledProfile]] = {}
        for compiled in self.profiles:
            for device_class in compiled.source.device_classes:
                classes.setdefault(device_class, []).append(compiled)
        self.device_classes: dict[str, tuple[CompiledProfile, ...]] = {
            k: tuple(v) for k, v in classes.items()
        }
        """DRA DeviceClass name → the profiles that map it, in config order (empty: claims are
        never looked up)."""
        patterns = [pattern for p in config.profiles for pattern in p.resources]
        self.exact_resources: frozenset[str] | None = (
            None if any(ch in pattern for pattern in patterns for ch in "*?[") else frozenset(patterns)
        )
        """All resource names any profile matches, when no profile uses a glob (else None): lets
        the hot path dismiss a container with one C-level set operation."""

    def workload(self, api_version: str, kind: str) -> Workload | None:
        found = self._workloads.get((api_version, kind))
        if found is not None:
            return found
        for workload in self._workload_globs:
            if fnmatch.fnmatchcase(api_version, workload.api_version) and fnmatch.fnmatchcase(
                kind, workload.kind
            ):
                return workload
        return None

    def profiles_for(self, resource: str) -> tuple[CompiledProfile, ...]:
        """Profiles whose resource patterns match ``resource`` (empty for non-GPU resources)."""
        found = self._matches.get(resource)
        if found is None:
            if len(resource) > MAX_RESOURCE_NAME_CHARS:
                return ()
            found = tuple(p for p in self.profiles if p.source.matches(resource))
            if len(self._matches) < _MATCH_CACHE_LIMIT:
                self._matches[resource] = found
        return found

    def profiles_for_class(self, device_class: str) -> tuple[CompiledProfile, ...]:
        """Profiles whose ``deviceClasses`` name ``device_class`` (exact names: no globs)."""
        return self.device_classes.get(device_class, ())

    def namespace_excluded(self, namespace: str) -> bool:
        return self._excluded.matches(namespace)

    def namespace_may_be_privileged(self, namespace: str) -> bool:
        return self._privileged.matches(namespace)


class NamePatterns:
    """Exact names and globs, matched with one set lookup and at most one regex call."""

    def __init__(self, patterns: tuple[str, ...]) -> None:
        globs = [p for p in patterns if any(ch in p for ch in "*?[")]
        self._exact = frozenset(p for p in patterns if p not in globs)
        self._regex = re.compile("|".join(fnmatch.translate(g) for g in globs)) if globs else None
        self._seen: dict[str, bool] = {}
        """Glob results by name: a review's namespace is asked about twice (the handler, then the
        core), and a cluster's namespaces are few. Bounded like the resource memo."""

    def matches(self, name: str) -> bool:
        if name in self._exact:
            return True
        if self._regex is None:
            return False
        found = self._seen.get(name)
        if found is None:
            found = self._regex.match(name) is not None
            if len(self._seen) < _MATCH_CACHE_LIMIT and len(name) <= MAX_NAMESPACE_CHARS:
                self._seen[name] = found
        return found


MAX_NAMESPACE_CHARS = 63
"""A namespace name is a DNS label; a longer string is matched but not remembered."""
