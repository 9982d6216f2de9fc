"""Sizes in ``ix_gpu``: no hand-written module over 450 lines, no function over 80.

A module or function past its bound is usually two ideas in one, and the next engineer has to read
both to change either. The few that are over today are listed with their size now: each may
shrink (and then its entry must follow, so the list stays true) but not grow, and nothing new may
join them. Generated gRPC and protobuf modules (``ix_gpu/*/api/``) are not hand-written."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "ix_gpu"
MODULE_LINES = 450
FUNCTION_LINES = 80

OVER_TODAY = {
    "webhook/service/http_protocol.py:guarded_protocol": 248,
}
"""What is over its bound today, and by how much: only ever shorter."""


def _hand_written() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "api" not in p.relative_to(ROOT).parts[:-1])


def _sizes() -> dict[str, int]:
    """Every module's and every function's length in lines, keyed as :data:`OVER_TODAY` is."""
    sizes: dict[str, int] = {}
    for path in _hand_written():
        name = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        sizes[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                key = f"{name}:{node.name}"
                sizes[key] = max(sizes.get(key, 0), node.end_lineno - node.lineno + 1)
    return sizes


def _bound(key: str) -> int:
    return FUNCTION_LINES if ":" in key else MODULE_LINES


def test_no_module_or_function_grows_past_its_bound() -> None:
    over = {key: size for key, size in _sizes().items() if size > _bound(key)}
    new = {key: size for key, size in over.items() if key not in OVER_TODAY}
    assert not new, f"over {MODULE_LINES} lines (module) or {FUNCTION_LINES} (function): {new}"
    grown = {key: (OVER_TODAY[key], size) for key, size in over.items() if size > OVER_TODAY[key]}
    assert not grown, f"grew past their recorded size (was, now): {grown}"


def test_the_list_of_what_is_over_stays_true() -> None:
    """An entry whose module or function shrank, or went under its bound, must be updated or
    removed: the list says what is left to split, not what once was."""
    sizes = _sizes()
    stale = {key: (size, sizes.get(key)) for key, size in OVER_TODAY.items() if sizes.get(key) != size}
    assert not stale, f"OVER_TODAY is out of date (recorded, now): {stale}"


def test_the_walk_sees_the_modules_it_bounds() -> None:
    """The bound would pass vacuously over an empty walk: it sees the package's modules, and
    leaves out only the generated API stubs."""
    walked = {p.relative_to(ROOT).as_posix() for p in _hand_written()}
    assert {"cli.py", "webhook/core/mutation.py", "dra/cli.py"} <= walked
    assert not any("_pb2" in name for name in walked)
    assert len(walked) > 100
