"""The injection record's vocabulary: how it names an injected item (a name and a short digest of
the item), the keys it files them under, and the bounds every record read is held to. Shared by the
record's writer and reader (:mod:`.injection_record`) and by the reader of its first format
(:mod:`.record_first_format`).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sized
from typing import Any

import orjson

from ix_gpu.devicemodel import labels

ITEMS = labels.INJECTED_ITEMS
AFFINITY_LEVELS = ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
LIST_KEYS = {"c": "containers", "i": "initContainers"}
SPEC_CREATED = {"vol": "volumes", "tol": "tolerations", "sel": "nodeSelector"}
CONTAINER_CREATED = {"m": "volumeMounts", "e": "env", "p": "securityContext"}
"""``new`` names a created list or map by the key its items are recorded under."""

MAX_RECORD_CHARS = 32 << 10
MAX_RECORDED = 64
"""Entries per recorded list, and container groups, names or terms per record. Stripping compares
each recorded entry with the object's entries; a record is the object's own annotation (its author
could write anything), so its size must not multiply the work of a large object."""
_MAX_DIGESTED_NODES = 256
_MAX_DIGESTED_DEPTH = 8
"""How much of an object's entry is digested when it is compared with a record: an injected item is
a few small maps deep, so anything bigger is not one of ours and is not walked."""


class NotOurs(ValueError):
    """A record, or an object's entry, that cannot be what this webhook wrote."""


def _empty(value: Any) -> bool:
    return value is None or value is False or value == "" or value == [] or value == {}


def _normal(value: Any, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0 or depth > _MAX_DIGESTED_DEPTH:
        raise NotOurs("too large to be an injected item")
    if isinstance(value, dict):
        return {k: _normal(v, depth + 1, budget) for k, v in value.items() if not _empty(v)}
    if isinstance(value, list):
        return [_normal(v, depth + 1, budget) for v in value]
    return value


def item_digest(value: Any) -> str | None:
    """Six characters (36 bits) that identify ``value`` up to empty fields; None when ``value`` is
    too big or odd to be an injected item (nothing recorded can match it). An object's own entry
    matches a recorded digest by chance about once in 7 * 10**10, and then only under the same
    name or key."""
    try:
        encoded = orjson.dumps(_normal(value, 0, [_MAX_DIGESTED_NODES]), option=orjson.OPT_SORT_KEYS)
    except (NotOurs, TypeError, orjson.JSONEncodeError):
        return None
    return base64.urlsafe_b64encode(hashlib.blake2b(encoded, digest_size=6).digest())[:6].decode()


def item_ref(name: Any, value: Any) -> str:
    """``<name>@<digest>``: how the record names one injected item."""
    return f"{name if isinstance(name, str) else ''}@{item_digest(value)}"


def add_to_group(record: dict[str, Any], list_key: str, name: str, mine: dict[str, Any]) -> None:
    """Containers that got the same items share one entry, keyed by their names joined with ``,``
    (a container name is a DNS label: it holds no comma)."""
    if "," in name or not name or len(name) > 253:
        return  # not a name to find a container by again
    groups: dict[str, Any] = record.setdefault(list_key, {})
    for key, theirs in groups.items():
        if theirs == mine:
            del groups[key]
            groups[f"{key},{name}"] = theirs
            return
    groups[name] = mine


def bounded(value: Any, kind: type[Sized]) -> Any:
    if not isinstance(value, kind) or len(value) > MAX_RECORDED:
        raise NotOurs("not a record")
    return value
