"""Merging a profile's volumes, mounts, env, privileges and scheduling into one pod template.

Every merge is keyed the way the Pod schema keys its lists (volumes by name, mounts by mountPath,
env by name) and compares *semantically*: the apiserver fills defaults such as ``hostPath.type: ""``
before a webhook sees an object, so an entry we injected earlier may come back with extra empty
fields. Equal means equal once empty values are dropped. That is what makes a second pass — a
reinvocation, or the Pod the TFJob operator creates from an already mutated template — produce no
ops at all.

Conflicts (the user already has something different under the same key) are recorded, never
overwritten; the core turns them into warnings or a denial according to ``policy.conflictPolicy``.
"""

from __future__ import annotations

from typing import Any

from ix_gpu.config.text import shown
from ix_gpu.config.webhook_config import EnvMode, Privileged
from ix_gpu.devicemodel import labels
from ix_gpu.webhook.core import patch_ops
from ix_gpu.webhook.core.compiled_config import CompiledProfile, ContainerFast, InjectedEnv
from ix_gpu.webhook.core.gpu_requests import GpuContainer
from ix_gpu.webhook.core.injection_record import TemplateRecord, item_ref, merge_records
from ix_gpu.webhook.core.patch_ops import Op, token
from ix_gpu.webhook.core.templates import PodTemplate


class InjectionDenied(Exception):
    """A profile requirement that cannot be met here (e.g. ``privileged: required`` under PSA)."""


class InjectionRun:
    """Accumulates the outcome of mutating one object, across its templates.

    A plain slotted class: a dataclass with four default factories costs more to create than
    some of the merges it records.
    """

    __slots__ = (
        "conflicts",
        "digest",
        "host_path_block",
        "host_paths_added",
        "ops",
        "privileged_block",
        "profiles_used",
        "warnings",
    )

    def __init__(self, digest: str, host_path_block: str | None, privileged_block: str | None) -> None:
        self.digest = digest
        self.host_path_block = host_path_block
        """Why hostPath volumes must not be injected (Pod Security would reject them), or None."""
        self.privileged_block = privileged_block
        """Why ``privileged: true`` may not be set in this namespace, or None."""
        self.host_paths_added = 0
        self.ops: list[Op] = []
        self.warnings: list[str] = []
        self.conflicts: list[str] = []
        self.profiles_used: dict[str, None] = {}

    def warn_once(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)


def _empty(value: Any) -> bool:
    """Absent-equivalent after apiserver defaulting. O(1) whatever ``value`` holds: comparing a
    container with an empty one stops at the length."""
    return value is None or value is False or value == "" or value == [] or value == {}


def same(existing: Any, ours: Any) -> bool:
    """Semantic equality: empty/false/absent fields are the same (apiserver defaulting).

    The walk follows ``ours`` (a profile's value: a few levels deep, from the operator's config)
    and never goes deeper than it, so a user's value nested a thousand levels deep, or a YAML alias
    bomb under a same-name volume, costs no more than a shallow one: no copies, no recursion into
    the user's structure beyond ours.
    """
    if existing == ours:  # bounded too: == stops where the shallower side ends
        return True
    if isinstance(ours, dict):
        if not isinstance(existing, dict):
            return False
        for key, value in existing.items():
            if key not in ours and not _empty(value):
                return False
        for key, value in ours.items():
            theirs = existing.get(key)
            if _empty(value) or _empty(theirs):
                if not (_empty(value) and _empty(theirs)):
                    return False
            elif not same(theirs, value):
                return False
        return True
    if isinstance(ours, list):
        if not isinstance(existing, list) or len(existing) != len(ours):
            return False
        return all(same(theirs, value) for theirs, value in zip(existing, ours, strict=True))
    return False  # unequal scalars, or a scalar against a container


def _last_index(entries: Any, key: str, value: str) -> int:
    """Index of the last dict in ``entries`` whose ``key`` equals ``value``, or -1.

    Lists are keyed the way the Pod schema keys them (env and volumes by name, mounts by
    mountPath); for duplicate env names the runtime takes the last. A reverse scan per injected
    entry beats building an index: a profile adds one or two entries while a container may hold
    dozens, and this runs for every GPU container of every admitted pod.
    """
    if not isinstance(entries, list):
        return -1
    try:
        # Most lookups find nothing (the pod does not have our entry yet): a plain forward scan
        # says so at about half the cost of the indexed reverse one below.
        for entry in entries:
            if entry.get(key) == value:
                break
        else:
            return -1
        i = len(entries)
        for entry in reversed(entries):
            i -= 1
            if entry.get(key) == value:
                return i
    except AttributeError:  # a non-dict entry (invalid, but never our crash): scan carefully
        i = len(entries)
        for entry in reversed(entries):
            i -= 1
            if isinstance(entry, dict) and entry.get(key) == value:
                return i
    return -1


