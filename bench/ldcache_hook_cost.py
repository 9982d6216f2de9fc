"""What the linker-cache hook costs a container's creation: ``runc create`` of a benign root with the
hook of this checkout against the hook of an earlier revision, side by side.

    sudo .venv/bin/python bench/ldcache_hook_cost.py [--baseline 227df58] [--runs 200] [--json]

Each run makes a fresh bundle (the benign root of :mod:`tests.support.hostile_roots`, the driver's
root bound read-only, the hook as the CDI spec adds it), times ``runc create`` alone (the hook runs
inside it), then ``runc delete``. The two hooks alternate run by run, so a machine that gets slower
or faster over the measurement slows or speeds both alike. A third arm has no hook at all: what runc
costs without us. Figures: p50, p90 and mean per arm, in milliseconds, and each hook's p50 over the
baseline's.

The baseline's hook is read with ``git show <rev>:ix_gpu/node/devices/ldcache_hook.py`` and loaded
as a module of its own; nothing of the checkout changes. Needs root, the real nodes' runc
(``tests/support/tier_runc.py``), gcc and a static glibc ldconfig.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ix_gpu.node.devices.ldcache_hook import ldcache_hook  # noqa: E402
from tests.support.hostile_roots import (  # noqa: E402
    LIBRARY_DIR,
    cached,
    make_bundle,
    runc_driver_bundle,
    set_hook,
    timed_create,
)
from tests.support.tier_runc import bench_runc  # noqa: E402

Hook = Callable[[list[str]], dict[str, Any]]


def hook_at(revision: str) -> Hook:
    """The ``ldcache_hook`` function of ``revision``, loaded from git without touching the checkout."""
    source = subprocess.run(
        ["git", "show", f"{revision}:ix_gpu/node/devices/ldcache_hook.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType(f"ldcache_hook_{revision}")
    exec(compile(source, f"{revision}:ldcache_hook.py", "exec"), module.__dict__)
    found: Hook = module.ldcache_hook
    return found


def one_run(runc: str, work: Path, hook: Hook | None) -> float:
    """Seconds of one ``runc create`` of a fresh benign bundle whose spec carries ``hook``."""
    bundle = make_bundle(work)
    runc_driver_bundle(bundle, work / "driver", runc)
    set_hook(bundle, None if hook is None else hook([LIBRARY_DIR]))
    name = f"ix-gpu-cost-{os.getpid()}-{time.monotonic_ns()}"
    code, seconds, _ = timed_create(runc, bundle, name, work / "runc.err")
    if code != 0:
        raise RuntimeError(f"runc create failed: {(work / 'runc.err').read_text()}")
    if hook is not None and cached(bundle / "rootfs").get("libixml.so") != f"{LIBRARY_DIR}/libixml.so":
        raise RuntimeError("the hook did not put the driver's library in the cache")
    return seconds


def figures(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "p50Ms": statistics.median(ordered) * 1000,
        "p90Ms": ordered[int(len(ordered) * 0.9)] * 1000,
        "meanMs": statistics.fmean(ordered) * 1000,
    }


def compare(runc: str, baseline: str, runs: int) -> dict[str, Any]:
    arms: dict[str, Hook | None] = {"current": ldcache_hook, baseline: hook_at(baseline), "no hook": None}
    times: dict[str, list[float]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory(prefix="ixcost") as tmp:
        for run in range(runs):
            for name, hook in arms.items():
                work = Path(tmp) / f"{run}-{len(times[name])}-{name.replace(' ', '-')}"
                times[name].append(one_run(runc, work, hook))
                shutil.rmtree(work, ignore_errors=True)
    result: dict[str, Any] = {"runs": runs, "baseline": baseline}
    result.update({name: figures(values) for name, values in times.items()})
    result["currentOverBaselineP50"] = result["current"]["p50Ms"] / result[baseline]["p50Ms"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="227df58", help="the revision to compare (default 227df58)")
    parser.add_argument("--runs", type=int, default=200, help="runs per arm (default 200)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    runc = bench_runc("ldcache_hook_cost")  # the real nodes' runc
    if runc is None:
        return 2
    result = compare(runc, args.baseline, args.runs)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
