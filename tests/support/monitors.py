"""Watching a running webhook from outside while a test loads it: its memory and its liveness.

- :class:`RssSampler`: a thread reading ``VmRSS`` from ``/proc/PID/status`` every few milliseconds,
  so a short spike (a burst of 3 MiB bodies held at once) is seen, not just the level afterwards.
- :class:`HealthProber`: ``GET /healthz`` every ~50 ms on its own keep-alive connection, from a
  separate *process*: a prober thread inside the test process would share the GIL with the load
  generator's threads, and the latencies it reports would be the client's stalls, not the webhook's.
  Run as ``python -m tests.support.monitors URL CA_FILE INTERVAL``; it probes until its stdin is
  closed (so it cannot outlive the test) and then prints one JSON object.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.paths import ROOT

MiB = 1024 * 1024


def _kib_fields(path: str, names: tuple[bytes, ...]) -> int:
    total = 0
    try:
        with open(path, "rb") as status:
            for line in status:
                if line.startswith(names):
                    total += int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return total


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", "rb") as children:
                found.extend(int(child) for child in children.read().split())
    except (FileNotFoundError, ProcessLookupError):
        pass
    return found


def rss_bytes(pid: int) -> int:
    """Memory ``pid`` holds, as its container's memory limit counts it (0 when it is gone): its
    resident set, plus the pages private to each child process. The webhook forks a child for each
    large review (:class:`ix_gpu.webhook.service.limits.HeavyLane`); the pages a child shares with
    its parent are counted once, in the parent's RSS."""
    total = _kib_fields(f"/proc/{pid}/status", (b"VmRSS:",))
    for child in _children(pid):
        total += _kib_fields(f"/proc/{child}/smaps_rollup", (b"Private_Clean:", b"Private_Dirty:"))
    return total


class RssSampler:
    """Samples ``pid``'s RSS every ``interval`` seconds in a thread while in its ``with`` block."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        """(wall-clock time, bytes): wall clock, to line peaks up with what clients were doing."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self.samples.append((time.time(), rss_bytes(self.pid)))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.samples.append((time.time(), rss_bytes(self.pid)))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append((time.time(), rss_bytes(self.pid)))

    @property
    def start(self) -> int:
        return self.samples[0][1]

    @property
    def last(self) -> int:
        return self.samples[-1][1]

    @property
    def max(self) -> int:
        return max(value for _, value in self.samples)

    @property
    def peak_time(self) -> float:
        """Wall-clock time of the (first) largest sample."""
        return max(self.samples, key=lambda sample: sample[1])[0]

    def summary(self) -> str:
        return (
            f"RSS start {self.start / MiB:.1f} MiB, max {self.max / MiB:.1f} MiB, "
            f"end {self.last / MiB:.1f} MiB ({len(self.samples)} samples)"
        )


@dataclass
class ProbeResult:
    """What the prober saw; latencies in seconds."""

    count: int = 0
    failures: list[str] = field(default_factory=list)
    max: float = 0.0
    p50: float = 0.0
    p99: float = 0.0
    slow: list[tuple[float, float]] = field(default_factory=list)
    """(wall-clock time the probe started, latency) of probes slower than the prober's threshold."""

    def summary(self) -> str:
        return (
            f"/healthz: {self.count} probes, max {self.max * 1000:.1f} ms, p99 {self.p99 * 1000:.1f} ms, "
            f"p50 {self.p50 * 1000:.1f} ms, {len(self.failures)} failures"
        )


class HealthProber:
    """Probes ``url``/healthz from a child process while in its ``with`` block; ``result`` after."""

    def __init__(self, url: str, ca_file: Path, interval: float = 0.05, slow: float = 0.05) -> None:
        self.url = url
        self.ca_file = ca_file
        self.interval = interval
        self.slow = slow
        self.result = ProbeResult()
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> HealthProber:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.monitors",
                self.url,
                str(self.ca_file),
                str(self.interval),
                str(self.slow),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env=env,
        )
        self._wait_first_probe()
        return self

    def _wait_first_probe(self) -> None:
        """The child prints one line once its first probe is answered: the window starts then."""
        assert self._process is not None and self._process.stdout is not None
        line = self._process.stdout.readline()
        if line.strip() != b"probing":
            self._process.kill()
            raise RuntimeError(f"health prober did not start: {line!r}")

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None
        try:
            out, _ = self._process.communicate(timeout=30)  # closes stdin: the child stops
        except subprocess.TimeoutExpired:
            self._process.kill()
            out, _ = self._process.communicate()
        try:
            data = json.loads(out)
        except ValueError:
            self.result = ProbeResult(failures=[f"prober printed {out[-300:]!r}"])
            return
        self.result = ProbeResult(
            count=data["count"],
            failures=data["failures"],
            max=data["max"],
            p50=data["p50"],
            p99=data["p99"],
            slow=[(t, s) for t, s in data["slow"]],
        )


def percentile(values: list[float], fraction: float) -> float:
    """The value at ``fraction`` of the sorted ``values`` (nearest rank, no interpolation); 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def _probe_main(url: str, ca_file: str, interval: float, slow: float) -> None:
    parts = urllib.parse.urlsplit(url)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=ca_file)
    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.buffer.read()  # returns at EOF: the parent closed the pipe (or died)
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()

    def connect() -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            parts.hostname or "", parts.port or 443, context=context, timeout=5
        )

    conn = connect()
    latencies: list[float] = []
    slow_probes: list[tuple[float, float]] = []
    failures: list[str] = []
    announced = False
    while not stop.is_set():
        wall, started = time.time(), time.perf_counter()
        try:
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            response.read()
            seconds = time.perf_counter() - started
            if response.status != 200:
                failures.append(f"{wall:.3f}: HTTP {response.status}")
            latencies.append(seconds)
            if seconds > slow:
                slow_probes.append((wall, seconds))
            if response.will_close:
                conn.close()
                conn = connect()
        except (OSError, http.client.HTTPException) as exc:
            failures.append(f"{wall:.3f}: {type(exc).__name__}: {exc}")
            conn.close()
            conn = connect()
        if not announced:
            print("probing", flush=True)
            announced = True
        stop.wait(interval)
    conn.close()
    result: dict[str, Any] = {
        "count": len(latencies),
        "failures": failures,
        "max": max(latencies, default=0.0),
        "p50": percentile(latencies, 0.5),
        "p99": percentile(latencies, 0.99),
        "slow": slow_probes,
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    _probe_main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