def _last_by(entries: Any, key: str, value: str) -> Any:
    at = _last_index(entries, key, value)
    return entries[at] if at >= 0 else None


WINDOWS_HOST_PATH = "Windows pods (spec.os.name: windows) cannot use hostPath"
WINDOWS_PRIVILEGED = "Windows pods (spec.os.name: windows) cannot be privileged"


def inject_template(
    template: PodTemplate, containers: list[GpuContainer], gpu_types: list[str], run: InjectionRun
) -> None:
    """Append to ``run`` the ops that give ``template`` everything its GPU containers' profiles hold.

    A Windows template gets env and scheduling only: hostPath volumes (driver libraries, device
    nodes) and ``privileged`` would turn a valid Windows pod into one the apiserver rejects, so they
    are skipped with a warning (and ``privileged: required`` is denied), as under Pod Security.
    """
    pod_os = template.body["spec"].get("os")
    if not isinstance(pod_os, dict) or pod_os.get("name") != "windows":
        _inject_template(template, containers, gpu_types, run)
        return
    saved = run.host_path_block, run.privileged_block
    run.host_path_block, run.privileged_block = WINDOWS_HOST_PATH, WINDOWS_PRIVILEGED
    try:
        _inject_template(template, containers, gpu_types, run)
    finally:
        run.host_path_block, run.privileged_block = saved


def _inject_template(
    template: PodTemplate, containers: list[GpuContainer], gpu_types: list[str], run: InjectionRun
) -> None:
    start = len(run.ops)
    spec: dict[str, Any] = template.body["spec"]
    spec_ptr = template.pointer + "/spec"
    where = template.where + "." if template.where else ""
    # The profiles of all GPU containers, in config order. Usually every container holds the
    # same tuple (one GPU resource, as the config's memo returns it), which is then the answer.
    profiles = containers[0].profiles
    for container in containers:
        if container.profiles != profiles:
            by_index: dict[int, CompiledProfile] = {}
            for other in containers:
                for profile in other.profiles:
                    by_index[profile.index] = profile
            profiles = tuple(by_index[i] for i in sorted(by_index))
            break

    record = TemplateRecord()
    mountable = _merge_volumes(spec, spec_ptr, where, profiles, run, record)
    for container in containers:
        _merge_container(container, spec_ptr, where, mountable, run, record)
    requirements: list[dict[str, Any]] = []
    refs: list[str] = []
    selector = tolerations = runtime_class = False
    for profile in profiles:
        if profile.node_requirements:
            requirements += profile.node_requirements
            refs += profile.requirement_refs
        selector = selector or bool(profile.node_selector)
        tolerations = tolerations or bool(profile.tolerations)
        runtime_class = runtime_class or bool(profile.runtime_class_name)
    # Each merge below does nothing for profiles without its kind of item; skipped, not called.
    if selector:
        _merge_node_selector(spec, spec_ptr, where, profiles, run, record)
    if tolerations:
        _merge_tolerations(spec, spec_ptr, profiles, run, record)
    if gpu_types:
        wanted = {"key": labels.GPU_PRODUCT, "operator": "In", "values": gpu_types}
        requirements.append(wanted)
        refs.append(item_ref(labels.GPU_PRODUCT, wanted))
    if requirements:
        _merge_required_node_affinity(spec, spec_ptr, requirements, refs, run, record)
    if runtime_class:
        _merge_runtime_class(spec, spec_ptr, where, profiles, run, record)

    if len(profiles) == 1:
        name = profiles[0].name
        run.profiles_used[name] = None
    else:
        names = [p.name for p in profiles]
        run.profiles_used.update(dict.fromkeys(names))
        name = "+".join(names)
    encoded = record.encode() if len(run.ops) > start else None
    _set_injected_annotations(template, name + "@" + run.digest, encoded, run)


