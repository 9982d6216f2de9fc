"""Merging profiles into one GPU container: its volume mounts, env and privileges.

:func:`merge_container` takes the one-pass path (:class:`ContainerFast`) when the container holds
none of its only profile's mounts or env yet, the common case of a first admission, and the general
merge otherwise; ``tests/webhook/test_fast_merge.py`` holds the two to the same result. A conflict
(the user's value under the same key) is recorded and kept, never overwritten.

A container served only through DRA claims takes its profiles' ``claim_env`` (and ``claim_fast``)
instead of ``env``: there ``LD_LIBRARY_PATH`` keeps the image's value (see
``CompiledProfile.claim_env``).
"""

from __future__ import annotations

from typing import Any

from ix_gpu.config.text import shown
from ix_gpu.config.webhook_profile import EnvMode, Privileged
from ix_gpu.webhook.core import patch_ops
from ix_gpu.webhook.core.compiled_config import IF_SET_MODES, ContainerFast, InjectedEnv
from ix_gpu.webhook.core.gpu_requests import GpuContainer
from ix_gpu.webhook.core.injection_record import TemplateRecord
from ix_gpu.webhook.core.injection_run import InjectionDenied, InjectionRun, last_by, last_index, same


def merge_container(
    container: GpuContainer,
    spec_ptr: str,
    where: str,
    mountable: set[str],
    run: InjectionRun,
    record: TemplateRecord,
) -> None:
    body = container.body
    ptr = f"{spec_ptr}/{container.list_name}/{container.index}"
    profiles = container.profiles
    if len(profiles) == 1:
        fast = profiles[0].claim_fast if container.claims_only else profiles[0].fast
        if fast is not None and fast.volume_names <= mountable:
            given = _merge_fast(fast, body, ptr, run)
            if given is not None:
                if given:
                    record.containers.append((container.list_name, container.name, given))
                return

    mine: dict[str, Any] = {}
    if mountable:
        mounts = body.get("volumeMounts")
        new_mounts: list[dict[str, Any]] = []
        refs: list[str] = []
        for profile in container.profiles:
            for volume in profile.volumes:
                if volume.name not in mountable:
                    continue
                path = volume.mount["mountPath"]
                current = last_by(mounts, "mountPath", path)
                if current is None and new_mounts:
                    current = last_by(new_mounts, "mountPath", path)
                if current is None:
                    new_mounts.append(volume.mount)
                    refs.append(volume.mount_ref)
                elif not same(current, volume.mount):
                    run.conflicts.append(
                        f"{_label(where, container)}.volumeMounts[mountPath={path}]: already mounts "
                        f"{shown(current.get('name'))} there; kept it"
                    )
        if new_mounts:
            mine["m"] = refs
            if not isinstance(mounts, list):
                mine["new"] = ["m"]
            patch_ops.add_to_list(run.ops, ptr + "/volumeMounts", mounts, new_mounts)

    _merge_env(body, ptr, where, container, run, mine)
    _merge_privileged(body, ptr, where, container, run, mine)
    if mine:
        record.containers.append((container.list_name, container.name, mine))


def _merge_fast(
    fast: ContainerFast, body: dict[str, Any], ptr: str, run: InjectionRun
) -> dict[str, Any] | None:
    """The merge of one profile into a container that has none of its mounts (by path) and none
    of its env (by name): every item appended, in the order and form of the general merge; returns
    the container's part of the record. None, having done nothing, when the container holds any
    of them (or entries that are not maps): the general merge then decides, conflicts and all."""
    mounts = body.get("volumeMounts")
    env = body.get("env")
    mounts_listed = isinstance(mounts, list)
    env_listed = isinstance(env, list)
    try:
        if isinstance(mounts, list) and fast.mount_paths:
            paths = fast.mount_paths
            for entry in mounts:
                if entry.get("mountPath") in paths:
                    return None
        if isinstance(env, list) and fast.env_names:
            names = fast.env_names
            for entry in env:
                if entry.get("name") in names:
                    return None
    except (AttributeError, TypeError):  # a non-map entry, or an unhashable name
        return None
    ops = run.ops
    if fast.mounts:
        if mounts_listed:
            path = ptr + "/volumeMounts/-"
            for mount in fast.mounts:
                ops.append({"op": "add", "path": path, "value": mount})
        else:
            ops.append({"op": "add", "path": ptr + "/volumeMounts", "value": list(fast.mounts)})
    if fast.env:
        # Fresh maps: a patch applied in place puts them into the object, which may change later.
        if env_listed:
            path = ptr + "/env/-"
            for name, value in fast.env:
                ops.append({"op": "add", "path": path, "value": {"name": name, "value": value}})
        else:
            ops.append(
                {"op": "add", "path": ptr + "/env", "value": [{"name": n, "value": v} for n, v in fast.env]}
            )
    return fast.mine[mounts_listed, env_listed]


def _label(where: str, container: GpuContainer) -> str:
    """How a conflict or warning names the container (built only when one is written)."""
    return f"{where}{container.list_name}[name={container.name}]"


