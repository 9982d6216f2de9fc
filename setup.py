"""Optional native build of the webhook's request path with mypyc.

Everything is declared in pyproject.toml; this file only adds extension modules, and only when
``IX_GPU_COMPILE=1``. Then the modules listed under ``[tool.ix-gpu] compiled`` (the mutation core,
the AdmissionReview parse and answer, the handler, the exchange, the metrics) and ``compiled-shared``
(the log line and the connection slots, which the node agents import too) are compiled from the
same typed sources by mypyc, into C extensions that Python imports in place of the ``.py`` files.
Same code, same tests; a 2 KB review costs 0.66-0.96x the CPU of pure Python (docs/benchmarks.md;
why mypyc: docs/design.md). Without the variable the package is pure Python and behaves the same.

The compile type-checks with the project's mypy settings, so mypy and every runtime dependency must
be importable: build without isolation, after the dependencies are installed (as the Dockerfile does)::

    pip install -c constraints.txt . mypy types-PyYAML setuptools
    IX_GPU_COMPILE=1 pip install --no-build-isolation --no-deps --force-reinstall .
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def compiled_groups() -> tuple[list[str], list[str]]:
    """The source files to compile, from pyproject.toml (tests read the same lists): the webhook's
    own, and those the node agents import too."""
    with open(HERE / "pyproject.toml", "rb") as file:
        table = tomllib.load(file)["tool"]["ix-gpu"]
    return [str(path) for path in table["compiled"]], [str(path) for path in table["compiled-shared"]]


def extensions() -> list[object]:
    if os.environ.get("IX_GPU_COMPILE", "") != "1":
        return []
    if {"egg_info", "dist_info", "sdist"} & set(sys.argv[1:]):
        return []  # metadata or sources only: mypyc would type-check and write C for nothing
    try:
        from mypyc.build import mypycify
    except ImportError:
        sys.exit("IX_GPU_COMPILE=1 needs mypy (mypyc) installed beside the build: pip install mypy")
    # Two shared libraries inside the package (ix_gpu/native__mypyc…so for the webhook,
    # ix_gpu/native_shared__mypyc…so for what the node agents load too), so the wheel still holds one
    # top-level name and an agent maps only the small one.
    webhook, shared = compiled_groups()
    groups = [(webhook, "ix_gpu.native"), (shared, "ix_gpu.native_shared")]
    return list(mypycify(webhook + shared, opt_level="3", separate=groups))


setup(ext_modules=extensions())
