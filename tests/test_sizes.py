"""Sizes in ``ix_gpu``: no hand-written module over 450 lines, no function over 80.

A module or function past its bound is usually two ideas in one, and the next engineer has to read
both to change either: split it by meaning (a class defined in a closure into a class and the
function that binds it; a long command into a table of commands), not by line count. Generated gRPC
and protobuf modules (``ix_gpu/*/api/``) are not hand-written."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "ix_gpu"
MODULE_LINES = 450
FUNCTION_LINES = 80


def _hand_written() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "api" not in p.relative_to(ROOT).parts[:-1])


def _sizes() -> dict[str, int]:
    """Every module's length in lines (keyed by its path under ix_gpu) and every function's
    (``path:name``)."""
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


def test_no_module_or_function_is_past_its_bound() -> None:
    over = {key: size for key, size in _sizes().items() if size > _bound(key)}
    assert not over, f"over {MODULE_LINES} lines (module) or {FUNCTION_LINES} (function): {over}"


def test_the_walk_measures_functions_and_modules() -> None:
    """The bound would check nothing if the walk missed what it measures."""
    sizes = _sizes()
    assert sizes["webhook/core/mutation.py"] > 100
    assert sizes["webhook/core/mutation.py:mutate"] > 10
    assert any(":" in key for key in sizes if key.startswith("webhook/service/http_protocol.py"))
