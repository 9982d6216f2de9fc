"""JSON Patch (RFC 6902) operations, built explicitly.

We never diff two documents to get a patch: a diff cannot tell "append to env" from "replace env",
and a reinvoked webhook must express exactly the intended change. Every builder here takes a
JSON Pointer already escaped (see :func:`token`), and callers create missing parents themselves —
an ``add`` into a map or list that does not exist fails on the apiserver.
"""

from __future__ import annotations

from typing import Any

Op = dict[str, Any]


def token(key: str) -> str:
    """Escape one reference token: ``~`` → ``~0`` then ``/`` → ``~1`` (RFC 6901 order matters)."""
    if "~" in key:
        key = key.replace("~", "~0")
    if "/" in key:
        key = key.replace("/", "~1")
    return key


def add(path: str, value: Any) -> Op:
    return {"op": "add", "path": path, "value": value}


def replace(path: str, value: Any) -> Op:
    return {"op": "replace", "path": path, "value": value}


def add_to_list(ops: list[Op], list_path: str, existing: Any, items: list[Any]) -> None:
    """Append ``items`` to the list at ``list_path``, creating it when ``existing`` is not a list.

    A missing list gets one ``add`` holding all items (smaller patch, and no ``/-`` into nothing);
    an existing one gets an ``add …/-`` per item so concurrent content is kept.
    """
    if not items:
        return
    if isinstance(existing, list):
        append_path = f"{list_path}/-"
        for item in items:
            ops.append({"op": "add", "path": append_path, "value": item})
    else:
        ops.append(add(list_path, list(items)))


def set_in_map(ops: list[Op], map_path: str, existing: Any, key: str, value: Any) -> None:
    """Set ``key`` in the map at ``map_path``, creating the map when ``existing`` is not a dict."""
    if isinstance(existing, dict):
        ops.append(add(f"{map_path}/{token(key)}", value))
    else:
        ops.append(add(map_path, {key: value}))
