"""Scheduler time per DRA claim, as kube-scheduler's own metrics report it, for the pools ``ix-gpu
dra`` publishes: plain per-chip slices against partitionable boards (each board and its chips,
with counter sets), shared chips (memory shares) and both at once, on the same run.

    .venv/bin/python bench/dra_scheduler_bench.py [--nodes 10] [--pods 20] [--rounds 2] [--json]
        [--versions v1.37.2,v1.38.0-beta.0 [--repeat 2]] [--profile DIR [--profile-seconds 20]]

A real etcd, kube-apiserver and kube-scheduler of one Kubernetes version on loopback (tests/k8s's
helpers; binaries from the tests/k8s/build.sh cache, or ``IX_GPU_K8S_BIN`` for v1.37.2). The
version is v1.37.2 unless ``--versions`` names others: each is built first (build.sh, a pre-release
such as v1.38.0-beta.0 too), then the whole run (fresh etcd, apiserver, scheduler and nodes) is
done once per version in turn, ``--repeat`` times (v1.37.2, v1.38.0-beta.0, v1.37.2, ...), and the
runs are printed side by side at the end. Nodes are API objects only, ``--nodes``
per layout, each of two BI-V150 boards (four chips); their slices are written by the driver's code
(tests/k8s/dra_pools.py), the DeviceClasses are the chart's. Every pod has its own ResourceClaim
for one device of ``gpu.iluvatar.com`` (the default form: a chip) and a node selector for its
layout; a warm-up phase on the plain nodes comes first. Then, ``--rounds`` times, one phase per
layout in turn: ``--pods`` pods created at once, waited for until all are bound.

Per phase, the difference of ``scheduler_scheduling_attempt_duration_seconds`` (result
``scheduled``; sum over count) before and after is the scheduler's time per pod, and with one
claim per pod, per claim; ``scheduler_framework_extension_point_duration_seconds`` splits it
by extension point (PreFilter, Filter, Score, Reserve, PreBind; all plugins of each, of which the
DynamicResources plugin's allocation is the Filter's bulk for these pods), to show where a layout's
extra time goes. The target: partitionable and shared within 1.2x of plain. Each run's header names
the scheduler's version as its own ``kubernetes_build_info`` metric reports it. ``--profile DIR``
adds one phase per layout under kube-scheduler's CPU profile (``bench/scheduler_profile.py``), to
say in which functions a layout's extra time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import ssl
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench.scheduler_profile import profiled, top  # noqa: E402
from tests.k8s.dra_pools import (  # noqa: E402
    RESOURCE_API,
    chips,
    claim_pod,
    create_device_classes,
    create_node,
    publish_pool,
)
from tests.k8s.k8s_tier import (  # noqa: E402
    CURRENT_K8S_VERSION,
    K8sBinaries,
    KubeAPI,
    build_binaries,
    start_etcd,
    start_kube_apiserver,
    start_kube_scheduler,
)
from tests.support.net import free_port  # noqa: E402

LAYOUTS: dict[str, dict[str, Any]] = {
    "plain": {"splitboard": True},
    "partitionable": {"splitboard": True, "partitionable": True},
    "shared": {"splitboard": True, "shares": 4},
    "part-shared": {"splitboard": True, "partitionable": True, "shares": 4},
}
ATTEMPTS = "scheduler_scheduling_attempt_duration_seconds"
EXTENSION_POINTS = "scheduler_framework_extension_point_duration_seconds"
POINTS = ("PreFilter", "Filter", "Score", "Reserve", "PreBind")
TARGET = 1.2


def scrape(url: str, token: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The scheduler's /metrics (its serving cert is self-signed), samples by name and labels."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        v for (n, ls), v in samples.items() if n == name and all((k, v2) in ls for k, v2 in labels.items())
    )


def phase(
    api: KubeAPI, namespace: str, layout: str, count: int, first: int, metrics: Any
) -> dict[str, float]:
    """``count`` pods for ``layout``'s nodes, created at once; the scheduler's figures for them."""
    before = metrics()
    start = time.monotonic()
    claims = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims"
    names = [f"{layout}-{first + i:04d}" for i in range(count)]
    for name in names:
        claim = {
            "metadata": {"name": name},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.iluvatar.com"}}]}
            },
        }
        status, reply = api.request("POST", claims, claim)
        assert status == 201, reply
        status, reply = api.request(
            "POST", f"/api/v1/namespaces/{namespace}/pods", claim_pod(name, {"layout": layout})
        )
        assert status == 201, reply
    deadline = start + 300
    while True:
        status, listed = api.request("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector=")
        bound = {p["metadata"]["name"] for p in listed["items"] if p["spec"].get("nodeName")}
        if set(names) <= bound:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{layout}: {len(set(names) - bound)} pods not bound after 300 s")
        time.sleep(0.2)
    wall = time.monotonic() - start
    time.sleep(1)  # the last attempt's observation
    after = metrics()

    def delta(name: str, suffix: str, **labels: str) -> float:
        return total(after, name + suffix, **labels) - total(before, name + suffix, **labels)

    attempts = delta(ATTEMPTS, "_count", result="scheduled")
    seconds = delta(ATTEMPTS, "_sum", result="scheduled")
    return {
        "pods": count,
        "attempts": attempts,
        "ms_per_claim": 1000 * seconds / attempts if attempts else float("nan"),
        "wall_s": wall,
        **{
            f"{point}_ms": 1000 * delta(EXTENSION_POINTS, "_sum", extension_point=point) / attempts
            if attempts
            else float("nan")
            for point in POINTS
        },
    }


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def run(
    binaries: K8sBinaries, args: argparse.Namespace, warmup: int, tag: str = ""
) -> tuple[str, dict[str, float]]:
    """One whole run on ``binaries``: the scheduler's reported version and the figures; with
    ``args.profile``, then one more phase per layout under a CPU profile (``<tag>-<layout>.pprof``)."""
    work = Path(tempfile.mkdtemp(prefix="ixdrasched"))
    logs = work / "logs"
    logs.mkdir()
    etcd = start_etcd(binaries, logs)
    results: dict[str, list[dict[str, float]]] = {layout: [] for layout in LAYOUTS}
    version = "?"
    try:
        api = start_kube_apiserver(binaries, etcd, work / "apiserver", logs)
        try:
            create_device_classes(api)
            for layout, spec in LAYOUTS.items():
                for i in range(args.nodes):
                    name = f"{layout}-{i:03d}"
                    create_node(api, name, {"layout": layout})
                    publish_pool(api, name, chips(name, "Iluvatar BI-V150", 2), **spec)
            port = free_port()
            scheduler = start_kube_scheduler(
                binaries,
                api.kubeconfig,
                work,
                logs,
                ("--kube-api-qps=500", "--kube-api-burst=1000"),
                port=port,
            )
            try:
                namespace = f"bench-{secrets.token_hex(3)}"
                status, reply = api.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
                assert status == 201, reply
                url = f"https://127.0.0.1:{port}/metrics"

                def metrics() -> Samples:
                    return scrape(url, api.token)

                version = next(
                    (
                        dict(labels).get("git_version", "?")
                        for (n, labels) in metrics()
                        if n == "kubernetes_build_info"
                    ),
                    "?",
                )
                phase(api, namespace, "plain", warmup, 9000, metrics)
                if args.background_shares:
                    phase(api, namespace, "shared", args.background_shares, 10000, metrics)
                for r in range(args.rounds):
                    for layout in LAYOUTS:
                        results[layout].append(
                            phase(api, namespace, layout, args.pods, r * args.pods, metrics)
                        )
                if args.profile:
                    for layout in LAYOUTS:
                        first = args.rounds * args.pods

                        def one(layout: str = layout, first: int = first) -> None:
                            phase(api, namespace, layout, args.pods, first, metrics)

                        out = Path(args.profile) / f"{tag}-{layout}.pprof"
                        profiled(url.removesuffix("/metrics"), api.token, args.profile_seconds, out, one)
            finally:
                scheduler.stop()
        finally:
            api.stop()
    finally:
        etcd.stop()
        shutil.rmtree(work, ignore_errors=True)
    figures: dict[str, float] = {}
    for layout, phases in results.items():
        attempts = sum(p["attempts"] for p in phases)
        figures[f"{layout}_ms_per_claim"] = sum(p["ms_per_claim"] * p["attempts"] for p in phases) / attempts
        figures[f"{layout}_wall_s_per_phase"] = sum(p["wall_s"] for p in phases) / len(phases)
        for point in POINTS:
            figures[f"{layout}_{point}_ms_per_claim"] = (
                sum(p[f"{point}_ms"] * p["attempts"] for p in phases) / attempts
            )
    for layout in [name for name in LAYOUTS if name != "plain"]:
        figures[f"{layout}_vs_plain"] = figures[f"{layout}_ms_per_claim"] / figures["plain_ms_per_claim"]
    return version, figures


def print_run(args: argparse.Namespace, version: str, figures: dict[str, float], wall_s: float) -> None:
    load = os.getloadavg()[0]
    print(
        f"kube-scheduler {version}, {args.nodes} nodes per layout (2 BI-V150 boards each), {args.rounds} "
        f"phases per layout of {args.pods} pods, one claim each; {args.background_shares} shares held "
        f"beforehand; load average {load:.2f}; run {wall_s:.0f} s with setup"
    )
    print(f"  {'layout':<14} {'ms per claim':>12} {'wall s/phase':>12} {'vs plain':>9}  target")
    rows = []
    for layout in LAYOUTS:
        ratio = figures.get(f"{layout}_vs_plain")
        verdict = "" if ratio is None else ("ok" if ratio <= TARGET else "MISSED")
        per_claim, wall = figures[f"{layout}_ms_per_claim"], figures[f"{layout}_wall_s_per_phase"]
        against = "" if ratio is None else f"{ratio:.2f}x"
        target = "" if ratio is None else f"<= {TARGET}x {verdict}"
        print(f"  {layout:<14} {per_claim:>12.2f} {wall:>12.2f} {against:>9}  {target}")
        by_point = (figures[f"{layout}_{point}_ms_per_claim"] for point in POINTS)
        rows.append(f"  {layout:<14}" + "".join(f"{ms:>10.2f}" for ms in by_point))
    print("  ms per claim by extension point (every plugin of each):")
    print(f"  {'':<14}" + "".join(f"{point:>10}" for point in POINTS))
    print("\n".join(rows), flush=True)


def print_profiles(where: Path, tag: str) -> None:
    """Each layout's profiled phase against plain's, the claim's scheduling functions only."""
    plain = where / f"{tag}-plain.pprof"
    print(f"  CPU profile, plain ({plain}), by cumulative time:")
    print(top(plain))
    for layout in [name for name in LAYOUTS if name != "plain"]:
        profile = where / f"{tag}-{layout}.pprof"
        print(f"  CPU profile, {layout} less plain ({profile}):")
        print(top(profile, base=plain))


