"""The webhook's native build (setup.py, ``IX_GPU_COMPILE=1``): what it compiles, and that each run
of the suite knows which build it tests."""

from __future__ import annotations

import os

from tests.support.compiled import compiled_sources, not_compiled
from tests.support.paths import ROOT

REQUEST_PATH = {
    "ix_gpu/webhook/core/mutation.py",
    "ix_gpu/webhook/service/admission_review.py",
    "ix_gpu/webhook/service/admission_handler.py",
    "ix_gpu/webhook/service/mutate_exchange.py",
}


def test_the_compiled_list_names_existing_modules_of_the_request_path() -> None:
    sources = compiled_sources()
    assert len(sources) == len(set(sources))
    assert set(sources) >= REQUEST_PATH
    for source in sources:
        assert source.startswith("ix_gpu/") and (ROOT / source).is_file(), source
        # mypyc gives a package compiled into a group inside the package a wrong __path__ (one
        # ix_gpu/ too many), so its submodules would not import.
        assert not source.endswith("__init__.py"), source


def test_this_run_tests_the_build_it_says() -> None:
    """Pure Python in the ordinary run; every listed module native in the run scripts/test.sh makes
    on build/native-tree (conftest.py refuses to start that run otherwise)."""
    compiled = os.environ.get("IX_GPU_EXPECT_COMPILED") == "1"
    missing = not_compiled()
    if compiled:
        assert missing == []
    else:
        assert len(missing) == len(compiled_sources())
