"""What one injection added to a pod template, recorded on it, so a later config can take it back.

Istio's injector records what it injected and removes exactly that before it injects again; this is
the same idea. After injecting, the template gets ``ix-gpu.io/injected-items``, a small JSON object
that names each item this webhook added, and no more than it takes to find that item again and to
tell whether it is still as written:

- ``vol``, ``tol``: pod volumes and tolerations, each as ``<name or key>@<digest>``;
- ``sel``: node selector entries as written; ``rc``: the runtime class name;
- ``aff``: node affinity expressions (``<key>@<digest>``) per required term, and which levels and
  lists the injection created;
- ``c`` / ``i``: per container (``containers`` / ``initContainers``), grouped by name when several
  got the same items (the common case: every GPU container gets one profile): mounts
  (``<name>@<digest>``), env entries as ``[name, value written]`` (an entry we appended),
  ``[name, value written, previous value]`` (a user's entry whose value we changed) or
  ``[name, value written, null]`` (a user's entry without a value that we gave one), and ``p``
  when we set ``privileged``;
- ``new``: the lists and maps the injection created, removed again once stripping empties them.

The digest (:func:`item_digest`) is a short hash of the item with empty fields dropped, the same
equality :func:`~.injection_run.same` uses, so the apiserver's defaulting (``hostPath.type: ""``)
does not make an injected item look changed. A record of the whole patch ops (this module's first
format) was 43 % of the answer for a 10-container pod and was stored with every Pod; this one is a
fraction of it. The config's items are digested once, when the config is compiled.

When a template carries a record made under another config digest (the operator changed the
config; or a TFJob template injected last week produces a Pod today), :func:`strip_stale` removes
exactly the recorded items that are still there *as recorded*, then the current config is applied
as if to the user's original object. An item the user changed since, or wrote themselves, is never
touched, and an env value is restored only while it still holds exactly what was written.

Records in the first format (``{"at": ..., "ops": [...]}``, written by earlier versions) are read
too, converted to this form, and stripped the same way: they are exact records of what an earlier
version injected, and a pod made from a template injected before the upgrade should get the new
config's items, not both. Objects injected before records existed (an ``injected`` annotation
without ``injected-items``) are left as they are: nothing is known about them.

Checking for a stale record costs two dictionary lookups and a string comparison per template, so
the common case (no record, or one made under the current config) pays nothing more.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

from ix_gpu.devicemodel import labels
from ix_gpu.webhook.core.patch_ops import Op, token
from ix_gpu.webhook.core.record_first_format import from_ops
from ix_gpu.webhook.core.record_items import (
    AFFINITY_LEVELS,
    CONTAINER_CREATED,
    ITEMS,
    LIST_KEYS,
    MAX_RECORD_CHARS,
    SPEC_CREATED,
    NotOurs,
    bounded,
    item_digest,
)
from ix_gpu.webhook.core.templates import PodTemplate


class TemplateRecord:
    """The items one injection pass adds to one template, collected while merging (the hot path:
    plain appends, encoded once by :meth:`encode`)."""

    __slots__ = ("affinity", "containers", "created", "runtime_class", "selector", "tolerations", "volumes")

    def __init__(self) -> None:
        self.volumes: list[str] = []
        self.tolerations: list[str] = []
        self.created: list[str] = []
        self.selector: dict[str, str] | None = None
        self.runtime_class: str | None = None
        self.affinity: dict[str, Any] | None = None
        self.containers: list[tuple[str, str, dict[str, Any]]] = []
        """(list name, container name, what it got: ``m``, ``e``, ``p``, ``new``)."""

    def encode(self) -> str:
        record: dict[str, Any] = {}
        if self.volumes:
            record["vol"] = self.volumes
        if self.tolerations:
            record["tol"] = self.tolerations
        if self.selector:
            record["sel"] = self.selector
        if self.runtime_class is not None:
            record["rc"] = self.runtime_class
        if self.affinity is not None:
            record["aff"] = self.affinity
        if self.created:
            record["new"] = self.created
        if self.containers:
            groups: list[tuple[str, dict[str, Any], list[str]]] = []
            for list_name, name, mine in self.containers:
                if "," in name or not name or len(name) > 253:
                    continue  # not a name to find a container by again
                # Containers that got the same items share one entry (see the module docstring).
                # A pod has one or two such groups, so comparing with each is cheaper than any
                # index.
                for group in groups:
                    if group[1] == mine and group[0] == list_name:
                        group[2].append(name)
                        break
                else:
                    groups.append((list_name, mine, [name]))
            for list_name, mine, names in groups:
                key = "i" if list_name == "initContainers" else "c"
                joined = names[0] if len(names) == 1 else ",".join(names)
                if key in record:
                    record[key][joined] = mine
                else:
                    record[key] = {joined: mine}
        return orjson.dumps(record).decode()


def merge_records(stored: str, new: str, spec: dict[str, Any]) -> str:
    """``new`` added to the record already on the template (a second pass under the same config that
    still had something to add, e.g. a container added by another webhook)."""
    try:
        old = _read(stored, spec)
    except (NotOurs, orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError, IndexError):
        return new
    added = orjson.loads(new)
    for key in ("vol", "tol", "new"):
        if key in added:
            old[key] = [*old.get(key, []), *(item for item in added[key] if item not in old.get(key, []))]
    if "sel" in added:
        old["sel"] = {**old.get("sel", {}), **added["sel"]}
    if "rc" in added:
        old["rc"] = added["rc"]
    if "aff" in added:
        mine = old.setdefault("aff", {"new": 0, "terms": {}})
        mine["new"] = int(bool(mine["new"] or added["aff"]["new"]))
        for index, term in added["aff"]["terms"].items():
            have = mine["terms"].setdefault(index, {"new": 0, "x": []})
            have["new"] = int(bool(have["new"] or term["new"]))
            have["x"] = have["x"] + term["x"]
    for list_key in LIST_KEYS:
        for names, mine in added.get(list_key, {}).items():
            old.setdefault(list_key, {})[names] = mine
    return orjson.dumps(old).decode()


def _read(items: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A record in this module's format, from either format (raises when it is not one)."""
    if len(items) > MAX_RECORD_CHARS:  # far above any record we write: not ours to parse
        raise NotOurs("record too long")
    data = orjson.loads(items)
    if not isinstance(data, dict):
        raise NotOurs("not a record")
    if "ops" in data or "at" in data:  # the first format
        if isinstance(data.get("ops"), list) and isinstance(data.get("at"), str):
            return from_ops(spec, data)
        raise NotOurs("not a record")
    if "v" in data:  # a later format, which this version cannot read
        raise NotOurs("not a record this version reads")
    return data


