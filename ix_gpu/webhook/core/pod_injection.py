"""Merging a profile's volumes, mounts, env, privileges and scheduling into one pod template: the
template's own parts here, each GPU container's in :mod:`.container_injection`, what the merges
share (the run, list lookups, semantic equality) in :mod:`.injection_run`.

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

from dataclasses import dataclass
from typing import Any

from ix_gpu.config.text import shown
from ix_gpu.devicemodel import labels
from ix_gpu.webhook.core import patch_ops
from ix_gpu.webhook.core.compiled_config import CompiledProfile
from ix_gpu.webhook.core.container_injection import merge_container
from ix_gpu.webhook.core.gpu_requests import GpuContainer
from ix_gpu.webhook.core.injection_record import TemplateRecord, merge_records
from ix_gpu.webhook.core.injection_run import InjectionRun, last_by, same
from ix_gpu.webhook.core.patch_ops import token
from ix_gpu.webhook.core.record_items import item_ref
from ix_gpu.webhook.core.templates import PodTemplate

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
    merge = _TemplateMerge(spec, spec_ptr, where, profiles, run, record)
    mountable = merge.volumes()
    for container in containers:
        merge_container(container, spec_ptr, where, mountable, run, record)
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
        merge.node_selector()
    if tolerations:
        merge.tolerations()
    if gpu_types:
        wanted = {"key": labels.GPU_PRODUCT, "operator": "In", "values": gpu_types}
        requirements.append(wanted)
        refs.append(item_ref(labels.GPU_PRODUCT, wanted))
    if requirements:
        merge.required_node_affinity(requirements, refs)
    if runtime_class:
        merge.runtime_class()

    if len(profiles) == 1:
        name = profiles[0].name
        run.profiles_used[name] = None
    else:
        names = [p.name for p in profiles]
        run.profiles_used.update(dict.fromkeys(names))
        name = "+".join(names)
    encoded = record.encode() if len(run.ops) > start else None
    _set_injected_annotations(template, name + "@" + run.digest, encoded, run)


@dataclass(slots=True)
class _TemplateMerge:
    """One pod template being injected: where it is (its spec, that spec's JSON pointer, its place
    in the object for messages), the profiles its GPU containers hold, the run the ops and warnings
    go to, and the record of what this pass adds. Each method merges one kind of item."""

    spec: dict[str, Any]
    spec_ptr: str
    where: str
    profiles: tuple[CompiledProfile, ...]
    run: InjectionRun
    record: TemplateRecord

    def __init__(
        self,
        spec: dict[str, Any],
        spec_ptr: str,
        where: str,
        profiles: tuple[CompiledProfile, ...],
        run: InjectionRun,
        record: TemplateRecord,
    ) -> None:
        # Written out, not generated: mypyc compiles this one (see docs/design.md).
        self.spec = spec
        self.spec_ptr = spec_ptr
        self.where = where
        self.profiles = profiles
        self.run = run
        self.record = record

    def parts(
        self,
    ) -> tuple[dict[str, Any], str, str, tuple[CompiledProfile, ...], InjectionRun, TemplateRecord]:
        """The fields as locals for the merges' loops (a local is read faster than an attribute)."""
        return self.spec, self.spec_ptr, self.where, self.profiles, self.run, self.record

    def volumes(self) -> set[str]:
        """Add pod volumes; returns the names of our volumes that containers may mount."""
        spec, spec_ptr, where, profiles, run, record = self.parts()
        existing = spec.get("volumes")
        mountable: set[str] = set()
        offered: dict[str, dict[str, Any]] = {}
        new: list[dict[str, Any]] = []
        for profile in profiles:
            for volume in profile.volumes:
                if run.host_path_block:  # every injected volume is a hostPath
                    run.warn_once(
                        f"{where}spec.volumes: hostPath volumes not injected: {run.host_path_block}"
                    )
                    continue
                if volume.name in offered:
                    if not same(offered[volume.name], volume.volume):
                        run.conflicts.append(
                            f'{where}spec.volumes[name={volume.name}]: profile "{profile.name}" defines it '
                            "differently from an earlier profile; kept the first"
                        )
                    continue
                offered[volume.name] = volume.volume
                current = last_by(existing, "name", volume.name)
                if current is None:
                    new.append(volume.volume)
                    record.volumes.append(volume.volume_ref)
                    mountable.add(volume.name)
                    run.host_paths_added += 1
                elif same(current, volume.volume):
                    mountable.add(volume.name)
                else:
                    env = ", ".join(e.name for e in profile.env)
                    still = (
                        f" (its env {env} is still set: the pod's own volume must provide it)" if env else ""
                    )
                    run.conflicts.append(
                        f"{where}spec.volumes[name={volume.name}]: the pod already has a different volume of "
                        f"this name; kept it and did not mount profile {profile.name}'s{still}"
                    )
        if new:
            if not isinstance(existing, list):
                record.created.append("vol")
            patch_ops.add_to_list(run.ops, spec_ptr + "/volumes", existing, new)
        return mountable

    def node_selector(self) -> None:
        spec, spec_ptr, where, profiles, run, record = self.parts()
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

    def tolerations(self) -> None:
        spec, spec_ptr, _, profiles, run, record = self.parts()
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

    def required_node_affinity(self, requirements: list[dict[str, Any]], refs: list[str]) -> None:
        """AND our requirements into every term of required node affinity (terms are ORed)."""
        spec, spec_ptr, _, _, run, record = self.parts()
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

    def runtime_class(self) -> None:
        spec, spec_ptr, where, profiles, run, record = self.parts()
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
