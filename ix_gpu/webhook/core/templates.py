"""Finding the pod templates inside a workload object.

A workload's ``templatePaths`` (config) say where PodTemplateSpecs live: ``.`` for a Pod itself,
``spec.tfReplicaSpecs.*.template`` for a TFJob (``*`` = every key of a map, whatever its casing),
``spec.replica_specs[*].template`` for tf-operator's legacy TfJob (``[*]`` = every list item).
Anything of the wrong shape on the way is simply not a template: the apiserver or the CRD's schema
is the validator, and the webhook must never crash on an odd object.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from itertools import islice
from typing import Any

from ix_gpu.webhook.core.patch_ops import token


@dataclass(slots=True)  # not frozen: frozen __init__ costs ~3x on the hot path
class PodTemplate:
    pointer: str
    """JSON Pointer of the template ('' for a Pod itself); ``/spec`` and ``/metadata`` hang off it."""
    where: str
    """Human-readable location for messages ('' for a Pod, else ``spec.tfReplicaSpecs.Worker.template``)."""
    body: dict[str, Any]

    def __init__(self, pointer: str, where: str, body: dict[str, Any]) -> None:
        # Written out, not generated: mypyc compiles this one (see docs/design.md).
        self.pointer = pointer
        self.where = where
        self.body = body


@dataclass(frozen=True, slots=True)
class _Step:
    key: str | None
    """A map key to descend into, or None for "every key" (``*``)."""
    each_item: bool
    """Then descend into every list item (``name[*]``)."""


@lru_cache(maxsize=256)
def _compile(path: str) -> tuple[_Step, ...]:
    steps = []
    for segment in path.split("."):
        if segment == "*":
            steps.append(_Step(None, False))
        elif segment.endswith("[*]"):
            steps.append(_Step(segment[:-3], True))
        else:
            steps.append(_Step(segment, False))
    return tuple(steps)


MAX_KEY_CHARS = 253
"""The longest Kubernetes name (a DNS subdomain)."""


class TemplateKeyError(ValueError):
    """A key on the way to a pod template that no Kubernetes object would have."""


_MAX_SHOWN_KEY = 64
"""``where`` is for messages; a key under ``*`` is the user's and may be a megabyte long."""


def _walk(node: Any, steps: tuple[_Step, ...], pointer: str, where: str) -> Iterator[PodTemplate]:
    if not steps:
        if isinstance(node, dict):
            yield PodTemplate(pointer, where, node)
        return
    if not isinstance(node, dict):
        return
    step, rest = steps[0], steps[1:]
    keys = [k for k in node if isinstance(k, str)] if step.key is None else [step.key]
    for key in keys:
        if key not in node:
            continue
        if len(key) > MAX_KEY_CHARS:
            # Every patch op into this template would repeat the key (escaped, up to twice its
            # length): a 3 MB key made a 40 MB answer. No Kubernetes name is this long.
            raise TemplateKeyError(
                f"{where + '.' if where else ''}{key[:20]}… is a {len(key)}-character key; "
                f"pod template keys are at most {MAX_KEY_CHARS} characters"
            )
        child = node[key]
        child_pointer = f"{pointer}/{token(key)}"
        shown = key if len(key) <= _MAX_SHOWN_KEY else key[: _MAX_SHOWN_KEY - 1] + "…"  # a user's key
        child_where = f"{where}.{shown}" if where else shown
        if step.each_item:
            if isinstance(child, list):
                for index, item in enumerate(child):
                    yield from _walk(item, rest, f"{child_pointer}/{index}", f"{child_where}[{index}]")
        else:
            yield from _walk(child, rest, child_pointer, child_where)


def find_templates(obj: dict[str, Any], template_paths: tuple[str, ...], limit: int) -> list[PodTemplate]:
    """Every pod template of ``obj`` named by ``template_paths``, in document order per path; the
    walk stops once it has found more than ``limit`` (the caller refuses such an object, so walking
    twelve thousand replica keys to count them all would be wasted)."""
    found: list[PodTemplate] = []
    for path in template_paths:
        if path == ".":
            found.append(PodTemplate("", "", obj))
        else:
            found.extend(islice(_walk(obj, _compile(path), "", ""), limit + 1 - len(found)))
        if len(found) > limit:
            break
    return found
