"""The host's CPU as the scale bench reads and sets it: what the control plane used and waited
for over a burst, and the CPU weight of the real nodes' cgroups.

The real-node tier runs its control plane as host processes and gives each node a cgroup root of
its own (``/ixt-<node>``, ``real_nodes.make_cgroup_root``) at the default weight: all of a node's
pods together weigh as much as one of the control plane's threads. On a saturated host a pod then
waits for a CPU as it never would on a worker node of its own, where only the node's daemons
compete with it. ``bench/scale.py --node-cpu-shares`` sets the weight of every node's root to show
how much of what a webhook adds is that wait, for every arm alike; by default it sets
``NODE_CPU_SHARES``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tests.k8s.burst_webhook import cpu_seconds, run_delay_s
from tests.k8s.real_nodes import cgroup_hierarchies
from tests.support.processes import Process

# The weight the scale bench gives each real node's root unless told otherwise: sixteen threads'
# worth, more than the control plane has runnable at once on a small host, so a node's pods get a
# CPU when they ask for one, as on a machine of their own, while what they use stays their own
# work (the nodes run nothing else). At 1024 a saturated control plane left the webhook replicas
# waiting 2.6-3.0 ms per review for a CPU; at this weight 0.3-0.6 (docs/benchmarks.md).
NODE_CPU_SHARES = 16384


def weight_of_shares(shares: int) -> int:
    """cgroup v2's ``cpu.weight`` for a v1 ``cpu.shares`` value, as the kubelet converts it."""
    return 1 + ((min(max(shares, 2), 262144) - 2) * 9999) // 262142


def set_cpu_shares(cgroup_roots: Iterable[str], shares: int) -> dict[str, int]:
    """Set the CPU weight of each of ``cgroup_roots`` (top-level cgroup names) to ``shares``
    (``cpu.shares`` on v1, its ``cpu.weight`` equivalent on v2); returns what each file reads back,
    by root. A root that has no CPU controller file is left out."""
    written: dict[str, int] = {}
    for root in cgroup_roots:
        for hierarchy in cgroup_hierarchies():
            for knob, value in (("cpu.shares", shares), ("cpu.weight", weight_of_shares(shares))):
                path = hierarchy / root / knob
                if path.exists():
                    path.write_text(str(value))
                    written[root] = int(path.read_text())
    return written


CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")


def process_clocks(processes: dict[str, Process]) -> dict[str, tuple[int, float, float]]:
    """Pid, CPU seconds used and seconds waited for a CPU of each control-plane process in
    ``processes``: the webhook's answer is late by the apiserver's wait as much as by its own."""
    clocks = {}
    for name in CONTROL_PLANE:
        process = processes.get(name)
        if process is None:
            continue
        try:
            clocks[name] = (process.pid, cpu_seconds(process.pid), run_delay_s(process.pid))
        except OSError:
            continue  # exited (a restart fault): no figure for it
    return clocks


def control_plane_figures(
    before: dict[str, tuple[int, float, float]], after: dict[str, tuple[int, float, float]], reviews: int
) -> dict[str, Any]:
    """What the burst added to each control-plane process's CPU and CPU wait, per review, for the
    processes that were the same process at both reads (a restarted apiserver is left out)."""
    figures = {}
    for name in sorted(before.keys() & after.keys()):
        (pid, cpu, wait), (pid_after, cpu_after, wait_after) = before[name], after[name]
        if pid != pid_after:
            continue
        per_review = 1000 / max(reviews, 1)
        figures[name] = {
            "cpu_ms_per_review": round((cpu_after - cpu) * per_review, 2),
            "cpu_wait_ms_per_review": round((wait_after - wait) * per_review, 2),
        }
    return {"control_plane_by_process": figures} if figures else {}
