"""``bench/adversarial_node.py`` at a small size, as CI runs it: every hostile root once under the
real runc, and one prepare call with every hostile claim. The figures it reports are asserted, so
the bench cannot rot into printing what nobody checks (docs/benchmarks.md has a full run's)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.hostile_roots import HOSTILE, RUNC_REFUSES
from tests.support.paths import ROOT


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("adversarial_node", ROOT / "bench/adversarial_node.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_hostile_root_changes_a_host_file_and_the_benign_one_finds_the_driver() -> None:
    if os.geteuid() != 0:
        pytest.skip("runc runs containers as root only; scripts/test.sh runs this as root (CI does)")
    runc = shutil.which("runc")
    assert runc, "runc is installed by tests/k8s/node-packages.sh, which scripts/test.sh runs as root"
    figures = bench().roots(runc, 1)
    print(figures)
    assert figures["hostileRootsTried"] == len(HOSTILE)
    assert figures["refusedByRunc"] == len(RUNC_REFUSES) and figures["failedOtherwise"] == []
    assert figures["containersCreated"] == figures["rootsTried"] - len(RUNC_REFUSES)
    assert figures["hostFilesChanged"] == 0 and figures["hostLibrariesCached"] == 0
    assert figures["benignFoundTheDriver"] is True


def test_each_hostile_claim_fails_alone_with_its_reason(short_tmp: Path) -> None:
    figures = bench().claims(short_tmp)
    print(figures)
    assert figures["goodPrepared"] == 2 and figures["hostileFailedAlone"] == len(figures["reasons"])
    assert figures["reasons"] == {
        "cut": "read",
        "junk": "parse",
        "500": "read",
        "shape": "parse",
        "deep": "parse",
    }