def _merge_volumes(
    spec: dict[str, Any],
    spec_ptr: str,
    where: str,
    profiles: tuple[CompiledProfile, ...],
    run: InjectionRun,
    record: TemplateRecord,
) -> set[str]:
    """Add pod volumes; returns the names of our volumes that containers may mount."""
    existing = spec.get("volumes")
    mountable: set[str] = set()
    offered: dict[str, dict[str, Any]] = {}
    new: list[dict[str, Any]] = []
    for profile in profiles:
        for volume in profile.volumes:
            if run.host_path_block:  # every injected volume is a hostPath
                run.warn_once(f"{where}spec.volumes: hostPath volumes not injected: {run.host_path_block}")
                continue
            if volume.name in offered:
                if not same(offered[volume.name], volume.volume):
                    run.conflicts.append(
                        f'{where}spec.volumes[name={volume.name}]: profile "{profile.name}" defines it '
                        "differently from an earlier profile; kept the first"
                    )
                continue
            offered[volume.name] = volume.volume
            current = _last_by(existing, "name", volume.name)
            if current is None:
                new.append(volume.volume)
                record.volumes.append(volume.volume_ref)
                mountable.add(volume.name)
                run.host_paths_added += 1
            elif same(current, volume.volume):
                mountable.add(volume.name)
            else:
                env = ", ".join(e.name for e in profile.env)
                still = f" (its env {env} is still set: the pod's own volume must provide it)" if env else ""
                run.conflicts.append(
                    f"{where}spec.volumes[name={volume.name}]: the pod already has a different volume of "
                    f"this name; kept it and did not mount profile {profile.name}'s{still}"
                )
    if new:
        if not isinstance(existing, list):
            record.created.append("vol")
        patch_ops.add_to_list(run.ops, spec_ptr + "/volumes", existing, new)
    return mountable


