"""What one injection added to a pod template, recorded on it, so a later config can take it back.

Istio's injector records what it injected and removes exactly that before it injects again; this is
the same idea. After injecting, the template gets ``ix-gpu.io/injected-items``: a small JSON record
of the volumes, mounts, env values, ``privileged``, node selector entries, tolerations, node
affinity expressions and runtime class this webhook added: the patch ops themselves, relative to
the template (so the record cannot disagree with what was done), encoded in C on the hot path and
interpreted only when a record is stripped.

When a template carries a record made under another config digest (the operator changed the
config; or a TFJob template injected last week produces a Pod today), :func:`strip_stale` removes
exactly the recorded items that are still there *as recorded*, then the current config is applied
as if to the user's original object. An item the user changed since, or wrote themselves, is never
touched: removal compares semantically (:func:`~.pod_injection.same`), and an env value is
restored only while it still holds exactly what was written. Objects injected before records
existed (an ``injected`` annotation without ``injected-items``) are left as they are, as before.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import orjson

from ix_gpu.devicemodel import labels
from ix_gpu.webhook.core.patch_ops import Op, token
from ix_gpu.webhook.core.templates import PodTemplate

ITEMS = labels.INJECTED_ITEMS
_AFFINITY_LEVELS = ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
_CONTAINER_LISTS = ("containers", "initContainers")


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~") if "~" in part else part


def _container(spec: dict[str, Any], list_name: str, index: int) -> dict[str, Any]:
    entries = spec.get(list_name)
    if isinstance(entries, list) and 0 <= index < len(entries):
        entry = entries[index]
        if isinstance(entry, dict):
            return entry
    return {}


_ENV_VALUE = re.compile(r"/spec/(containers|initContainers)/([0-9]+)/env/([0-9]+)/value")


def capture(template_pointer: str, spec: dict[str, Any], ops: list[Op]) -> str:
    """What goes into ``injected-items``: this template's ops as they are, where the template was,
    and the value each env entry had before we set it. On the admission hot path, so it only
    encodes (in C); :func:`_interpret` reads it, and only when stripping."""
    previous: dict[str, Any] = {}
    cut = len(template_pointer)
    for op in ops:
        path = op["path"]
        if not path.endswith("/value"):
            continue
        # Matched relative to the template and whole: a user's replica key may be called "env",
        # and an operator's nodeSelector key "value".
        env_value = _ENV_VALUE.fullmatch(path, cut)
        if env_value is not None:  # an existing env entry's value was set
            list_name, index, entry_index = env_value.groups()
            entry = spec[list_name][int(index)]["env"][int(entry_index)]
            before = entry.get("value")
            previous[path[cut:]] = before if isinstance(before, str) else None
    record: dict[str, Any] = {"at": template_pointer, "ops": ops}
    if previous:
        record["previous"] = previous
    return _encode(record)


def _encode(data: dict[str, Any]) -> str:
    return orjson.dumps(data).decode()


def _interpret(spec: dict[str, Any], captured: dict[str, Any]) -> dict[str, Any]:
    """The items a captured record added, keyed the way stripping finds them (by name, by
    semantic equality), from the ops as :func:`capture` stored them."""
    record: dict[str, Any] = {}
    previous = captured.get("previous", {})
    cut = len(captured["at"])
    for op in captured["ops"]:
        path, value = op["path"][cut:], op.get("value")
        if not path.startswith("/spec/"):
            continue
        parts = [_unescape(p) for p in path[len("/spec/") :].split("/")]
        head = parts[0]
        if len(parts) == 1 and head in ("volumes", "tolerations", "nodeSelector"):
            record.setdefault("created", []).append(head)
        if head in ("volumes", "tolerations"):
            record.setdefault(head, []).extend(value if len(parts) == 1 else [value])
        elif head == "nodeSelector":
            record.setdefault(head, {}).update(value if len(parts) == 1 else {parts[1]: value})
        elif head == "runtimeClassName":
            record[head] = value
        elif head == "affinity":
            _record_affinity(record, parts, value)
        elif head in _CONTAINER_LISTS and len(parts) >= 3 and parts[1].isdigit():
            body = _container(spec, head, int(parts[1]))
            name = body.get("name")
            if isinstance(name, str) and len(name) <= 253:  # a longer one is no valid name to key on
                mine = record.setdefault("containers", {}).setdefault(f"{head}/{name}", {})
                _record_container(mine, body, parts[2:], value, previous.get(path, _ABSENT))
                if len(parts) == 3:
                    mine.setdefault("created", []).append(parts[2])
    return record


def _record_affinity(record: dict[str, Any], parts: list[str], value: Any) -> None:
    """Which expressions went into which term (by index), and which lists or levels were created:
    the same expression the user wrote in another term is theirs, not ours."""
    entry = record.setdefault("nodeAffinity", {"created": False, "terms": {}})
    levels = (*_AFFINITY_LEVELS, "nodeSelectorTerms")
    if tuple(parts) == levels[: len(parts)]:
        # A level was missing and added whole, holding one term of our expressions.
        entry["created"] = True
        node = value
        for level in levels[len(parts) :]:
            node = node[level]
        entry["terms"]["0"] = {"expressions": list(node[0]["matchExpressions"]), "created": True}
        return
    term = entry["terms"].setdefault(parts[len(levels)], {"expressions": [], "created": False})
    if parts[-1] == "matchExpressions":  # the term had none: the list was created
        term["created"] = True
        term["expressions"].extend(value)
    else:  # .../matchExpressions/-
        term["expressions"].append(value)


_ABSENT = object()


def _record_container(
    mine: dict[str, Any], body: dict[str, Any], rest: list[str], value: Any, before: Any
) -> None:
    field = rest[0]
    if field == "volumeMounts":
        mine.setdefault(field, []).extend(value if len(rest) == 1 else [value])
    elif field == "securityContext":
        mine["privileged"] = True
    elif field == "env" and len(rest) <= 2:  # the list created, or entries appended
        for item in value if len(rest) == 1 else [value]:
            mine.setdefault("env", []).append({"name": item["name"], "wrote": item["value"]})
    elif field == "env" and len(rest) == 3 and rest[1].isdigit():  # an existing entry's value set
        entries = body.get("env")
        entry = entries[int(rest[1])] if isinstance(entries, list) else {}
        written = {"name": entry.get("name"), "wrote": value}
        if isinstance(before, str):
            written["previous"] = before
        elif before is _ABSENT:
            written["kept"] = True  # the entry was the user's, without a value
        else:
            return  # it held no string (invalid): nothing to restore, so left as it is
        mine.setdefault("env", []).append(written)


def merge_captured(stored: str, new: str) -> str:
    """``new`` appended to the record already on the template (a second pass under the same
    config that still had something to add, e.g. a container added by another webhook)."""
    try:
        old = orjson.loads(stored) if len(stored) <= MAX_RECORD_CHARS else None
    except orjson.JSONDecodeError:
        old = None
    if not isinstance(old, dict) or not isinstance(old.get("ops"), list):
        return new
    added = orjson.loads(new)
    if old.get("at") != added["at"]:
        return new
    merged = {"at": added["at"], "ops": old["ops"] + added["ops"]}
    previous = {**(old.get("previous") or {}), **added.get("previous", {})}
    if previous:
        merged["previous"] = previous
    return _encode(merged)


def _stored(body: dict[str, Any], digest: str) -> dict[str, Any] | None:
    """The record on ``body`` when it was made under another config than ``digest``, else None."""
    metadata = body.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if not isinstance(annotations, dict):
        return None
    injected, items = annotations.get(labels.INJECTED), annotations.get(ITEMS)
    if not isinstance(injected, str) or not isinstance(items, str) or injected.endswith("@" + digest):
        return None
    if len(items) > MAX_RECORD_CHARS:  # far above any record we write: not ours to parse
        return None
    try:
        captured = orjson.loads(items)
        record = _interpret(body.get("spec") or {}, captured)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None  # not a record we wrote
    return record if _plausible(record) else None


MAX_RECORD_CHARS = 32 << 10
MAX_RECORDED = 64
"""Entries per recorded list, and containers or terms per record. Stripping compares each recorded
entry with the object's entries; a record is the object's own annotation (its author could write
anything), so its size must not multiply the work of a large object."""


def _plausible(record: dict[str, Any]) -> bool:
    def small(value: Any) -> bool:
        return isinstance(value, list | dict) and len(value) <= MAX_RECORDED

    try:
        containers = record.get("containers", {})
        terms = record.get("nodeAffinity", {}).get("terms", {})
        return (
            all(small(record.get(key, [])) for key in ("volumes", "tolerations", "nodeSelector", "created"))
            and small(containers)
            and all(
                small(mine) and all(small(v) for v in mine.values() if not isinstance(v, bool))
                for mine in containers.values()
            )
            and small(terms)
            and all(small(term.get("expressions", [])) for term in terms.values())
        )
    except (AttributeError, TypeError):
        return False


def strip_stale(template: PodTemplate, digest: str, same: Any) -> tuple[PodTemplate, list[Op]]:
    """Remove what an injection under another config recorded; returns the template as it is after
    the removal (a copy, when anything was removed) and the ops that remove it, in order."""
    record = _stored(template.body, digest)
    spec = template.body.get("spec")
    if record is None or not isinstance(spec, dict):
        return template, []
    body = copy.deepcopy(template.body)
    spec = body["spec"]
    spec_ptr = f"{template.pointer}/spec"
    ops: list[Op] = []
    try:
        _strip(spec, spec_ptr, record, same, ops)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return template, []  # a record we cannot read is not acted on
    metadata_ptr = f"{template.pointer}/metadata/annotations"
    annotations = body["metadata"]["annotations"]
    for key in (labels.INJECTED, ITEMS):
        ops.append({"op": "remove", "path": f"{metadata_ptr}/{token(key)}"})
        del annotations[key]
    if not annotations:  # ours alone: the injection created the map
        ops.append({"op": "remove", "path": metadata_ptr})
        del body["metadata"]["annotations"]
    return PodTemplate(template.pointer, template.where, body), ops


def _remove_matching(
    entries: Any, recorded: list[Any], same: Any, path: str, ops: list[Op]
) -> None:
    if not isinstance(entries, list):
        return
    for wanted in recorded:
        for index in range(len(entries) - 1, -1, -1):
            if same(entries[index], wanted):
                ops.append({"op": "remove", "path": f"{path}/{index}"})
                del entries[index]
                break


def _strip(spec: dict[str, Any], spec_ptr: str, record: dict[str, Any], same: Any, ops: list[Op]) -> None:
    _remove_matching(spec.get("volumes"), record.get("volumes", []), same, f"{spec_ptr}/volumes", ops)
    for key, mine in record.get("containers", {}).items():
        list_name, _, name = key.partition("/")
        entries = spec.get(list_name)
        if list_name not in _CONTAINER_LISTS or not isinstance(entries, list):
            continue
        for index, body in enumerate(entries):
            if isinstance(body, dict) and body.get("name") == name:
                _strip_container(body, f"{spec_ptr}/{list_name}/{index}", mine, same, ops)
                break
    tolerations = record.get("tolerations", [])
    _remove_matching(spec.get("tolerations"), tolerations, same, f"{spec_ptr}/tolerations", ops)
    selector = spec.get("nodeSelector")
    if isinstance(selector, dict):
        for key, value in record.get("nodeSelector", {}).items():
            if selector.get(key) == value:
                ops.append({"op": "remove", "path": f"{spec_ptr}/nodeSelector/{token(key)}"})
                del selector[key]
    if "runtimeClassName" in record and spec.get("runtimeClassName") == record["runtimeClassName"]:
        ops.append({"op": "remove", "path": f"{spec_ptr}/runtimeClassName"})
        del spec["runtimeClassName"]
    if "nodeAffinity" in record:
        _strip_affinity(spec, spec_ptr, record["nodeAffinity"], same, ops)
    _remove_emptied(spec, spec_ptr, record.get("created", []), ops)


def _remove_emptied(parent: dict[str, Any], ptr: str, created: list[str], ops: list[Op]) -> None:
    """A list or map the injection created and stripping emptied goes too (the user had none)."""
    for key in created:
        if key in parent and parent[key] in ([], {}):
            ops.append({"op": "remove", "path": f"{ptr}/{token(key)}"})
            del parent[key]


def _last_named(entries: list[Any], name: str) -> int:
    for index in range(len(entries) - 1, -1, -1):
        entry = entries[index]
        if isinstance(entry, dict) and entry.get("name") == name:
            return index
    return -1


def _strip_container(body: dict[str, Any], ptr: str, mine: dict[str, Any], same: Any, ops: list[Op]) -> None:
    mounts = mine.get("volumeMounts", [])
    _remove_matching(body.get("volumeMounts"), mounts, same, f"{ptr}/volumeMounts", ops)
    env = body.get("env")
    if isinstance(env, list):
        for written in mine.get("env", []):
            index = _last_named(env, written["name"])
            if index < 0 or env[index].get("value") != written["wrote"] or "valueFrom" in env[index]:
                continue  # gone, or changed since: the user's now
            if "previous" in written:
                previous = written["previous"]
                ops.append({"op": "replace", "path": f"{ptr}/env/{index}/value", "value": previous})
                env[index]["value"] = previous
            elif written.get("kept"):
                ops.append({"op": "remove", "path": f"{ptr}/env/{index}/value"})
                del env[index]["value"]
            else:
                ops.append({"op": "remove", "path": f"{ptr}/env/{index}"})
                del env[index]
    context = body.get("securityContext")
    if mine.get("privileged") and isinstance(context, dict) and context.get("privileged") is True:
        ops.append({"op": "remove", "path": f"{ptr}/securityContext/privileged"})
        del context["privileged"]
    _remove_emptied(body, ptr, mine.get("created", []), ops)


def _strip_affinity(
    spec: dict[str, Any], spec_ptr: str, entry: dict[str, Any], same: Any, ops: list[Op]
) -> None:
    node: Any = spec
    for level in _AFFINITY_LEVELS:
        node = node.get(level) if isinstance(node, dict) else None
    terms = node.get("nodeSelectorTerms") if isinstance(node, dict) else None
    if not isinstance(terms, list):
        return
    terms_ptr = f"{spec_ptr}/{'/'.join(_AFFINITY_LEVELS)}/nodeSelectorTerms"
    for index, mine in entry.get("terms", {}).items():
        term = terms[int(index)] if int(index) < len(terms) else None
        if isinstance(term, dict):
            path = f"{terms_ptr}/{index}/matchExpressions"
            _remove_matching(term.get("matchExpressions"), mine["expressions"], same, path, ops)
            created = ["matchExpressions"] if mine["created"] else []
            _remove_emptied(term, f"{terms_ptr}/{index}", created, ops)
    emptied = all(
        isinstance(t, dict) and not t.get("matchExpressions") and not t.get("matchFields") for t in terms
    )
    if entry.get("created") and emptied:
        # We created the required affinity: with our expressions gone it would hold empty terms,
        # which match no node. Remove it, and the levels above it that it leaves empty.
        parents: list[dict[str, Any]] = [spec]
        for level in _AFFINITY_LEVELS[:-1]:
            parents.append(parents[-1][level])
        for depth in range(len(_AFFINITY_LEVELS) - 1, -1, -1):
            parent, level = parents[depth], _AFFINITY_LEVELS[depth]
            if depth < len(_AFFINITY_LEVELS) - 1 and parent[level]:
                break
            ops.append({"op": "remove", "path": f"{spec_ptr}/{'/'.join(_AFFINITY_LEVELS[: depth + 1])}"})
            del parent[level]
