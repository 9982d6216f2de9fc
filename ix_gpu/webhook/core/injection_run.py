"""What every merge of one mutation shares: the run that collects its ops, warnings and conflicts,
and the lookups and semantic equality the merges key lists with.

Equality is *semantic*: the apiserver fills defaults such as ``hostPath.type: ""`` before a webhook
sees an object, so an entry injected earlier may come back with extra empty fields. Equal means equal
once empty values are dropped, which is what makes a second pass produce no ops at all.
"""

from __future__ import annotations

from typing import Any

from ix_gpu.webhook.core.patch_ops import Op


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


def last_index(entries: Any, key: str, value: str) -> int:
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


def last_by(entries: Any, key: str, value: str) -> Any:
    at = last_index(entries, key, value)
    return entries[at] if at >= 0 else None