def _merge_container(
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
        fast = profiles[0].fast
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
                current = _last_by(mounts, "mountPath", path)
                if current is None and new_mounts:
                    current = _last_by(new_mounts, "mountPath", path)
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
_PREPEND_PATH = EnvMode.PREPEND_PATH.value
_NEVER = Privileged.NEVER.value
_REQUIRED = Privileged.REQUIRED.value


def _path_merge(current: str, ours: str, mode: str) -> str:
    parts = [p for p in current.split(":") if p] if current else []
    missing = [p for p in ours.split(":") if p and p not in parts]
    if not missing:
        return current
    return ":".join(missing + parts) if mode == _PREPEND_PATH else ":".join(parts + missing)


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
    for profile in container.profiles:
        for var in profile.env:
            if var.name in appended_at:
                item = appended[appended_at[var.name]]
                item["value"] = _merged_value(item["value"], var)
                continue
            i = _last_index(entries, "name", var.name)
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


def _merge_node_selector(
    spec: dict[str, Any],
    spec_ptr: str,
    where: str,
    profiles: tuple[CompiledProfile, ...],
    run: InjectionRun,
    record: TemplateRecord,
) -> None:
    existing = spec.get("nodeSelector")
    current: dict[str, Any] = dict(existing) if isinstance(existing, dict) else {}
    additions: dict[str, str] = {}
    for profile in profiles:
        for key, value in profile.node_selector:
            have = current.get(key)
            if have is None:
                current[key] = value
                additions[key] = value
            elif have != value:
                run.conflicts.append(
                    f"{where}spec.nodeSelector[{key}]: kept {shown(have)} "
                    f"(profile {profile.name} wants {value!r})"
                )
    if not additions:
        return
    record.selector = additions
    if isinstance(existing, dict):
        for key, value in additions.items():
            run.ops.append(patch_ops.add(f"{spec_ptr}/nodeSelector/{token(key)}", value))
    else:
        record.created.append("sel")
        run.ops.append(patch_ops.add(f"{spec_ptr}/nodeSelector", additions))


def _merge_tolerations(
    spec: dict[str, Any],
    spec_ptr: str,
    profiles: tuple[CompiledProfile, ...],
    run: InjectionRun,
    record: TemplateRecord,
) -> None:
    existing = spec.get("tolerations")
    have: list[Any] = list(existing) if isinstance(existing, list) else []
    new: list[dict[str, Any]] = []
    for profile in profiles:
        for toleration, ref in zip(profile.tolerations, profile.toleration_refs, strict=True):
            for present in have:
                if same(present, toleration):
                    break
            else:
                have.append(toleration)
                new.append(toleration)
                record.tolerations.append(ref)
    if new:
        if not isinstance(existing, list):
            record.created.append("tol")
        patch_ops.add_to_list(run.ops, spec_ptr + "/tolerations", existing, new)


def _merge_required_node_affinity(
    spec: dict[str, Any],
    spec_ptr: str,
    requirements: list[dict[str, Any]],
    refs: list[str],
    run: InjectionRun,
    record: TemplateRecord,
) -> None:
    """AND our requirements into every term of required node affinity (terms are ORed)."""
    unique: list[dict[str, Any]] = []
    unique_refs: list[str] = []
    for requirement, ref in zip(requirements, refs, strict=True):
        if not any(same(requirement, r) for r in unique):
            unique.append(requirement)
            unique_refs.append(ref)
    if not unique:
        return
    created = {"new": 1, "terms": {"0": {"new": 1, "x": unique_refs}}}
    terms: list[dict[str, Any]] = [{"matchExpressions": unique}]
    # Walk down affinity.nodeAffinity.required….nodeSelectorTerms; the first missing level is added
    # whole, holding our single term, and we are done.
    levels = ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
    node: dict[str, Any] = spec
    ptr = spec_ptr
    for depth, key in enumerate(levels):
        ptr = f"{ptr}/{key}"
        child = node.get(key)
        if not isinstance(child, dict):
            value: dict[str, Any] = {"nodeSelectorTerms": terms}
            for outer in reversed(levels[depth + 1 :]):
                value = {outer: value}
            run.ops.append(patch_ops.add(ptr, value))
            record.affinity = created
            return
        node = child
    ptr = f"{ptr}/nodeSelectorTerms"
    existing_terms = node.get("nodeSelectorTerms")
    if not isinstance(existing_terms, list) or not existing_terms:
        run.ops.append(patch_ops.add(ptr, terms))
        record.affinity = created
        return
    added: dict[str, Any] = {}
    for index, term in enumerate(existing_terms):
        if not isinstance(term, dict):
            continue
        expressions = term.get("matchExpressions")
        present = expressions if isinstance(expressions, list) else []
        new = [i for i, r in enumerate(unique) if not any(same(e, r) for e in present)]
        if new:
            fresh = 0 if isinstance(expressions, list) else 1
            added[str(index)] = {"new": fresh, "x": [unique_refs[i] for i in new]}
        patch_ops.add_to_list(
            run.ops, f"{ptr}/{index}/matchExpressions", expressions, [unique[i] for i in new]
        )
    if added:
        record.affinity = {"new": 0, "terms": added}


def _merge_runtime_class(
    spec: dict[str, Any],
    spec_ptr: str,
    where: str,
    profiles: tuple[CompiledProfile, ...],
    run: InjectionRun,
    record: TemplateRecord,
) -> None:
    current = spec.get("runtimeClassName")
    for profile in profiles:
        wanted = profile.runtime_class_name
        if not wanted:
            continue
        if not current:
            run.ops.append(patch_ops.add(f"{spec_ptr}/runtimeClassName", wanted))
            record.runtime_class = current = wanted
        elif current != wanted:
            run.conflicts.append(
                f"{where}spec.runtimeClassName: kept {shown(current)} "
                f"(profile {profile.name} wants {wanted!r})"
            )


def _set_injected_annotations(
    template: PodTemplate, value: str, record: str | None, run: InjectionRun
) -> None:
    """``injected: <profiles>@<digest>``, and ``injected-items`` when this pass added anything
    (merged with the record already there from a pass under the same config)."""
    metadata = template.body.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    present: dict[str, Any] = annotations if isinstance(annotations, dict) else {}
    changed: dict[str, str] = {}
    if present.get(labels.INJECTED) != value:
        changed[labels.INJECTED] = value
    if record:
        stored = present.get(labels.INJECTED_ITEMS)
        if stored is not None:
            same_config = isinstance(present.get(labels.INJECTED), str) and present[labels.INJECTED].endswith(
                "@" + run.digest
            )
            if same_config and isinstance(stored, str):
                spec = template.body.get("spec")
                record = merge_records(stored, record, spec if isinstance(spec, dict) else {})
        if stored != record:
            changed[labels.INJECTED_ITEMS] = record
    if not changed:
        return
    meta_ptr = f"{template.pointer}/metadata"
    if not isinstance(metadata, dict):
        run.ops.append(patch_ops.add(meta_ptr, {"annotations": changed}))
    elif not isinstance(annotations, dict):
        run.ops.append(patch_ops.add(f"{meta_ptr}/annotations", changed))
    else:
        for key, text in changed.items():
            run.ops.append(patch_ops.add(f"{meta_ptr}/annotations/{_ANNOTATION_TOKENS[key]}", text))


_ANNOTATION_TOKENS = {key: token(key) for key in (labels.INJECTED, labels.INJECTED_ITEMS)}
