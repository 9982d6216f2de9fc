"""The CPU weight of the real nodes' cgroups, for the scale bench.

The real-node tier runs its control plane as host processes and gives each node a cgroup root of
its own (``/ixt-<node>``, ``real_nodes.make_cgroup_root``) at the default weight: all of a node's
pods together weigh as much as one of the control plane's threads. On a saturated host a pod then
waits for a CPU as it never would on a worker node of its own, where only the node's daemons
compete with it. ``bench/scale.py --node-cpu-shares`` sets the weight of every node's root to show
how much of what a webhook adds is that wait, for every arm alike.
"""

from __future__ import annotations

from collections.abc import Iterable

from tests.k8s.real_nodes import cgroup_hierarchies


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
