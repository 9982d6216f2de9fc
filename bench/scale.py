"""A burst of GPU pods through the real control plane onto simulated GPU nodes, with a fault on the way.

    .venv/bin/python bench/scale.py [--kwok-nodes 100] [--kwok-boards 4] [--namespaces 2000]
        [--pods 1000] [--rate 50]
        [--fault none|apiserver-restart|webhook-kill|compact|namespace-burst|new-namespaces[+...]]
        [--new-namespaces 100] [--runtime fake-cri|containerd] [--replicas 3] [--json]

Needs root (the mini cluster's kubelets use mount namespaces) and the tier's binaries
(``tests/k8s/build.sh``, kwok from ``tests/k8s/build-go-command.sh kwok``). ``--runtime
containerd`` runs the webhook from the chart, ``--replicas`` of it in real containers on the
real-node tier's two nodes (its images too: ``tests/k8s/build-images.sh``, helm from
``tests/k8s/build-helm.sh``); ``fake-cri`` runs one webhook host process. What runs and what is
reported: ``tests/k8s/burst.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.k8s.burst import FAULTS, run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kwok-nodes", type=int, default=100)
    parser.add_argument(
        "--kwok-boards", type=int, default=4, help="boards per simulated node, 4 time-sliced GPUs each"
    )
    parser.add_argument("--namespaces", type=int, default=2000)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=50.0, help="pods created per second")
    parser.add_argument(
        "--fault",
        default="none",
        help=f"what happens half-way: {', '.join(FAULTS)}; several joined by '+' happen at evenly "
        "spaced points of the burst, in order (default none); new-namespaces runs through the whole "
        "burst instead: --new-namespaces namespaces created at an even pace, each followed at once "
        "by its GPU pod (every 4th a ResourceClaim, then a pod that uses it)",
    )
    parser.add_argument(
        "--new-namespaces", type=int, default=100, help="namespaces the new-namespaces fault creates"
    )
    parser.add_argument(
        "--runtime",
        choices=("fake-cri", "containerd"),
        default="fake-cri",
        help="containerd: the chart's webhook in real containers on real nodes",
    )
    parser.add_argument("--replicas", type=int, default=3, help="webhook replicas (containerd)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    unknown = [f for f in args.fault.split("+") if f not in FAULTS]
    if unknown:
        parser.error(f"--fault {unknown[0]!r}: one of {', '.join(FAULTS)}, or several joined by '+'")
    with tempfile.TemporaryDirectory(prefix="ix-scale-") as work:
        result = run(
            Path(work),
            kwok_nodes=args.kwok_nodes,
            kwok_boards=args.kwok_boards,
            namespaces=args.namespaces,
            pods=args.pods,
            rate=args.rate,
            fault=args.fault,
            runtime=args.runtime,
            replicas=args.replicas,
            new_namespaces=args.new_namespaces,
        )
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
