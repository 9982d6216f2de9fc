"""``bench/adversarial_node.py`` at a small size, as CI runs it: every hostile root once under the
real runc, and one prepare call with every hostile claim. The figures it reports are asserted, so
the bench cannot rot into printing what nobody checks (docs/benchmarks.md has a full run's)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.adversarial import adversarial_seed
from tests.support.host_layouts import LAYOUTS
from tests.support.hostile_roots import HOSTILE, RUNC_REFUSES
from tests.support.paths import ROOT
from tests.support.tier_runc import tier_runc


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("adversarial_node", ROOT / "bench/adversarial_node.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_hostile_root_changes_a_host_file_and_the_benign_one_finds_the_driver() -> None:
    if os.geteuid() != 0:
        pytest.skip("runc runs containers as root only; scripts/test.sh runs this as root (CI does)")
    runc = tier_runc()  # the real nodes' runc
    figures = bench().roots(runc, 1)
    print(figures)
    assert figures["hostileRootsTried"] == len(HOSTILE)
    assert figures["refusedByRunc"] == len(RUNC_REFUSES) and figures["failedOtherwise"] == []
    assert figures["containersCreated"] == figures["rootsTried"] - len(RUNC_REFUSES)
    assert figures["hostFilesChanged"] == 0 and figures["hostLibrariesCached"] == 0
    assert figures["leftoverProcesses"] == 0
    assert figures["benignFoundTheDriver"] is True


GENERATED_PER_LAYOUT = 4
"""Generated roots per host layout in CI (the bench runs 500): a different slice per commit."""


def test_generated_roots_on_every_host_layout_harm_nothing() -> None:
    """Roots drawn from this commit's seed, on each host layout, under the real runc: no host file
    touched, no host library cached, no image code run, each within the hook's bound, nothing left
    running, and every one created."""
    if os.geteuid() != 0:
        pytest.skip("runc and the host layouts need root; scripts/test.sh runs this as root (CI does)")
    runc = tier_runc()  # the real nodes' runc
    seed, source = adversarial_seed()
    figures = bench().generated(runc, seed % 10**9, GENERATED_PER_LAYOUT)
    print(f"seed {seed % 10**9} ({source}):", figures)
    for layout in LAYOUTS:
        found = figures[layout]
        assert found["failing"] == [], (layout, found["failing"])
        assert found["rootsTried"] == GENERATED_PER_LAYOUT
        assert found["containersCreated"] == GENERATED_PER_LAYOUT
        harms = ("hostFilesChanged", "hostLibrariesCached", "imageCodeRun", "pastBound", "leftoverProcesses")
        assert {key: found[key] for key in harms} == dict.fromkeys(harms, 0), (layout, found)


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
