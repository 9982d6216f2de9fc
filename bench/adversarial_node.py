"""The node side under attack, counted: hostile image roots through the real CDI hook under the real
runc, and hostile claims in one DRA prepare call.

    sudo .venv/bin/python bench/adversarial_node.py [--rounds 3] [--generated 500 --seed N] [--json]

**Roots.** Every hostile root of :mod:`tests.support.hostile_roots` (links from ``/etc``,
``/var/cache/ldconfig``, the cache and its temporary file into ``/proc/1/root<host dir>``, a
SONAME with a newline, ``ld.so.conf`` naming host paths, symlink loops, a 200,000-line
``ld.so.conf``, FIFOs, ``/dev`` and ``/sys`` as links) and a benign one, each made into a runc
bundle with the driver's root bound read-only and the hook as the CDI spec adds it, then
``runc create`` (which runs the hook) and ``runc delete``. After each, a host directory that every
root aims at, and the driver's directory, are compared file by file with their state before.
Figures: roots tried, containers created, refused by runc itself, host files created or changed,
host libraries that entered a cache, and ``runc create``'s time.

**Generated roots** (``--generated N``): N roots per host layout (Debian/RHEL, Ubuntu, a dynamic
``ldconfig``, none: :mod:`tests.support.host_layouts`), each drawn from its own seed by
:mod:`tests.support.hostile_generator` (links out by every way out of a root, FIFOs, sockets and
device nodes where ldconfig reads, hostile ``ld.so.conf`` files, huge, forged, deep and crowded
library directories, link loops), with the image's ``/bin/sh`` and program loader a payload that
records any run. Per layout: roots created, host files created or changed, host libraries
cached, runs of the image's code, ``runc create`` past the hook's bound plus 5 s, processes of the
hook left after ``runc create`` and after ``runc delete``, and ``runc create``'s time. A failing
root is printed with its seed.

**Claims.** The real ``ix-gpu dra`` app (fake backend, a stand-in API server) gets one
NodePrepareResources call with two good claims among hostile ones: an answer cut off mid-body, a
proxy's HTML page, an HTTP 500, JSON of the wrong shape, and JSON nested 100,000 levels deep.
Figures: good claims prepared, hostile ones failed alone (each with its reason), and the call's
time.

The stolen-token writes are tests on the real apiserver (tests/k8s, pod-bound tokens), not here.
Needs root (runc), the real nodes' runc (``tests/support/tier_runc.py``), gcc and the host's glibc
ldconfig. ``tests/plugin/test_adversarial_node_bench.py`` runs it at a small size in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BOUND_SLACK_S = 5
"""How long past the hook's bound on ldconfig ``runc create`` may take: runc's own work."""
sys.path.insert(0, str(REPO))

from ix_gpu.dra.api import dra_v1_pb2 as dra  # noqa: E402
from ix_gpu.node.devices.ldcache_hook import LDCONFIG_BOUND_S  # noqa: E402
from tests.dra.dra_testkit import claim, dra_client, result, running, settings  # noqa: E402
from tests.dra.fake_resource_api import RESOURCE, FakeResourceApi, serving  # noqa: E402
from tests.support.host_layouts import LAYOUTS, layer, payload_ran  # noqa: E402
from tests.support.hostile_generator import generate  # noqa: E402
from tests.support.hostile_roots import (  # noqa: E402
    HOSTILE,
    LIBRARY_DIR,
    RUNC_REFUSES,
    cached,
    host_target,
    make_bundle,
    regular,
    runc_driver_bundle,
    snapshot,
    timed_create,
)
from tests.support.paths import FAKE_DEVICES  # noqa: E402
from tests.support.tier_runc import bench_runc  # noqa: E402


def one_root(runc: str, work: Path, case: str, host: Path) -> dict[str, Any]:
    """``case`` ("benign" or a HOSTILE key) under runc; what it did."""
    bundle, driver = make_bundle(work), work / "driver"
    rootfs = bundle / "rootfs"
    runc_driver_bundle(bundle, driver, runc)
    if case != "benign":
        HOSTILE[case](rootfs, f"/proc/1/root{host}")
    before = snapshot(host), snapshot(driver)
    name = f"ix-gpu-adversarial-{os.getpid()}-{time.monotonic_ns()}"
    code, seconds, left = timed_create(runc, bundle, name, work / "runc.err")
    host_after, driver_after = snapshot(host), snapshot(driver)
    changed = sorted(set(host_after.items()) ^ set(before[0].items())) + sorted(
        set(driver_after.items()) ^ set(before[1].items())
    )
    served = not (rootfs / "etc").is_symlink() and regular(rootfs / "etc/ld.so.cache")
    entries = cached(rootfs) if served else {}
    return {
        "case": case,
        "created": code == 0,
        "refusedByRunc": code != 0 and case in RUNC_REFUSES,
        "hostFilesChanged": len(changed),
        "hostLibrariesCached": len([p for p in entries.values() if "libhost" in p or str(host) in p]),
        "driverCached": entries.get("libixml.so") == f"{LIBRARY_DIR}/libixml.so",
        "leftovers": len(left),
        "seconds": seconds,
    }


def roots(runc: str, rounds: int) -> dict[str, Any]:
    """Every root, ``rounds`` times, against one host directory."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="ix-gpu-adversarial-") as tmp:
        host = host_target(Path(tmp) / "host")
        for round_ in range(rounds):
            for case in ["benign", *sorted(HOSTILE)]:
                runs.append(one_root(runc, Path(tmp) / f"{round_}-{len(runs)}", case, host))
    times = sorted(r["seconds"] for r in runs)
    return {
        "rootsTried": len(runs),
        "hostileRootsTried": sum(r["case"] != "benign" for r in runs),
        "containersCreated": sum(r["created"] for r in runs),
        "refusedByRunc": sum(r["refusedByRunc"] for r in runs),
        "failedOtherwise": [r["case"] for r in runs if not r["created"] and not r["refusedByRunc"]],
        "hostFilesChanged": sum(r["hostFilesChanged"] for r in runs),
        "hostLibrariesCached": sum(r["hostLibrariesCached"] for r in runs),
        "benignFoundTheDriver": all(r["driverCached"] for r in runs if r["case"] == "benign"),
        "leftoverProcesses": sum(r["leftovers"] for r in runs),
        "runcCreateSecondsP50": statistics.median(times),
        "runcCreateSecondsMax": times[-1],
    }


