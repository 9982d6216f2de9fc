"""Load benchmark of ``ix-gpu webhook`` with wrk, against the bare-FastAPI floor.

    python bench/webhook_load/run.py [--duration 15] [--connections 64] [--server-cpu 0] [--client-cpu 1]

One uvicorn worker pinned to one core (taskset), wrk pinned to another, HTTPS with keep-alive.
For each server (ix-gpu with everything on: config-driven core, metrics, one JSON log line per
admission written to a file, namespace facts; and the bare FastAPI + orjson handler) and each body
(the ~14 KB 10-container GPU pod, the ~2 KB one): requests/s, p50/p99/p99.9 at 64 connections;
p50/p99 at about 500 requests/s (wrk's delay hook, 5 connections); RSS sampled every 5 s during
one continuous run of 100,000+ requests. Prints a table and writes results.json.

RSS after *all* runs is higher than during steady load: each wrk run opens 64 new TLS connections
and exits without a TLS close_notify, and the event loop keeps each dead connection's SSL buffers
until its shutdown/keep-alive timeout (30 s); the heap keeps the high-water mark afterwards.
Needs ``wrk`` (Debian package) and ``taskset``. Not a test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from bodies import write_bodies  # noqa: E402

from ix_gpu.webhook.service.certificates import generate_bundle, write_bundle  # noqa: E402


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _wait_serving(port: int, ca: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    context = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=2)
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            conn.close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("server did not start")


def _check_answer(port: int, ca: Path, body: Path, expect_patch: bool) -> None:
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
    conn.request("POST", "/mutate", body=body.read_bytes(), headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    data = json.loads(answer.read())
    conn.close()
    assert answer.status == 200, data
    response = data["response"]
    assert response["allowed"] is True, response
    assert ("patch" in response) == expect_patch, response


def _wrk(
    url: str, body: Path, seconds: int, connections: int, cpu: int, delay_ms: int | None = None
) -> dict[str, Any]:
    args = ["taskset", "-c", str(cpu), "wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s"]
    args += ["-s", str(HERE / "post.lua"), url, "--", str(body)]
    if delay_ms is not None:
        args.append(str(delay_ms))
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    line = next(line for line in out.splitlines() if line.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
    return result


def _start(target: str, workdir: Path, certs: Path, port: int, cpu: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if target == "ix-gpu":
        command = [sys.executable, "-m", "ix_gpu", "webhook", "--port", str(port), "--cert-dir", str(certs)]
    else:
        command = [sys.executable, str(HERE / "bare_app.py"), "--port", str(port), "--cert-dir", str(certs)]
    log = open(workdir / f"{target}.log", "wb")  # noqa: SIM115 - lives as long as the server
    return subprocess.Popen(
        ["taskset", "-c", str(cpu), *command], stdout=log, stderr=log, env=env, cwd=workdir
    )


def bench_target(
    target: str, args: argparse.Namespace, workdir: Path, certs: Path, bodies: dict[str, Path]
) -> dict[str, Any]:
    port = args.port
    proc = _start(target, workdir, certs, port, args.server_cpu)
    url = f"https://127.0.0.1:{port}/mutate"
    results: dict[str, Any] = {"target": target, "runs": {}}
    try:
        _wait_serving(port, certs / "ca.crt", proc) if target == "ix-gpu" else time.sleep(3)
        for body in bodies.values():
            _check_answer(port, certs / "ca.crt", body, expect_patch=target == "ix-gpu")
        warm = _wrk(url, bodies["pod-14k"], 3, args.connections, args.client_cpu)
        # Memory: one continuous run of >= rss_requests on the same 64 connections, RSS sampled
        # every few seconds, so the series shows the steady-state trend (see _rss_note).
        seconds = max(10, math.ceil(args.rss_requests * 1.15 / max(warm["rps"], 1.0)))
        samples: list[tuple[float, int]] = [(0.0, _rss_kib(proc.pid))]
        stop = threading.Event()

        def sample() -> None:
            started = time.monotonic()
            while not stop.wait(5):
                samples.append((time.monotonic() - started, _rss_kib(proc.pid)))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        long_run = _wrk(url, bodies["pod-14k"], seconds, args.connections, args.client_cpu)
        stop.set()
        sampler.join()
        samples.append((long_run["duration_us"] / 1e6, _rss_kib(proc.pid)))
        results["rss"] = {"requests": long_run["requests"], "rps": long_run["rps"], "samples_kib": samples}
        for name, body in bodies.items():
            run = _wrk(url, body, args.duration, args.connections, args.client_cpu)
            paced = _wrk(url, body, max(5, args.duration // 2), 5, args.client_cpu, delay_ms=8)
            results["runs"][name] = {"saturated": run, "paced": paced}
        results["rss_after_all_kib"] = _rss_kib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    return results


def _ms(us: float) -> str:
    return f"{us / 1000:.1f}"


def report(all_results: list[dict[str, Any]], connections: int) -> str:
    lines = [
        f"{'server':8} {'body':8} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'p99.9 ms':>8} {'errors':>6}"
        f"  | {'paced req/s':>11} {'p50 ms':>6} {'p99 ms':>6}",
    ]
    for res in all_results:
        for name, run in res["runs"].items():
            sat, paced = run["saturated"], run["paced"]
            errors = sum(sat["errors"].values()) + sum(paced["errors"].values())
            saturated = (
                f"{sat['rps']:7.0f} {_ms(sat['p50_us']):>7} {_ms(sat['p99_us']):>7} {_ms(sat['p999_us']):>8}"
            )
            lines.append(
                f"{res['target']:8} {name:8} {saturated} {errors:6d}  | {paced['rps']:11.0f} "
                f"{_ms(paced['p50_us']):>6} {_ms(paced['p99_us']):>6}"
            )
    lines.append(
        f"(saturated: {connections} connections; paced: 5 connections, 8 ms delay each: about 500 req/s)"
    )
    for res in all_results:
        rss = res["rss"]
        series = " ".join(f"{kib / 1024:.0f}" for _, kib in rss["samples_kib"])
        lines.append(
            f"RSS MiB of {res['target']}, every 5 s of one {rss['requests']}-request run: {series}; "
            f"after all runs: {res['rss_after_all_kib'] / 1024:.0f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=15, help="seconds per saturated run (default 15)")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--port", type=int, default=18943)
    parser.add_argument("--rss-requests", type=int, default=100_000)
    parser.add_argument("--targets", default="ix-gpu,bare", help="comma-separated: ix-gpu, bare")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, bodies)")
    args = parser.parse_args()
    for tool in ("wrk", "taskset"):
        if shutil.which(tool) is None:
            raise SystemExit(
                f"{tool} is not installed (apt-get install -y {'wrk' if tool == 'wrk' else 'util-linux'})"
            )
    workdir = Path(tempfile.mkdtemp(prefix="ix-gpu-bench-"))
    certs = workdir / "certs"
    write_bundle(generate_bundle(["localhost"], ["127.0.0.1"]), certs)
    bodies = write_bodies(workdir / "bodies")
    print(", ".join(f"{name}: {path.stat().st_size} bytes" for name, path in bodies.items()))
    all_results = [bench_target(t, args, workdir, certs, bodies) for t in args.targets.split(",")]
    (workdir / "results.json").write_text(json.dumps(all_results, indent=2))
    print(report(all_results, args.connections))
    print(f"details: {workdir / 'results.json'}")
    if not args.keep:
        for target in args.targets.split(","):
            (workdir / f"{target}.log").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
