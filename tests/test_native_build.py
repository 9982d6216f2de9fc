"""The webhook's native build (setup.py, ``IX_GPU_COMPILE=1``): what it compiles, and that each run
of the suite knows which build it tests."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

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


def test_the_node_agents_load_only_the_small_library() -> None:
    """The plugin and DRA import the connection slots and the log line, never the webhook's core:
    they map ``native_shared`` alone (about 1.5 MiB of RSS less than the webhook's library)."""
    probe = (
        "import sys, ix_gpu.plugin.startup, ix_gpu.plugin.server.app, ix_gpu.dra.cli, "
        "ix_gpu.serving.agent_http; "
        "print(sorted(m for m in sys.modules if m.endswith('__mypyc')))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    loaded = ast.literal_eval(done.stdout.strip())
    compiled = os.environ.get("IX_GPU_EXPECT_COMPILED") == "1"
    assert loaded == (["ix_gpu.native_shared__mypyc"] if compiled else []), loaded