_OVERRIDE = EnvMode.OVERRIDE.value
_SET_IF_ABSENT = EnvMode.SET_IF_ABSENT.value
_PREPEND = frozenset((EnvMode.PREPEND_PATH.value, EnvMode.PREPEND_PATH_IF_SET.value))
_IF_SET = IF_SET_MODES
_NEVER = Privileged.NEVER.value
_REQUIRED = Privileged.REQUIRED.value


def _path_merge(current: str, ours: str, mode: str) -> str:
    parts = [p for p in current.split(":") if p] if current else []
    missing = [p for p in ours.split(":") if p and p not in parts]
    if not missing:
        return current
    return ":".join(missing + parts) if mode in _PREPEND else ":".join(parts + missing)


def _merged_value(current: str, var: InjectedEnv) -> str:
    if var.mode == _OVERRIDE:
        return var.value
    if var.mode == _SET_IF_ABSENT:
        return current
    return _path_merge(current, var.value, var.mode)


def _merge_env(
    body: dict[str, Any],
    ptr: str,
    where: str,
    container: GpuContainer,
    run: InjectionRun,
    mine: dict[str, Any],
) -> None:
    env = body.get("env")
    entries: list[Any] = env if isinstance(env, list) else []
    updated: dict[int, str] = {}
    appended: list[dict[str, Any]] = []
    appended_at: dict[str, int] = {}
    claims_only = container.claims_only
    for profile in container.profiles:
        for var in profile.claim_env if claims_only else profile.env:
            if var.name in appended_at:
                item = appended[appended_at[var.name]]
                item["value"] = _merged_value(item["value"], var)
                continue
            i = last_index(entries, "name", var.name)
            if i < 0 and var.mode in _IF_SET:
                continue  # the image's value, if any, stands: a container entry would replace it
            if i < 0:
                appended_at[var.name] = len(appended)
                appended.append({"name": var.name, "value": var.value})
                continue
            entry = entries[i]
            if "valueFrom" in entry:
                label = _label(where, container)
                run.conflicts.append(f"{label}.env[name={var.name}]: set from valueFrom by the user; kept it")
                continue
            raw = updated.get(i, entry.get("value", ""))
            current = raw if isinstance(raw, str) else ""
            merged = _merged_value(current, var)
            if var.mode == _SET_IF_ABSENT and current != var.value:
                label = _label(where, container)
                run.conflicts.append(
                    f"{label}.env[name={var.name}]: the user's value {shown(current)} kept "
                    f"(profile {profile.name} would set {var.value!r})"
                )
            elif var.mode == _OVERRIDE and current != var.value and i not in updated:
                # A warning, not a conflict: override is the operator's "ours wins", which
                # conflictPolicy deny must not turn into a denial; the user still hears of it.
                label = _label(where, container)
                run.warnings.append(
                    f"{label}.env[name={var.name}]: the user's value {shown(current)} replaced "
                    f"with {var.value!r} (profile {profile.name}, mode override)"
                )
            if merged != current:
                updated[i] = merged
    written: list[list[Any]] = []
    for i, value in updated.items():
        entry = entries[i]
        if "value" in entry:
            run.ops.append(patch_ops.replace(f"{ptr}/env/{i}/value", value))
            if isinstance(entry["value"], str):  # else nothing to restore: not recorded
                written.append([entry["name"], value, entry["value"]])
        else:
            run.ops.append(patch_ops.add(f"{ptr}/env/{i}/value", value))
            written.append([entry["name"], value, None])
    if appended:
        for item in appended:
            written.append([item["name"], item["value"]])
        if not isinstance(env, list):
            mine.setdefault("new", []).append("e")
        patch_ops.add_to_list(run.ops, ptr + "/env", env, appended)
    if written:
        mine["e"] = written


def _merge_privileged(
    body: dict[str, Any],
    ptr: str,
    where: str,
    container: GpuContainer,
    run: InjectionRun,
    mine: dict[str, Any],
) -> None:
    profiles = container.profiles
    for profile in profiles:
        if profile.privileged != _NEVER:
            break
    else:
        return
    wanting = [p for p in profiles if p.privileged != _NEVER]
    label = _label(where, container)
    required = [p.name for p in wanting if p.privileged == _REQUIRED]
    context = body.get("securityContext")
    reason = run.privileged_block
    if reason is None and isinstance(context, dict):
        if context.get("privileged") is True:
            return
        if context.get("privileged") is False:
            reason = "the user set securityContext.privileged: false"
        elif context.get("allowPrivilegeEscalation") is False:
            reason = "the user set allowPrivilegeEscalation: false, which privileged contradicts"
    if reason is not None:
        if required:
            raise InjectionDenied(f"{label}: profile {required[0]} requires privileged: true, but {reason}")
        run.warn_once(f"{label}.securityContext.privileged not set: {reason}")
        return
    mine["p"] = 1
    if not isinstance(context, dict):
        mine.setdefault("new", []).append("p")
    patch_ops.set_in_map(run.ops, f"{ptr}/securityContext", context, "privileged", True)
