"""The webhook's native build: which modules mypyc compiles (pyproject.toml's ``[tool.ix-gpu]
compiled``, the list setup.py builds from) and whether this process imported them compiled.

scripts/test.sh runs the webhook's tests a second time on a copy of the tree built with
``IX_GPU_COMPILE=1`` and ``IX_GPU_EXPECT_COMPILED=1``; tests/conftest.py then refuses to start
unless every listed module loads from its extension, so that run cannot quietly test the pure
Python one again.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

from tests.support.paths import ROOT


def compiled_sources(root: Path = ROOT) -> list[str]:
    """Both groups: the webhook's own modules and those the node agents share."""
    with open(root / "pyproject.toml", "rb") as file:
        table = tomllib.load(file)["tool"]["ix-gpu"]
    return [*table["compiled"], *table["compiled-shared"]]


def module_name(source: str) -> str:
    return source.removesuffix(".py").replace("/", ".")


def not_compiled(root: Path = ROOT) -> list[str]:
    """The listed modules this interpreter loads from a ``.py`` file (empty: all are native)."""
    found = []
    for source in compiled_sources(root):
        module = importlib.import_module(module_name(source))
        if not str(module.__file__).endswith(".so"):
            found.append(f"{module.__name__} ({module.__file__})")
    return found