def _stored(body: dict[str, Any], digest: str) -> dict[str, Any] | None:
    """The record on ``body`` when it was made under another config than ``digest``, else None."""
    metadata = body.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if not isinstance(annotations, dict):
        return None
    injected, items = annotations.get(labels.INJECTED), annotations.get(ITEMS)
    if not isinstance(injected, str) or not isinstance(items, str) or injected.endswith("@" + digest):
        return None
    try:
        return _read(items, body.get("spec") or {})
    except (NotOurs, orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None  # not a record we wrote


def strip_stale(template: PodTemplate, digest: str) -> tuple[PodTemplate, list[Op]]:
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
        _strip(spec, spec_ptr, record, ops)
    except (NotOurs, KeyError, TypeError, ValueError, AttributeError, IndexError):
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


# -- reading a record: every part is checked for shape and size before it is acted on ------------


def _strings(value: Any) -> list[str]:
    items: list[Any] = bounded(value, list)
    if not all(isinstance(item, str) for item in items):
        raise NotOurs("not a record")
    return items


def _strip(spec: dict[str, Any], spec_ptr: str, record: dict[str, Any], ops: list[Op]) -> None:
    _remove_refs(spec.get("volumes"), _strings(record.get("vol", [])), "name", f"{spec_ptr}/volumes", ops)
    for list_key, list_name in LIST_KEYS.items():
        entries = spec.get(list_name)
        groups = bounded(record.get(list_key, {}), dict)
        if not isinstance(entries, list):
            continue
        for names, mine in groups.items():
            for name in _strings(names.split(",")):
                for index, body in enumerate(entries):
                    if isinstance(body, dict) and body.get("name") == name:
                        _strip_container(body, f"{spec_ptr}/{list_name}/{index}", bounded(mine, dict), ops)
                        break
    tolerations = _strings(record.get("tol", []))
    _remove_refs(spec.get("tolerations"), tolerations, "key", f"{spec_ptr}/tolerations", ops)
    selector = spec.get("nodeSelector")
    if isinstance(selector, dict):
        for key, value in bounded(record.get("sel", {}), dict).items():
            if selector.get(key) == value:
                ops.append({"op": "remove", "path": f"{spec_ptr}/nodeSelector/{token(key)}"})
                del selector[key]
    if "rc" in record and spec.get("runtimeClassName") == record["rc"]:
        ops.append({"op": "remove", "path": f"{spec_ptr}/runtimeClassName"})
        del spec["runtimeClassName"]
    if "aff" in record:
        _strip_affinity(spec, spec_ptr, bounded(record["aff"], dict), ops)
    _remove_emptied(spec, spec_ptr, _strings(record.get("new", [])), SPEC_CREATED, ops)


def _remove_refs(entries: Any, refs: list[str], key: str | None, path: str, ops: list[Op]) -> None:
    """Remove the last entry that each ``<name>@<digest>`` (or, without ``key``, each digest)
    names, if it is still as written."""
    if not isinstance(entries, list):
        return
    for ref in refs:
        name, _, digest = ref.rpartition("@")
        for index in range(len(entries) - 1, -1, -1):
            entry = entries[index]
            if (
                isinstance(entry, dict)
                and (key is None or entry.get(key, "") == name)
                and item_digest(entry) == digest
            ):
                ops.append({"op": "remove", "path": f"{path}/{index}"})
                del entries[index]
                break


def _remove_emptied(
    parent: dict[str, Any], ptr: str, created: list[str], fields: dict[str, str], ops: list[Op]
) -> None:
    """A list or map the injection created and stripping emptied goes too (the user had none)."""
    for name in created:
        key = fields.get(name)
        if key is not None and key in parent and parent[key] in ([], {}):
            ops.append({"op": "remove", "path": f"{ptr}/{token(key)}"})
            del parent[key]


def _last_named(entries: list[Any], name: str) -> int:
    for index in range(len(entries) - 1, -1, -1):
        entry = entries[index]
        if isinstance(entry, dict) and entry.get("name") == name:
            return index
    return -1


def _strip_container(body: dict[str, Any], ptr: str, mine: dict[str, Any], ops: list[Op]) -> None:
    _remove_refs(body.get("volumeMounts"), _strings(mine.get("m", [])), None, f"{ptr}/volumeMounts", ops)
    env = body.get("env")
    if isinstance(env, list):
        for written in bounded(mine.get("e", []), list):
            name, wrote = _strings(bounded(written, list)[:2])
            if len(written) > 3 or (len(written) == 3 and not isinstance(written[2], str | None)):
                raise NotOurs("not a record")
            index = _last_named(env, name)
            if index < 0 or env[index].get("value") != wrote or "valueFrom" in env[index]:
                continue  # gone, or changed since: the user's now
            if len(written) == 2:  # an entry we appended
                ops.append({"op": "remove", "path": f"{ptr}/env/{index}"})
                del env[index]
            elif isinstance(written[2], str):  # the user's value, which we changed
                ops.append({"op": "replace", "path": f"{ptr}/env/{index}/value", "value": written[2]})
                env[index]["value"] = written[2]
            else:  # the user's entry had no value; we gave it one
                ops.append({"op": "remove", "path": f"{ptr}/env/{index}/value"})
                del env[index]["value"]
    context = body.get("securityContext")
    if mine.get("p") and isinstance(context, dict) and context.get("privileged") is True:
        ops.append({"op": "remove", "path": f"{ptr}/securityContext/privileged"})
        del context["privileged"]
    _remove_emptied(body, ptr, _strings(mine.get("new", [])), CONTAINER_CREATED, ops)


def _strip_affinity(spec: dict[str, Any], spec_ptr: str, entry: dict[str, Any], ops: list[Op]) -> None:
    node: Any = spec
    for level in AFFINITY_LEVELS:
        node = node.get(level) if isinstance(node, dict) else None
    terms = node.get("nodeSelectorTerms") if isinstance(node, dict) else None
    if not isinstance(terms, list):
        return
    terms_ptr = f"{spec_ptr}/{'/'.join(AFFINITY_LEVELS)}/nodeSelectorTerms"
    for index, mine in bounded(entry.get("terms", {}), dict).items():
        term = terms[int(index)] if int(index) < len(terms) else None
        if isinstance(term, dict):
            path = f"{terms_ptr}/{index}/matchExpressions"
            _remove_refs(term.get("matchExpressions"), _strings(mine["x"]), "key", path, ops)
            created = ["x"] if mine["new"] else []
            _remove_emptied(term, f"{terms_ptr}/{index}", created, {"x": "matchExpressions"}, ops)
    emptied = all(
        isinstance(t, dict) and not t.get("matchExpressions") and not t.get("matchFields") for t in terms
    )
    if entry.get("new") and emptied:
        # We created the required affinity: with our expressions gone it would hold empty terms,
        # which match no node. Remove it, and the levels above it that it leaves empty.
        parents: list[dict[str, Any]] = [spec]
        for level in AFFINITY_LEVELS[:-1]:
            parents.append(parents[-1][level])
        for depth in range(len(AFFINITY_LEVELS) - 1, -1, -1):
            parent, level = parents[depth], AFFINITY_LEVELS[depth]
            if depth < len(AFFINITY_LEVELS) - 1 and parent[level]:
                break
            ops.append({"op": "remove", "path": f"{spec_ptr}/{'/'.join(AFFINITY_LEVELS[: depth + 1])}"})
            del parent[level]