def generated_root(runc: str, work: Path, seed: int, host: Path, layout: Path) -> dict[str, Any]:
    """One generated root (``seed``) under runc on host ``layout``; what it did."""
    bundle, driver = make_bundle(work), work / "driver"
    rootfs = bundle / "rootfs"
    runc_driver_bundle(bundle, driver, runc)
    features = generate(seed, str(host), work.parent, rootfs)
    before = snapshot(host), snapshot(driver)
    name = f"ix-gpu-generated-{os.getpid()}-{time.monotonic_ns()}"
    code, seconds, left = timed_create(runc, bundle, name, work / "runc.err", layout)
    host_after, driver_after = snapshot(host), snapshot(driver)
    changed = len(set(host_after.items()) ^ set(before[0].items())) + len(
        set(driver_after.items()) ^ set(before[1].items())
    )
    served = not (rootfs / "etc").is_symlink() and regular(rootfs / "etc/ld.so.cache")
    entries = cached(rootfs) if served else {}
    return {
        "seed": seed,
        "features": features,
        "created": code == 0,
        "hostFilesChanged": changed,
        "hostLibrariesCached": len([p for p in entries.values() if "libhost" in p or str(host) in p]),
        "imageCodeRun": len(payload_ran(rootfs)),
        "pastBound": seconds > LDCONFIG_BOUND_S + BOUND_SLACK_S,
        "leftovers": len(left),
        "seconds": seconds,
    }


def generated(runc: str, seed: int, count: int, layouts: tuple[str, ...] = LAYOUTS) -> dict[str, Any]:
    """``count`` generated roots per layout, root ``i`` of each layout from seed ``seed + i``."""
    figures: dict[str, Any] = {"seed": seed}
    with tempfile.TemporaryDirectory(prefix="ixgen") as tmp:
        work = Path(tmp)
        host = host_target(work / "host")
        for name in layouts:
            runs = []
            for index in range(count):
                root_work = work / f"{name}-{index}"
                try:
                    runs.append(generated_root(runc, root_work, seed + index, host, layer(name, work)))
                finally:
                    shutil.rmtree(root_work, ignore_errors=True)
            figures[name] = summary(runs)
    return figures