def print_side_by_side(runs: list[dict[str, Any]]) -> None:
    """Every run's figures in one table, a column per run (in the order they ran)."""
    heads = [f"{r['k8s_version']} #{r['repeat']}" for r in runs]
    width = max(18, *(len(h) + 2 for h in heads))
    print("side by side, ms per claim (x plain); then each layout's ms per claim by extension point:")
    print(f"  {'':<24}" + "".join(f"{h:>{width}}" for h in heads))
    for layout in LAYOUTS:
        cells = []
        for r in runs:
            ratio = r.get(f"{layout}_vs_plain")
            cell = f"{r[f'{layout}_ms_per_claim']:.2f}" + ("" if ratio is None else f" ({ratio:.2f}x)")
            cells.append(f"{cell:>{width}}")
        print(f"  {layout:<24}" + "".join(cells))
    for point in POINTS:
        for layout in LAYOUTS:
            label = f"{point} {layout}"
            print(
                f"  {label:<24}" + "".join(f"{r[f'{layout}_{point}_ms_per_claim']:>{width}.2f}" for r in runs)
            )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", type=int, default=10, metavar="N", help="nodes per layout (default 10)")
    parser.add_argument("--pods", type=int, default=16, metavar="P", help="pods per phase (default 16)")
    parser.add_argument("--rounds", type=int, default=2, metavar="R", help="phases per layout (default 2)")
    parser.add_argument(
        "--background-shares",
        type=int,
        default=0,
        metavar="S",
        help="claims holding one memory share each, placed on the shared nodes before the measured "
        "phases (the allocator checks every share in use when it counts a pool's counters; default 0)",
    )
    parser.add_argument(
        "--versions",
        default=CURRENT_K8S_VERSION,
        metavar="V[,V...]",
        help=f"Kubernetes versions of the apiserver and scheduler, run in turn "
        f"(default {CURRENT_K8S_VERSION})",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, metavar="K", help="runs of each version, interleaved (default 1)"
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="after the measured rounds, one more phase per layout under kube-scheduler's CPU "
        "profile, written to DIR/<version>-<repeat>-<layout>.pprof, and each layout's profile "
        "printed against plain's (go tool pprof -top -diff_base)",
    )
    parser.add_argument(
        "--profile-seconds", type=int, default=20, metavar="S", help="each profile's window (default 20)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args()
    warmup = 8
    if args.nodes < 1 or args.pods < 1 or args.rounds < 1 or args.repeat < 1:
        parser.error("--nodes, --pods, --rounds and --repeat must be at least 1")
    phases = args.rounds + (1 if args.profile else 0)
    if args.pods * phases + warmup > args.nodes * 4:
        parser.error(
            f"--pods x --rounds (+1 with --profile) + {warmup} (warm-up) must fit in --nodes x 4 chips"
        )
    if args.background_shares < 0 or args.background_shares + args.pods * phases > args.nodes * 16:
        parser.error("--background-shares plus the shared phases' pods must fit in --nodes x 16 shares")
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    if not versions:
        parser.error("--versions names no version")
    built = {
        version: build_binaries(version, targets=("kube-apiserver", "kube-scheduler")) for version in versions
    }
    runs: list[dict[str, Any]] = []
    for repeat in range(1, args.repeat + 1):
        for version in versions:
            start = time.monotonic()
            tag = f"{version}-{repeat}"
            reported, figures = run(built[version], args, warmup, tag)
            wall_s = time.monotonic() - start
            runs.append(
                {
                    "k8s_version": version,
                    "scheduler_version": reported,
                    "repeat": repeat,
                    "run_wall_s": wall_s,
                    "load_average": os.getloadavg()[0],
                    **figures,
                }
            )
            if not args.json:
                print_run(args, reported, figures, wall_s)
                if args.profile:
                    print_profiles(Path(args.profile), tag)
    if args.json:
        common = {
            "nodes_per_layout": args.nodes,
            "pods_per_phase": args.pods,
            "rounds": args.rounds,
            "background_shares": args.background_shares,
        }
        if len(runs) == 1:
            print(json.dumps({**common, **runs[0]}, indent=2))
        else:
            print(json.dumps({**common, "runs": runs}, indent=2))
        return 0
    if len(runs) > 1:
        print_side_by_side(runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
