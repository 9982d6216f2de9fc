"""Telemetry benchmark: what per-chip figures on ``/metrics`` cost the real ``ix-gpu plugin``.

    .venv/bin/python bench/telemetry_bench.py [--boards 8] [--scrapes 10000] [--json]

The plugin runs as in a cluster (its own process, the fake backend with ``--boards`` boards of two
chips, every chip with every figure, a 0.5 s health interval and ``--telemetry-interval 1``) but
with no kubelet registration: /metrics serves all the same. A PodResources server in this script
(grpcio, on a unix socket) lists ``--pods`` pods, two per chip, for the holder series. The script
scrapes /metrics ``--scrapes`` times back to back over HTTP and reports the plugin process's CPU
time per scrape (user + system from /proc/<pid>/stat: the plugin's own cost, whatever else the
machine does), the scrape wall time p50/p99, and its RSS after start, after the scrapes and at
peak (VmHWM), with telemetry on and, in a second run, off. Before the scrapes it also measures the
plugin's CPU at rest for ``--rest`` seconds with nobody scraping: the chips are read on the agent's
own clock, once per interval, so that is what telemetry costs a node whether or not Prometheus is
there.

Targets (the telemetry issue's): one scrape of 16 chips and 32 pods <= 20 ms of CPU; RSS <= 40 MiB
with telemetry on; no growth over 10,000 scrapes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.plugin_bench import cpu_seconds, devices_yaml, rss_mib  # noqa: E402

TELEMETRY = (
    "        telemetry: {utilization: 37, memoryUtilization: 12, memoryUsedMiB: 2048, temperature: 61,"
    " powerWatts: 155.5, smClockMHz: 1500, memoryClockMHz: 1200, eccCorrectedErrors: 3,"
    " eccUncorrectedErrors: 0}\n"
)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return str(answer.read().decode())


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pod_resources_server(socket: Path, boards: int, pods: int) -> Any:
    """A PodResources ``List`` answering ``pods`` pods, each holding one chip (round robin)."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    from ix_gpu.plugin.api import podresources_v1_pb2 as pr
    from ix_gpu.plugin.api import podresources_v1_pb2_grpc as pr_grpc

    chips = boards * 2
    answer = pr.ListPodResourcesResponse(
        pod_resources=[
            pr.PodResources(
                name=f"pod-{n}",
                namespace=f"team-{n % 4}",
                containers=[
                    pr.ContainerResources(
                        name="main",
                        devices=[
                            pr.ContainerDevices(
                                resource_name="iluvatar.com/gpu", device_ids=[f"GPU-bench-{n % chips:04d}"]
                            )
                        ],
                    )
                ],
            )
            for n in range(pods)
        ]
    )

    class Lister(pr_grpc.PodResourcesListerServicer):
        def List(self, request: Any, context: Any) -> Any:
            return answer

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    pr_grpc.add_PodResourcesListerServicer_to_server(Lister(), server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    return server


def run(boards: int, scrapes: int, telemetry: bool, pods: int, rest: float) -> dict[str, float]:
    base = Path(tempfile.mkdtemp(prefix="ixtele", dir="/tmp"))
    socket = base / "pod-resources.sock"
    kubelet = pod_resources_server(socket, boards, pods)
    (base / "dp").mkdir()
    devices = base / "devices.yaml"
    devices.write_text(devices_yaml(boards).replace("        health: 0\n", "        health: 0\n" + TELEMETRY))
    config = base / "ix-config"
    config.write_text("flags:\n  splitboard: true\nhealth:\n  intervalSeconds: 0.5\n  recoverAfter: 3\n")
    port = free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "ix_gpu", "plugin", "--backend", "fake", "--fake-devices", str(devices)),
            *("--config", str(config), "--device-plugin-dir", str(base / "dp")),
            *("--metrics-port", str(port), "--metrics-host", "127.0.0.1", "--log-level", "WARNING"),
            *("--telemetry-interval", "1" if telemetry else "0", "--pod-resources-socket", str(socket)),
        ],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "NODE_NAME": "bench-node"},
    )
    out: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                text = scrape(port)
            except OSError:
                text = ""
            ready = "ix_gpu_chip_temperature_celsius" in text and "ix_gpu_chip_allocation" in text
            if not telemetry or ready:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("no telemetry on /metrics")
            time.sleep(0.2)
        lines = text.splitlines()
        out["series_per_scrape"] = sum(1 for line in lines if line.startswith("ix_gpu_chip_"))
        out["holder_series"] = sum(1 for line in lines if line.startswith("ix_gpu_chip_allocation"))
        time.sleep(1)
        out["rss_after_start_mib"] = rss_mib(proc.pid)
        cpu_before = cpu_seconds(proc.pid)
        time.sleep(rest)
        out["cpu_ms_per_s_at_rest"] = (cpu_seconds(proc.pid) - cpu_before) / rest * 1000
        cpu_before = cpu_seconds(proc.pid)
        walls = []
        for _ in range(scrapes):
            started = time.perf_counter()
            scrape(port)
            walls.append(time.perf_counter() - started)
        out["cpu_ms_per_scrape"] = (cpu_seconds(proc.pid) - cpu_before) / scrapes * 1000
        walls.sort()
        out["scrape_p50_ms"] = statistics.median(walls) * 1000
        out["scrape_p99_ms"] = walls[int(len(walls) * 0.99) - 1] * 1000
        out["rss_after_scrapes_mib"] = rss_mib(proc.pid)
        out["rss_peak_mib"] = rss_mib(proc.pid, "VmHWM")
    finally:
        proc.terminate()
        proc.wait(15)
        kubelet.stop(0)
        shutil.rmtree(base, ignore_errors=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--boards", type=int, default=8, help="boards of two chips (default 8: 16 chips)")
    parser.add_argument("--scrapes", type=int, default=10000)
    parser.add_argument("--pods", type=int, default=32, help="pods PodResources lists (default 32)")
    parser.add_argument("--rest", type=float, default=20, help="seconds unscraped, CPU measured (default 20)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {
        "telemetry on": run(args.boards, args.scrapes, telemetry=True, pods=args.pods, rest=args.rest),
        "telemetry off": run(args.boards, args.scrapes, telemetry=False, pods=args.pods, rest=args.rest),
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{args.boards * 2} chips, {args.pods} pods, {args.scrapes} scrapes")
    keys = list(results["telemetry on"])
    print(f"{'':24}" + "".join(f"{name:>16}" for name in results))
    for key in keys:
        print(f"{key:24}" + "".join(f"{results[name].get(key, float('nan')):16.2f}" for name in results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
