"""The adversarial load against ``ix-gpu webhook`` with and without the chart's CPU limit.

    sudo .venv/bin/python bench/cpu_limit.py [--cpus 1] [--reviews 20000] [--seed 12345]

Why: the chart limits the webhook to 1 CPU. Reviews over 64 KiB are parsed in a forked child while
the event loop goes on serving, so under load both run at once and the pod's CFS quota throttles
them together: the question is what that costs ``/healthz`` and the reviews. This runs the
adversarial corpus of ``tests/service/test_service_adversarial.py`` (hostile and careless reviews,
parallelism 8, ``/healthz`` probed every 50 ms from another process) twice against a fresh webhook:
unlimited, then moved into a cgroup whose CFS quota is ``--cpus`` CPUs (100 ms period), as the kubelet
does for a container limit. Prints, for each: review latency p50/p99/max, 503s, reviews over the
request budget, ``/healthz`` max/p99/p50, and the throttled periods and time.

Needs root and a writable cgroup v1 ``cpu`` hierarchy (``/sys/fs/cgroup/cpu``) or cgroup v2 with the
``cpu`` controller; says so and exits 1 otherwise. Not a test: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.service.test_service_adversarial import _send_all  # noqa: E402
from tests.support.adversarial import adversarial_config, build_corpus  # noqa: E402
from tests.support.monitors import HealthProber  # noqa: E402
from tests.support.webhook_process import WebhookProcess, generate_certs  # noqa: E402

PERIOD_US = 100_000
V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")


class Quota:
    """A cgroup with a CFS quota of ``cpus`` CPUs; processes are moved in with :meth:`add`."""

    def __init__(self, cpus: float) -> None:
        quota = int(cpus * PERIOD_US)
        name = f"ix-gpu-bench-{os.getpid()}"
        if (V1 / "cpu.cfs_quota_us").exists():
            self.path = V1 / name
            self.path.mkdir()
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        elif "cpu" in (V2 / "cgroup.controllers").read_text().split():
            self.path = V2 / name
            self.path.mkdir()
            (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            raise OSError("no cgroup v1 cpu hierarchy and no cgroup v2 cpu controller")

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def throttling(self) -> str:
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        periods, throttled = stat.get("nr_periods", "?"), stat.get("nr_throttled", "?")
        seconds = int(stat.get("throttled_time", 0)) / 1e9 or int(stat.get("throttled_usec", 0)) / 1e6
        return f"throttled in {throttled} of {periods} periods, {seconds:.1f} s in all"

    def remove(self) -> None:
        self.path.rmdir()


def run(label: str, cases: list, workdir: Path, quota: Quota | None) -> None:
    certs = generate_certs(workdir / "certs")
    config = workdir / "config.yaml"
    config.write_text(adversarial_config())
    with WebhookProcess(workdir, certs, config=config).start() as webhook:
        assert webhook.process is not None
        if quota is not None:
            quota.add(webhook.process.pid)  # the review children are forked later: they follow it
        with HealthProber(webhook.url, certs / "ca.crt", interval=0.05, slow=0.05) as prober:
            began = time.monotonic()
            outcomes = _send_all(webhook, cases)
            took = time.monotonic() - began
        over_budget = webhook.metric("ix_gpu_admission_over_budget_total")
    latencies = sorted(o.seconds for o in outcomes)
    health = prober.result

    def ms(value: float) -> str:
        return f"{value * 1000:.0f} ms"

    print(f"{label}: {len(cases)} reviews in {took:.1f} s")
    p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
    print(
        f"  reviews: p50 {ms(p50)}, p99 {ms(p99)}, max {ms(latencies[-1])} (upload included); "
        f"503: {sum(o.status == 503 for o in outcomes)}, "
        f"over the request budget: {over_budget:g}"
    )
    print(
        f"  /healthz: {health.count} probes, max {ms(health.max)}, p99 {ms(health.p99)}, "
        f"p50 {ms(health.p50)}, {len(health.failures)} failures"
    )
    if quota is not None:
        print(f"  {quota.throttling()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpus", type=float, default=1.0, help="the CPU limit (default: 1, the chart's)")
    parser.add_argument("--reviews", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=12345)
    args = parser.parse_args()
    try:
        quota = Quota(args.cpus)
    except OSError as exc:
        print(f"cpu_limit: cannot make a cgroup with a CPU quota here: {exc}", file=sys.stderr)
        return 1
    try:
        cases = build_corpus(args.seed, args.reviews)
        with tempfile.TemporaryDirectory() as free, tempfile.TemporaryDirectory() as limited:
            run("no CPU limit", cases, Path(free), None)
            run(f"CPU limit {args.cpus:g} (CFS quota)", cases, Path(limited), quota)
    finally:
        quota.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
