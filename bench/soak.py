"""Soak benchmark of ``ix-gpu webhook``: steady, realistic load for minutes, watching memory.

    .venv/bin/python bench/soak.py [--duration 600] [--rate 300] [--big-fraction 0.5] [--json out.json]

Starts the real webhook (built-in config, production limits, TLS with a throwaway CA, no
kubeconfig, one JSON log line per admission written to a file) on 127.0.0.1 and sends it about
``--rate`` AdmissionReviews a second for ``--duration`` seconds: the ~2 KB one-container GPU pod and
the ~14 KB ten-container pod of ``bench/webhook_load/bodies.py``, mixed ``--big-fraction`` to one.
Requests are paced on a fixed schedule (open loop) by a few keep-alive HTTPS connections, so a slow
answer shows up as latency rather than as a lower rate. RSS is read from ``/proc/PID/status`` every
``--rss-interval`` seconds.

Prints requests, errors (any answer but a 200 AdmissionReview that allows and patches the pod, and
the webhook's internal-error counter), achieved rate, p50/p99/p99.9/max latency, and RSS at the
start, the end and its maximum, with growth over the run and over its second half — the second half
is what tells a leak from warm-up. Loopback only; stops by itself (and stops the webhook) after
``--duration``, on Ctrl-C too. Not a test: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE / "webhook_load"))

from bodies import big_review, small_review  # noqa: E402

from ix_gpu.webhook.certs.authority import generate_bundle, write_bundle  # noqa: E402

MiB = 1024 * 1024
HEADERS = {"Content-Type": "application/json"}
COMMAND = (sys.executable, "-m", "ix_gpu", "webhook", "--host", "127.0.0.1", "--port", "0")
"""The webhook with production defaults on a free loopback port (it logs the URL it got)."""


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] if ordered else 0.0


class Webhook:
    """``python -m ix_gpu webhook`` on 127.0.0.1 with a free port, its log in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.cert_dir = workdir / "certs"
        write_bundle(generate_bundle(["localhost"], ["127.0.0.1"]), self.cert_dir)
        self.log = workdir / "webhook.log"
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [*COMMAND, "--cert-dir", str(self.cert_dir)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
            )
        self.port = self._wait_serving()

    def _wait_serving(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(
                    f"webhook exited with {self.process.returncode}:\n{self.log.read_text()[-2000:]}"
                )
            for line in self.log.read_text(errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and entry.get("msg") == "serving AdmissionReview v1":
                    return int(str(entry["url"]).rsplit(":", 1)[1].split("/", 1)[0])
            time.sleep(0.1)
        raise SystemExit("webhook did not start")

    def context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(cafile=str(self.cert_dir / "ca.crt"))
        return context

    def connection(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context(), timeout=10)

    def internal_errors(self) -> float:
        conn = self.connection()
        try:
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("ix_gpu_admission_internal_errors_total")
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@dataclass
class Tally:
    """What the senders saw; appended to from several threads (list.append is atomic)."""

    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    late: int = 0
    """Requests sent more than 50 ms after their scheduled time (the client fell behind)."""


def _problem(status: int, data: bytes) -> str | None:
    if status != 200:
        return f"HTTP {status}: {data[:200]!r}"
    try:
        response = json.loads(data)["response"]
    except (ValueError, KeyError, TypeError):
        return f"not an AdmissionReview: {data[:200]!r}"
    if response.get("allowed") is not True or "patch" not in response:
        return f"not allowed and patched: {str(response)[:300]}"
    return None


def _sender(
    webhook: Webhook,
    bodies: list[bytes],
    schedule_start: float,
    rate: float,
    end: float,
    next_index: Any,
    tally: Tally,
) -> None:
    conn = webhook.connection()
    try:
        while True:
            index = next(next_index)
            due = schedule_start + index / rate
            if due >= end:
                return
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            elif wait < -0.05:
                tally.late += 1
            body = bodies[index % len(bodies)]
            started = time.perf_counter()
            try:
                conn.request("POST", "/mutate", body=body, headers=HEADERS)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                tally.errors.append(f"{type(exc).__name__}: {exc}")
                conn.close()
                conn = webhook.connection()
                continue
            tally.latencies.append(time.perf_counter() - started)
            problem = _problem(response.status, data)
            if problem is not None:
                tally.errors.append(problem)
            if response.will_close:
                conn.close()
                conn = webhook.connection()
    finally:
        conn.close()


def _mix(big_fraction: float) -> list[bytes]:
    """100 bodies, ``big_fraction`` of them the 14 KB pod, spread evenly (deterministic)."""
    small = json.dumps(small_review(), separators=(",", ":")).encode()
    big = json.dumps(big_review(), separators=(",", ":")).encode()
    return [big if int((i + 1) * big_fraction) > int(i * big_fraction) else small for i in range(100)]


def run(
    duration: float, rate: float, big_fraction: float, connections: int, rss_interval: float
) -> dict[str, Any]:
    import itertools

    bodies = _mix(big_fraction)
    with tempfile.TemporaryDirectory(prefix="ix-gpu-soak-") as tmp:
        webhook = Webhook(Path(tmp))
        try:
            pid = webhook.process.pid
            warm = webhook.connection()  # a few requests first, so RSS "start" is the served state
            for body in bodies[:20]:
                warm.request("POST", "/mutate", body=body, headers=HEADERS)
                warm.getresponse().read()
            warm.close()
            rss: list[tuple[float, int]] = [(0.0, rss_bytes(pid))]
            tally = Tally()
            start = time.monotonic()
            end = start + duration
            counter = itertools.count()
            threads = [
                threading.Thread(
                    target=_sender, args=(webhook, bodies, start, rate, end, counter, tally), daemon=True
                )
                for _ in range(connections)
            ]
            for thread in threads:
                thread.start()
            print(f"soak: {duration:g} s at {rate:g} req/s, {big_fraction:.0%} 14 KB reviews, pid {pid}")
            while time.monotonic() < end and webhook.process.poll() is None:
                time.sleep(min(rss_interval, max(0.0, end - time.monotonic())))
                elapsed = time.monotonic() - start
                rss.append((elapsed, rss_bytes(pid)))
                print(
                    f"  {elapsed:6.0f} s  {len(tally.latencies):8d} requests  {len(tally.errors):4d} errors  "
                    f"RSS {rss[-1][1] / MiB:6.1f} MiB",
                    flush=True,
                )
            for thread in threads:
                thread.join(30)
            elapsed = time.monotonic() - start
            alive = webhook.process.poll() is None
            internal = webhook.internal_errors() if alive else float("nan")
        finally:
            webhook.stop()

    ordered = sorted(tally.latencies)
    values = [value for _, value in rss]
    half = [value for at, value in rss if at >= duration / 2] or values
    return {
        "duration_s": round(elapsed, 1),
        "requests": len(ordered),
        "rate": round(len(ordered) / elapsed, 1),
        "errors": len(tally.errors),
        "error_examples": tally.errors[:5],
        "internal_errors": internal,
        "webhook_alive": alive,
        "late_sends": tally.late,
        "latency_ms": {
            "p50": round(_percentile(ordered, 0.5) * 1000, 2),
            "p99": round(_percentile(ordered, 0.99) * 1000, 2),
            "p99.9": round(_percentile(ordered, 0.999) * 1000, 2),
            "max": round((ordered[-1] if ordered else 0.0) * 1000, 2),
        },
        "rss_mib": {
            "start": round(values[0] / MiB, 1),
            "end": round(values[-1] / MiB, 1),
            "max": round(max(values) / MiB, 1),
            "growth": round((values[-1] - values[0]) / MiB, 1),
            "growth_second_half": round((half[-1] - half[0]) / MiB, 1),
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600, help="seconds of load (default 600)")
    parser.add_argument("--rate", type=float, default=300, help="requests per second (default 300)")
    parser.add_argument(
        "--big-fraction", type=float, default=0.5, help="share of 14 KB reviews (default 0.5)"
    )
    parser.add_argument("--connections", type=int, default=4, help="keep-alive connections (default 4)")
    parser.add_argument(
        "--rss-interval", type=float, default=5, help="seconds between RSS samples (default 5)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if not 0 <= args.big_fraction <= 1 or args.duration <= 0 or args.rate <= 0 or args.connections < 1:
        parser.error("--duration and --rate must be positive, --big-fraction in [0, 1], --connections >= 1")
    try:
        results = run(args.duration, args.rate, args.big_fraction, args.connections, args.rss_interval)
    except KeyboardInterrupt:
        print("interrupted; webhook stopped")
        return 130
    latency, rss = results["latency_ms"], results["rss_mib"]
    print(
        f"requests {results['requests']} in {results['duration_s']} s ({results['rate']} req/s), "
        f"errors {results['errors']}, internal errors {results['internal_errors']:g}, "
        f"late sends {results['late_sends']}"
    )
    print(
        f"latency ms: p50 {latency['p50']}, p99 {latency['p99']}, p99.9 {latency['p99.9']}, "
        f"max {latency['max']}"
    )
    print(
        f"RSS MiB: start {rss['start']}, end {rss['end']}, max {rss['max']}, growth {rss['growth']:+}, "
        f"second half {rss['growth_second_half']:+}"
    )
    for example in results["error_examples"]:
        print(f"  error: {example}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    ok = results["errors"] == 0 and results["internal_errors"] == 0 and results["webhook_alive"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
