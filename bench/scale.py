"""A burst of GPU pods through the real control plane onto simulated GPU nodes, with a fault on the way.

    .venv/bin/python bench/scale.py [--kwok-nodes 100] [--kwok-boards 4] [--namespaces 2000]
        [--pods 1000] [--rate 50]
        [--fault none|apiserver-restart|webhook-kill|compact|namespace-burst|new-namespaces[+...]]
        [--new-namespaces 100] [--runtime fake-cri|containerd] [--replicas 3]
        [--webhook ix-gpu|none|go[,...]] [--rounds 1] [--settle 180]
        [--webhook-routing service|endpoints] [--webhook-cpu-request QUANTITY]
        [--node-cpu-shares 16384] [--json]

Needs root (the mini cluster's kubelets use mount namespaces) and the tier's binaries
(``tests/k8s/build.sh``, kwok from ``tests/k8s/build-go-command.sh kwok``). ``--runtime
containerd`` runs the webhook from the chart, ``--replicas`` of it in real containers on the
real-node tier's two nodes (its images too: ``tests/k8s/build-images.sh``, helm from
``tests/k8s/build-helm.sh``); ``fake-cri`` runs one webhook host process. What runs and what is
reported: ``tests/k8s/burst.py``.

``--webhook`` picks the webhook (default ``ix-gpu``, the chart's), or several, comma-separated,
to see what a webhook adds to the burst side by side (containerd only; ``tests/k8s/burst_arms.py``):
``none`` (no webhook; each pod created carrying what the ix-gpu webhook would have added, so the
scheduler and kubelets see the same pods), ``go`` (``bench/go-webhook``, the Go standard-library
reference, in real containers deployed as the chart deploys ix-gpu's, registered with the chart's
own MutatingWebhookConfiguration; it honours no opt-out, and adds the ``gpu-type`` annotation's
node affinity as ix-gpu does) and ``ix-gpu``. ``--rounds N`` runs the arms N times, interleaved,
the order turned by one each round (none, go, ix-gpu; go, ix-gpu, none; ...), each on a fresh
cluster of the same size with the same burst, each burst begun once the CPUs settle
(``--settle``), and prints a side-by-side table
of the medians (``tests/k8s/burst_compare.py``), ratios ix-gpu/none and go/none of create p99 and
startup p99, and each run's checks; ``--json`` prints the same with every run's figures. e.g.

    .venv/bin/python bench/scale.py --runtime containerd --kwok-nodes 50 --namespaces 500 \
        --pods 500 --rate 50 --webhook none,go,ix-gpu --rounds 1

With ``--runtime containerd`` the real nodes run as cgroups of this host, beside the control plane's
processes; ``--node-cpu-shares`` (default 16384, ``tests/k8s/host_cpu.py``) weighs each node's
cgroup so that its pods get a CPU when they ask, as on a worker node of their own.

``--webhook-routing`` is how the apiserver reaches the webhook's replicas. ``service`` (the
containerd default, as in most clusters): it dials the Service's ClusterIP and kube-proxy picks a
replica once per connection; the apiserver reuses its most recently used idle connection first, so
one replica can take most of a burst. ``endpoints``: the apiserver runs with
``--enable-aggregator-routing=true`` and picks an endpoint itself, on v1.37 for each request.

Beside each webhook's own figures, the host's view of its replicas over the burst:
``webhook_cpu_wait_ms_per_review`` (the time their threads spent runnable, waiting for a CPU,
from ``/proc/<pid>/task/*/schedstat``: what a saturated host adds that a replica's own latency,
started once a request is read, does not see) and ``webhook_tcp_by_replica`` (connections
accepted, segments retransmitted and connections the listen queue dropped, from each pod's own
network namespace, with the loss probes, retransmission timeouts and SYN-ACKs among them, the
probes that repaired a loss and the peer's reports of segments it already had (a spurious
retransmission: the ACK was late, not the data), and the segments sent again on the sockets still
open at the end, split into accepted and dialed; probes and the bench's reads of ``/metrics`` are
connections too) and ``webhook_cpu_throttled_by_replica`` (periods its CPU cgroup was throttled in,
and for how long). ``control_plane_by_process``: the CPU etcd, the apiserver, the scheduler and the
controller-manager used over the burst and the time they waited for a CPU, per review.
``running_seen_late_p50_s``/``_p99_s``/``_max_s``: how long after each pod's own ``startTime`` the
bench's pod watch saw it Running (1 s resolution), with ``watch_restarts`` and ``watch_relists``:
a startup tail that these leave near 1 s is the cluster's, not the watch's.
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
from tests.k8s.burst_compare import parse_arms, run_arms, table  # noqa: E402
from tests.k8s.host_cpu import NODE_CPU_SHARES  # noqa: E402


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
    parser.add_argument("--webhook", default="ix-gpu", help="ix-gpu, none, go, or several: a,b,c")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the --webhook arms")
    parser.add_argument(
        "--settle",
        type=float,
        default=180.0,
        metavar="SECONDS",
        help="before each burst, wait up to this long for the CPUs to settle (quiet, or no longer "
        "falling); 0: start at once (default 180)",
    )
    parser.add_argument(
        "--webhook-routing",
        choices=("service", "endpoints"),
        help="how the apiserver reaches the webhook: service dials its ClusterIP and kube-proxy picks "
        "a replica per connection; endpoints (--enable-aggregator-routing) has the apiserver pick "
        "a replica per request (default: service with containerd, endpoints with fake-cri)",
    )
    parser.add_argument(
        "--webhook-cpu-request",
        metavar="QUANTITY",
        help="the webhook replicas' CPU request instead of the chart's 100m, for either webhook (e.g. 1): "
        "their CPU weight against the control plane on the nodes (containerd)",
    )
    parser.add_argument(
        "--node-cpu-shares",
        type=int,
        metavar="N",
        help="the CPU weight (cgroup v1 cpu.shares; v2 its cpu.weight) of each real node's cgroup root, "
        "where all its pods run, against the control plane's host processes, every one of whose "
        f"threads weighs 1024 (containerd): default {NODE_CPU_SHARES}, so that a node's pods get a "
        "CPU when they ask, as on a worker of their own; 1024 weighs a whole node as one thread, "
        "as the earlier figures in docs/benchmarks.md were taken",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    unknown = [f for f in args.fault.split("+") if f not in FAULTS]
    if unknown:
        parser.error(f"--fault {unknown[0]!r}: one of {', '.join(FAULTS)}, or several joined by '+'")
    try:
        arms = parse_arms(args.webhook)
    except ValueError as exc:
        parser.error(str(exc))
    if args.webhook_routing == "service" and args.runtime != "containerd":
        parser.error("--webhook-routing service: with --runtime containerd (fake-cri has no kube-proxy)")
    if args.webhook_cpu_request is not None and args.runtime != "containerd":
        parser.error(
            "--webhook-cpu-request: with --runtime containerd (fake-cri's webhook is a host process)"
        )
    if args.node_cpu_shares is not None and (args.runtime != "containerd" or args.node_cpu_shares < 2):
        parser.error("--node-cpu-shares: 2 or more, with --runtime containerd (the real nodes' cgroups)")
    if args.runtime == "containerd" and args.node_cpu_shares is None:
        args.node_cpu_shares = NODE_CPU_SHARES
    if arms != ["ix-gpu"] and (args.runtime != "containerd" or "webhook-kill" in args.fault):
        parser.error("--webhook none or go: with --runtime containerd and without webhook-kill")
    with tempfile.TemporaryDirectory(prefix="ix-scale-") as work:
        if len(arms) > 1 or args.rounds > 1:
            compared = run_arms(
                Path(work), arms, args.rounds, run,
                kwok_nodes=args.kwok_nodes, kwok_boards=args.kwok_boards, namespaces=args.namespaces,
                pods=args.pods, rate=args.rate, fault=args.fault, runtime=args.runtime,
                replicas=args.replicas, new_namespaces=args.new_namespaces, settle_max_s=args.settle,
                webhook_routing=args.webhook_routing, webhook_cpu_request=args.webhook_cpu_request,
                node_cpu_shares=args.node_cpu_shares,
            )  # fmt: skip
            print(json.dumps(compared) if args.json else table(compared))
            return 0
        result = run(
            Path(work),
            arm=arms[0],
            kwok_nodes=args.kwok_nodes,
            kwok_boards=args.kwok_boards,
            namespaces=args.namespaces,
            pods=args.pods,
            rate=args.rate,
            fault=args.fault,
            runtime=args.runtime,
            replicas=args.replicas,
            new_namespaces=args.new_namespaces,
            settle_max_s=args.settle,
            webhook_routing=args.webhook_routing,
            webhook_cpu_request=args.webhook_cpu_request,
            node_cpu_shares=args.node_cpu_shares,
        )
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
