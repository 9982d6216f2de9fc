"""What the node agents ask of the API server: requests per agent and node, from the apiserver's
own audit log, at start, in steady state and across an apiserver restart.

    .venv/bin/python bench/agent_requests.py [--nodes 4] [--steady 120] [--json]

A real etcd and kube-apiserver (the tier's current version, ``tests/k8s/build.sh``; or
``--k8s-bin DIR``) with an audit policy that records every request's metadata (verb, resource,
user agent, time). ``--nodes`` Nodes, half of them labelled ``ix-gpu.io/gpu.allocation=dra``; on
each, the real ``ix-gpu plugin`` (a directory of named configs, so it follows the node's config
label, and ``--dra-driver``, so it watches the driver's slices too) and the real ``ix-gpu dra``,
each with the fake backend and a kubeconfig of its own. No kubelet: neither needs one to talk to
the API server.

Three windows, each counted per user agent (``ix-gpu-plugin``, ``ix-gpu-dra``) and divided by the
nodes: the first 30 s after start; ``--steady`` seconds after that (nothing changes in the
cluster); and 60 s after the apiserver was stopped for 5 s and started again. A steady state of
watches costs one renewal per watch every 5-10 minutes (the apiserver ends a watch at its
``timeoutSeconds``), which a window of 2 minutes may not see: the renewal rate is given from the
agents' watch count. The figures are extrapolated to 5,000 nodes.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.k8s.k8s_tier import K8sBinaries, KubeAPI, build_binaries, start_etcd, start_kube_apiserver  # noqa: E402
from tests.support.cli import ix_gpu_process  # noqa: E402
from tests.support.paths import FAKE_DEVICES  # noqa: E402
from tests.support.processes import Process  # noqa: E402

AGENTS = ("ix-gpu-plugin", "ix-gpu-dra")
DRIVER = "gpu.iluvatar.com"
POLICY = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n"
CLUSTER_NODES = 5000
WATCH_RENEWAL_S = 450.0
"""Mean seconds between renewals of one watch: its timeout is drawn from 300-600 s."""


def create_nodes(api: KubeAPI, count: int) -> list[str]:
    names = []
    for i in range(count):
        name = f"gpu-node-{i}"
        labels = {"ix-gpu.io/gpu.allocation": "dra"} if i % 2 else {}
        status, reply = api.request("POST", "/api/v1/nodes", {"metadata": {"name": name, "labels": labels}})
        if status not in (201, 409):
            raise RuntimeError(f"node {name}: {status} {reply}")
        names.append(name)
    return names


def start_agents(api: KubeAPI, nodes: list[str], work: Path, logs: Path) -> list[Process]:
    configs = work / "configs"
    configs.mkdir()
    (configs / "default").write_text("version: v1\nflags:\n  splitboard: false\n")
    (configs / "split").write_text("version: v1\nflags:\n  splitboard: true\n")
    processes = []
    for node in nodes:
        base = work / node
        (base / "dp").mkdir(parents=True)
        processes.append(
            ix_gpu_process(
                f"plugin-{node}",
                "plugin", "--backend", "fake", "--fake-devices", str(FAKE_DEVICES),
                "--device-plugin-dir", str(base / "dp"), "--config", str(configs),
                "--dra-driver", DRIVER, "--kubeconfig", str(api.kubeconfig), "--metrics-port", "0",
                log_dir=logs,
                env={"NODE_NAME": node},
            )
        )  # fmt: skip
        processes.append(
            ix_gpu_process(
                f"dra-{node}",
                "dra", f"--node-name={node}", "--backend=fake", f"--fake-devices={FAKE_DEVICES}",
                f"--plugins-dir={base / 'plugins'}", f"--registry-dir={base / 'registry'}",
                f"--cdi-dir={base / 'cdi'}", f"--kubeconfig={api.kubeconfig}",
                log_dir=logs,
            )
        )  # fmt: skip
    return processes


def read_audit(path: Path) -> list[dict[str, Any]]:
    """One entry per request (its ResponseComplete, else its ResponseStarted for a watch still
    open): user agent, verb, resource and when it was received."""
    found: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event.get("stage") not in ("ResponseStarted", "ResponseComplete"):
            continue
        ref = event.get("objectRef") or {}
        found[event["auditID"]] = {
            "agent": str(event.get("userAgent", "")).split("/")[0],
            "verb": event.get("verb"),
            "resource": ref.get("resource", event.get("requestURI", "")),
            "at": dt.datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp(),
        }
    return list(found.values())


def window(requests: list[dict[str, Any]], start: float, end: float, nodes: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for agent in AGENTS:
        mine = [r for r in requests if r["agent"] == agent and start <= r["at"] < end]
        kinds = collections.Counter(f"{r['verb']} {r['resource']}" for r in mine)
        out[agent] = {
            "per_node": round(len(mine) / nodes, 2),
            "per_node_per_minute": round(len(mine) / nodes / ((end - start) / 60), 2),
            "calls": dict(sorted(kinds.items())),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--steady", type=float, default=120.0, help="seconds of steady state")
    parser.add_argument("--k8s-bin", help="a bin directory with kube-apiserver (default: build.sh's cache)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    binaries = (
        K8sBinaries(Path(args.k8s_bin)) if args.k8s_bin else build_binaries(targets=("kube-apiserver",))
    )
    work = Path(tempfile.mkdtemp(prefix="ix-agent-requests-"))
    logs = work / "logs"
    logs.mkdir()
    policy, audit = work / "audit-policy.yaml", work / "audit.log"
    policy.write_text(POLICY)
    etcd = start_etcd(binaries, logs)
    api = start_kube_apiserver(
        binaries,
        etcd,
        work / "apiserver",
        logs,
        extra_args=[f"--audit-policy-file={policy}", f"--audit-log-path={audit}", "--audit-log-maxsize=0"],
    )
    processes: list[Process] = []
    result: dict[str, Any] = {"nodes": args.nodes, "steady_s": args.steady}
    try:
        nodes = create_nodes(api, args.nodes)
        started = time.time()
        processes = start_agents(api, nodes, work, logs)
        time.sleep(30 + args.steady)
        restarted = time.time()
        api.restart(5.0)
        time.sleep(60)
        requests = read_audit(audit)
        result["start_30s"] = window(requests, started, started + 30, args.nodes)
        result["steady"] = window(requests, started + 30, restarted, args.nodes)
        result["restart_60s"] = window(requests, restarted, restarted + 65, args.nodes)
        watches = {
            agent: sum(v for k, v in result["start_30s"][agent]["calls"].items() if k.startswith("watch "))
            / args.nodes
            for agent in AGENTS
        }
        result["watches_per_node"] = watches
        steady_lists = {
            agent: sum(v for k, v in result["steady"][agent]["calls"].items() if not k.startswith("watch "))
            for agent in AGENTS
        }
        result["steady_requests_other_than_watch"] = steady_lists
        per_second = sum(watches.values()) / WATCH_RENEWAL_S
        result["at_5000_nodes"] = {
            "watch_renewals_per_s": round(per_second * CLUSTER_NODES, 1),
            "open_watches": round(sum(watches.values()) * CLUSTER_NODES),
            "other_requests_per_s_in_steady_state": round(
                sum(steady_lists.values()) / args.nodes / args.steady * CLUSTER_NODES, 2
            ),
        }
        for process in processes:
            if process.popen.poll() is not None:
                raise RuntimeError(f"{process.name} exited: see {logs}")
    finally:
        for process in processes:
            process.stop()
        api.stop()
        etcd.stop()
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