def healthy(run: dict[str, Any]) -> bool:
    """Created, nothing of the host touched, no image code run, within the bound, nothing left
    running."""
    harms = ("hostFilesChanged", "hostLibrariesCached", "imageCodeRun", "pastBound", "leftovers")
    return run["created"] and not any(run[key] for key in harms)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    times = sorted(r["seconds"] for r in runs)
    bad = [r for r in runs if not healthy(r)]
    return {
        "rootsTried": len(runs),
        "containersCreated": sum(r["created"] for r in runs),
        "hostFilesChanged": sum(r["hostFilesChanged"] for r in runs),
        "hostLibrariesCached": sum(r["hostLibrariesCached"] for r in runs),
        "imageCodeRun": sum(r["imageCodeRun"] for r in runs),
        "pastBound": sum(r["pastBound"] for r in runs),
        "leftoverProcesses": sum(r["leftovers"] for r in runs),
        "killedAtBound": sum(r["seconds"] > LDCONFIG_BOUND_S for r in runs),
        "runcCreateSecondsP50": statistics.median(times),
        "runcCreateSecondsP99": times[min(len(times) - 1, int(len(times) * 0.99))],
        "runcCreateSecondsMax": times[-1],
        "failing": [{"seed": r["seed"], "features": r["features"]} for r in bad],
    }


HOSTILE_CLAIMS = ("cut", "junk", "500", "shape", "deep")
"""What a hostile or broken path to the API server can make a claim's read return."""


def claims(work: Path) -> dict[str, Any]:
    """One prepare call: two good claims and each of HOSTILE_CLAIMS."""
    fake = FakeResourceApi()
    fake.add_node("node1", labels={"ix-gpu.io/gpu.allocation": "dra"})
    fake.add_claim("default", "good-a", "uid-good-a", [result("gpu-0")])
    fake.add_claim("default", "good-b", "uid-good-b", [result("gpu-1")])
    for kind in HOSTILE_CLAIMS:
        stored = fake.add_claim("default", kind, f"uid-{kind}", [result("gpu-2")])
        if kind == "shape":
            stored["status"]["allocation"]["devices"] = "gpu-2"
        else:
            fake.faults[f"{RESOURCE}/namespaces/default/resourceclaims/{kind}"] = kind
    names = ["good-a", "good-b", *HOSTILE_CLAIMS]
    devices = work / "devices.yaml"
    shutil.copyfile(FAKE_DEVICES, devices)
    config = settings(work)

    async def call() -> tuple[dra.NodePrepareResourcesResponse, float]:
        with serving(fake) as api:
            async with running(config, devices, api), dra_client(config) as client:
                request = dra.NodePrepareResourcesRequest(claims=[claim(f"uid-{n}", n) for n in names])
                started = time.monotonic()
                answer = await client.NodePrepareResources(request)
                return answer, time.monotonic() - started

    answer, seconds = asyncio.run(call())
    errors = {n: answer.claims[f"uid-{n}"].error for n in names}
    return {
        "claims": len(names),
        "goodPrepared": sum(not errors[n] and bool(answer.claims[f"uid-{n}"].devices) for n in names[:2]),
        "hostileFailedAlone": sum(bool(errors[n]) for n in HOSTILE_CLAIMS),
        "reasons": {n: errors[n].rpartition("(reason: ")[2].rstrip(")") for n in HOSTILE_CLAIMS},
        "callSeconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="times each root is tried (default 3)")
    parser.add_argument(
        "--generated",
        type=int,
        default=0,
        metavar="N",
        help="also N generated roots per host layout (default 0)",
    )
    parser.add_argument("--seed", type=int, default=1, help="the generated roots' first seed (default 1)")
    parser.add_argument("--only-generated", action="store_true", help="skip the named roots and the claims")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    runc = bench_runc("adversarial_node")  # the real nodes' runc
    if runc is None:
        return 2
    figures: dict[str, Any] = {}
    if not args.only_generated:
        with tempfile.TemporaryDirectory(prefix="ixadv") as tmp:
            figures = {"roots": roots(runc, args.rounds), "claims": claims(Path(tmp))}
    if args.generated:
        figures["generated"] = generated(runc, args.seed, args.generated)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for section, values in figures.items():
            print(f"{section}:")
            for key, value in values.items():
                print(f"  {key}: {value:.3f}" if isinstance(value, float) else f"  {key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
