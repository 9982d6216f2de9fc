"""Reading the injection record's first format: the patch ops as they were applied (and the env
values they replaced), turned into today's record, as if recorded now, so a pod injected by an
older release is stripped like any other (:func:`.injection_record.strip_stale`).
"""

from __future__ import annotations

from typing import Any

from ix_gpu.webhook.core.record_items import (
    AFFINITY_LEVELS,
    CONTAINER_CREATED,
    SPEC_CREATED,
    add_to_group,
    bounded,
    item_digest,
    item_ref,
)


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~") if "~" in part else part


def from_ops(spec: dict[str, Any], captured: dict[str, Any]) -> dict[str, Any]:
    """A first-format record (the ops as they were applied, and the env values they replaced) in
    this module's format: each added item named by its digest, as if recorded today."""
    record: dict[str, Any] = {}
    previous = bounded(captured.get("previous", {}), dict)
    cut = len(captured["at"])
    containers: dict[tuple[str, str], dict[str, Any]] = {}
    for op in bounded(captured["ops"], list):
        path, value = op["path"][cut:], op.get("value")
        if not path.startswith("/spec/"):
            continue
        parts = [_unescape(p) for p in path[len("/spec/") :].split("/")]
        head = parts[0]
        if len(parts) == 1 and head in _SPEC_FIELDS:
            record.setdefault("new", []).append(_SPEC_FIELDS[head])
        values = bounded(value, list) if len(parts) == 1 and head in ("volumes", "tolerations") else [value]
        if head == "volumes":
            record.setdefault("vol", []).extend(item_ref(v.get("name"), v) for v in values)
        elif head == "tolerations":
            record.setdefault("tol", []).extend(item_ref(t.get("key", ""), t) for t in values)
        elif head == "nodeSelector":
            record.setdefault("sel", {}).update(value if len(parts) == 1 else {parts[1]: value})
        elif head == "runtimeClassName":
            record["rc"] = value
        elif head == "affinity":
            _affinity_from_op(record, parts, value)
        elif head in ("containers", "initContainers") and len(parts) >= 3 and parts[1].isdigit():
            entries = spec.get(head)
            index = int(parts[1])
            body = entries[index] if isinstance(entries, list) and index < len(entries) else None
            name = body.get("name") if isinstance(body, dict) else None
            if isinstance(body, dict) and isinstance(name, str):
                mine = containers.setdefault((head, name), {})
                _container_from_op(mine, body, parts[2:], value, previous.get(path, _ABSENT))
    for (list_name, name), mine in containers.items():
        if mine:
            add_to_group(record, "i" if list_name == "initContainers" else "c", name, mine)
    return record


_ABSENT = object()
_SPEC_FIELDS = {field: key for key, field in SPEC_CREATED.items()}
_CONTAINER_FIELDS = {field: key for key, field in CONTAINER_CREATED.items()}


def _affinity_from_op(record: dict[str, Any], parts: list[str], value: Any) -> None:
    entry = record.setdefault("aff", {"new": 0, "terms": {}})
    levels = (*AFFINITY_LEVELS, "nodeSelectorTerms")
    if tuple(parts) == levels[: len(parts)]:  # a level was missing and added whole, with one term
        entry["new"] = 1
        node = value
        for level in levels[len(parts) :]:
            node = node[level]
        expressions = node[0]["matchExpressions"]
        entry["terms"]["0"] = {"new": 1, "x": [item_ref(e.get("key"), e) for e in expressions]}
        return
    term = entry["terms"].setdefault(parts[len(levels)], {"new": 0, "x": []})
    if parts[-1] == "matchExpressions":  # the term had none: the list was created
        term["new"] = 1
        term["x"].extend(item_ref(e.get("key"), e) for e in value)
    else:  # .../matchExpressions/-
        term["x"].append(item_ref(value.get("key"), value))


def _container_from_op(
    mine: dict[str, Any], body: dict[str, Any], rest: list[str], value: Any, before: Any
) -> None:
    field = rest[0]
    if len(rest) == 1 and field in _CONTAINER_FIELDS:
        mine.setdefault("new", []).append(_CONTAINER_FIELDS[field])
    if field == "volumeMounts":
        mounts = value if len(rest) == 1 else [value]
        mine.setdefault("m", []).extend(str(item_digest(m)) for m in mounts)
    elif field == "securityContext":
        mine["p"] = 1
    elif field == "env" and len(rest) <= 2:  # the list created, or entries appended
        for item in value if len(rest) == 1 else [value]:
            mine.setdefault("e", []).append([item["name"], item["value"]])
    elif field == "env" and len(rest) == 3 and rest[1].isdigit():  # an existing entry's value set
        entries = body.get("env")
        entry = entries[int(rest[1])] if isinstance(entries, list) else {}
        # The first format wrote null for an entry without a value (an env value held anything
        # else would not have passed the apiserver's validation): we gave it one, so take it back.
        if isinstance(before, str) or before is None:
            mine.setdefault("e", []).append(
                [entry.get("name"), value, before if isinstance(before, str) else None]
            )
