"""The webhook arms side by side (``bench/scale.py --webhook none,go,ix-gpu --rounds N``): the
same burst on the same cluster size once per arm per round, interleaved, each run on a fresh
cluster as ``burst.run`` makes one, so load that drifts on a shared machine falls on every arm
alike. The order turns by one arm each round (none, go, ix-gpu; go, ix-gpu, none; ix-gpu, none,
go; ...), so that over as many rounds as arms each arm runs once in each place, and none always
follows the same one's teardown. Before each burst the machine is let settle
(``host_quiet.settle``, up to ``settle_max_s``), and how busy it was when the burst began is
reported beside the figures. What each arm is: ``burst_arms.py``.

Per arm, the median over its rounds of: pod create p50/p99 as the client saw it; admission p50/p99
as the apiserver measured it (``apiserver_admission_webhook_admission_duration_seconds``, the
burst's difference; "—" for none, which calls no webhook); startup p50/p99 (create to Running, by
watch); the scheduler's own pod scheduling SLI p99 (``scheduler_pod_scheduling_sli_duration_seconds``,
the burst's difference); and pods stored per second. Ratios ix-gpu/none and go/none of create
p99 and startup p99, of those medians. And the checks of each run: GPU pods stored without the
injection (0; for none, pods lacking a pre-applied field), opted-out pods injected (0; not checked
for go, whose webhook reads no namespace), with the machine's 1-minute load average at the run's
start and end, the settling wait and the CPUs' busy share when the burst began (what else ran
beside it on a shared machine), and how the burst's webhook CPU and its reviews fell on each
replica.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.k8s.burst_arms import ARMS

FIGURES = (
    ("create p50 ms", "create_p50_ms"),
    ("create p99 ms", "create_p99_ms"),
    ("admission p50 ms", "admission_p50_ms"),
    ("admission p99 ms", "admission_p99_ms"),
    ("startup p50 ms", "startup_p50_ms"),
    ("startup p99 ms", "startup_p99_ms"),
    ("scheduling SLI p99 ms", "scheduling_sli_p99_ms"),
    ("pods stored /s", "stored_rate"),
)
RATIOS = ("create_p99_ms", "startup_p99_ms")
CHECKS = (
    "loadavg_1m",
    "settle_s",
    "busy_at_start",
    "pods_created",
    "running",
    "gpu_pods_unmutated",
    "opted_out_pods_mutated",
    "preapplied_pods_lacking",
    "webhook_cpu_s_by_replica",
    "webhook_reviews_by_replica",
    "webhook_cpu_wait_ms_per_review",
    "webhook_cpu_wait_s_by_replica",
    "webhook_tcp_by_replica",
    "webhook_cpu_throttled_by_replica",
    "control_plane_by_process",
    "node_cpu_shares",
    "watch_restarts",
    "watch_relists",
    "running_seen_late_p99_s",
)


def parse_arms(text: str) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if not arms or unknown or len(set(arms)) != len(arms):
        raise ValueError(f"--webhook {text!r}: a comma list of distinct arms of {', '.join(ARMS)}")
    return arms


def arm_order(arms: list[str], round_: int) -> list[str]:
    """The arms of round ``round_`` (from 1): ``arms`` turned left by ``round_ - 1``."""
    turn = (round_ - 1) % len(arms)
    return arms[turn:] + arms[:turn]


def run_arms(
    work: Path, arms: list[str], rounds: int, run: Callable[..., dict[str, Any]], **burst: Any
) -> dict[str, Any]:
    """``rounds`` rounds of every arm, in :func:`arm_order`, each
    ``run(work/<round>-<arm>, arm=..., **burst)`` (``burst.run``); the runs and their summary."""
    runs = []
    for round_ in range(1, rounds + 1):
        for arm in arm_order(arms, round_):
            where = work / f"{round_}-{arm}"
            where.mkdir()
            load_before = os.getloadavg()[0]
            result = run(where, arm=arm, **burst)
            result["round"] = round_
            # The machine's 1-minute load average at the run's start and end: on a shared machine,
            # what else ran beside it.
            result["loadavg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
            runs.append(result)
    return {"arms": arms, "rounds": rounds, "summary": summarise(runs, arms), "runs": runs}


def _median(values: list[Any]) -> float | None:
    numbers = [v for v in values if isinstance(v, int | float)]
    return round(statistics.median(numbers), 1) if numbers else None


def summarise(runs: list[dict[str, Any]], arms: list[str]) -> dict[str, Any]:
    """Each arm's medians over its rounds (and each round's value), its checks, and the ratios."""
    summary: dict[str, Any] = {}
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        figures = {key: _median([r.get(key) for r in mine]) for _, key in FIGURES}
        summary[arm] = {
            **figures,
            "per_round": {key: [r.get(key) for r in mine] for _, key in FIGURES},
            "checks": [{k: r.get(k) for k in CHECKS if k in r} for r in mine],
        }
        if arm == "go":
            summary[arm]["opt_out_check"] = "skipped: the Go webhook reads no namespace"
    ratios: dict[str, float | None] = {}
    for arm in ("ix-gpu", "go"):
        for key in RATIOS:
            if arm in summary and "none" in summary:
                top, bottom = summary[arm][key], summary["none"][key]
                ratios[f"{arm}/none {key}"] = round(top / bottom, 2) if top and bottom else None
    summary["ratios"] = ratios
    return summary


def _cell(value: Any) -> str:
    return "—" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def table(result: dict[str, Any]) -> str:
    """The summary as a side-by-side text table, then the ratios and each run's checks."""
    arms, summary = result["arms"], result["summary"]
    width = max(len(label) for label, _ in FIGURES)
    lines = [f"median of {result['rounds']} round(s) of {', '.join(arms)}, the order turned each round"]
    lines.append(" " * width + "".join(f"{arm:>12}" for arm in arms))
    for label, key in FIGURES:
        lines.append(f"{label:<{width}}" + "".join(f"{_cell(summary[arm][key]):>12}" for arm in arms))
    lines += [f"{name}: {_cell(value)}" for name, value in summary["ratios"].items()]
    for run in result["runs"]:
        checks = {k: run.get(k) for k in CHECKS if k in run}
        if run["arm"] == "go":
            checks["opted_out_pods_mutated"] = "not checked (the Go webhook honours no opt-out)"
        lines.append(f"round {run['round']} {run['arm']}: {checks}")
    return "\n".join(lines)
