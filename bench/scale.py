"""A burst of GPU pods through the real control plane onto simulated GPU nodes, with a fault on the way.

    .venv/bin/python bench/scale.py [--kwok-nodes 100] [--namespaces 2000] [--pods 1000] [--rate 50]
        [--fault none|apiserver-restart|webhook-kill|compact|namespace-burst] [--json]

Needs root (the mini cluster's kubelets use mount namespaces) and the tier's binaries
(``tests/k8s/build.sh``, kwok from ``tests/k8s/build-go-command.sh kwok``). What runs and what is
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
    parser.add_argument("--namespaces", type=int, default=2000)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=50.0, help="pods created per second")
    parser.add_argument("--fault", choices=FAULTS, default="none")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ix-scale-") as work:
        result = run(
            Path(work),
            kwok_nodes=args.kwok_nodes,
            namespaces=args.namespaces,
            pods=args.pods,
            rate=args.rate,
            fault=args.fault,
        )
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
