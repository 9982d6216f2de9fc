"""Load benchmark of ``ix-gpu webhook`` side by side with a Go reference and a FastAPI floor.

    python bench/webhook_load/run.py [--rounds 3] [--duration 10] [--connections 64]
        [--server-cpu 0] [--client-cpu 1] [--tree prev=/path/to/an/older/checkout] [--rss]
        [--paced-ms 50]

Servers, all started at once and each pinned to the same core (taskset), measured one at a time:

- ``ix-gpu``: ``python -m ix_gpu webhook`` as the image ships it: the request path compiled by
  mypyc (``scripts/native-tree.sh`` builds a copy of this checkout into the work directory first,
  about a minute); built-in config, metrics, one JSON log line per admission to a file, no
  kubeconfig;
- ``pure``: the same from this checkout's Python sources, uncompiled (``pip install .`` without
  ``IX_GPU_COMPILE=1``);
- ``go``: ``bench/go-webhook``, a Go standard-library webhook doing the same injection (built
  here into ``~/.cache/ix-gpu/``);
- ``bare``: ``bare_app.py``, FastAPI + orjson and a hand-written injection of the same profile;
- ``floor`` (only when named in ``--targets``): ``floor_app.py``, uvloop + TLS + httptools answering
  each body with ix-gpu's answer computed at start: the server's cost without ix-gpu's work;
- ``lean`` (only when named in ``--targets``): ``floor_app.py --handler`` on the compiled build:
  the same minimal server with ix-gpu's handler answering (parse, mutation, metrics, log line), so
  ``ix-gpu`` minus ``lean`` is what ix-gpu's HTTP layer costs (uvicorn's protocol and the limits);
- any ``--tree NAME=PATH``: ``python -m ix_gpu webhook`` from another checkout (an A/B).

Each round runs wrk (one thread, pinned to the client core, keep-alive HTTPS) against every server
for every body, in turn, so background load on a shared machine falls on all of them alike.
Throughput is compared within a round; ratios are printed as the range over rounds. CPU per
request is the server's utime+stime (``/proc/<pid>/stat``, all threads) over the run divided by
the requests answered: unlike req/s it hardly moves with what else runs on the machine. Before
measuring, each server's answer to each body is checked: the same patch as ix-gpu's, but for
ix-gpu's ``injected-items`` record.

``--paced-ms N`` measures latency instead of throughput: one keep-alive connection sending a review
N ms after each answer, so each server sits idle between reviews as under single pod creates
(its code and data leave the CPU's caches in between). wrk's latency starts when the request is
written, after the pause. The report then compares p50 and p99 latency.

``--rss`` adds one continuous run of 100,000+ requests against ix-gpu with RSS sampled every 5 s.
Needs ``wrk`` (Debian package), ``taskset`` and ``go``. Not a test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import math
import os
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GO_SOURCE = ROOT / "bench" / "go-webhook"
GO_BINARY = Path.home() / ".cache" / "ix-gpu" / "go-webhook"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from bodies import write_bodies  # noqa: E402

from ix_gpu.config.webhook_config import default_config  # noqa: E402
from ix_gpu.devicemodel.labels import INJECTED, INJECTED_ITEMS  # noqa: E402
from ix_gpu.webhook.certs.authority import generate_bundle, write_bundle  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
RECORD_PATH = "/metadata/annotations/" + INJECTED_ITEMS.replace("~", "~0").replace("/", "~1")
INJECTED_PATH = "/metadata/annotations/" + INJECTED.replace("~", "~0").replace("/", "~1")


@dataclass
class Server:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (every thread), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14 and 15 of proc(5)


def _context(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def _wait_serving(server: Server, ca: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise SystemExit(f"{server.name} exited with {server.proc.returncode}")
        try:
            conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=_context(ca), timeout=2)
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            conn.close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{server.name} did not start")


def _patch(server: Server, ca: Path, body: Path) -> list[dict[str, Any]]:
    """The ops the server answers ``body`` with, without ix-gpu's record."""
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=_context(ca), timeout=5)
    conn.request("POST", "/mutate", body=body.read_bytes(), headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    data = json.loads(answer.read())
    conn.close()
    assert answer.status == 200, (server.name, data)
    response = data["response"]
    assert response["allowed"] is True and "patch" in response, (server.name, response)
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    for op in ops:  # a created annotation map holds the record too
        if op["path"] == "/metadata/annotations":
            op["value"].pop(INJECTED_ITEMS, None)
        elif op["path"] == INJECTED_PATH:  # another checkout's config may have another digest
            op["value"] = op["value"].partition("@")[0]
    return [op for op in ops if op["path"] != RECORD_PATH]


def _wrk(
    url: str, body: Path, seconds: float, connections: int, cpu: int, delay_ms: int | None = None
) -> dict[str, Any]:
    args = [
        "taskset",
        "-c",
        str(cpu),
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{round(seconds)}s",
        "--timeout",
        "10s",
    ]
    args += ["-s", str(HERE / "post.lua"), url, "--", str(body)]
    if delay_ms is not None:
        args.append(str(delay_ms))
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    line = next(line for line in out.splitlines() if line.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
    return result


def _measured(server: Server, args: argparse.Namespace, body: Path, seconds: float) -> dict[str, Any]:
    url = f"https://127.0.0.1:{server.port}/mutate"
    cpu_before = _cpu_seconds(server.proc.pid)
    if args.paced_ms is None:
        result = _wrk(url, body, seconds, args.connections, args.client_cpu)
    else:
        result = _wrk(url, body, seconds, 1, args.client_cpu, delay_ms=args.paced_ms)
    cpu = _cpu_seconds(server.proc.pid) - cpu_before
    result["cpu_us_per_request"] = cpu * 1e6 / max(result["requests"], 1)
    return result


def build_go() -> Path:
    """``bench/go-webhook`` built into the cache (go's own build cache makes a rebuild cheap)."""
    GO_BINARY.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["go", "build", "-o", str(GO_BINARY), "."], cwd=GO_SOURCE, check=True)
    return GO_BINARY


def start(name: str, tree: Path | None, workdir: Path, certs: Path, port: int, cpu: int) -> Server:
    digest = default_config().digest()
    env = {**os.environ, "PYTHONPATH": str(tree or ROOT)}
    if name == "go":
        command = [str(GO_BINARY), "-cert", str(certs / "tls.crt"), "-key", str(certs / "tls.key")]
        command += ["-addr", f"127.0.0.1:{port}", "-digest", digest]
    elif name == "bare":
        command = [sys.executable, str(HERE / "bare_app.py"), "--port", str(port), "--cert-dir", str(certs)]
        command += ["--digest", digest]
    elif name in ("floor", "lean"):
        command = [sys.executable, str(HERE / "floor_app.py"), "--port", str(port), "--cert-dir", str(certs)]
        command += ["--bodies", str(workdir / "bodies"), *(["--handler"] if name == "lean" else [])]
    else:
        command = [sys.executable, "-m", "ix_gpu", "webhook", "--port", str(port), "--cert-dir", str(certs)]
    log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(
        ["taskset", "-c", str(cpu), *command], stdout=log, stderr=log, env=env, cwd=workdir
    )
    return Server(name, port, proc)


def _span(values: list[float], fmt: str) -> str:
    low, high = min(values), max(values)
    return format(low, fmt) if f"{low:{fmt}}" == f"{high:{fmt}}" else f"{low:{fmt}}-{high:{fmt}}"


_Column = tuple[str, int, str, Any]
"""A report column: header, width, number format, and what it reads from one run."""
_Ratio = tuple[str, Any]
"""A ratio line's label and what it divides: the first server's run by another's."""

_LOAD_COLUMNS: list[_Column] = [
    ("req/s", 13, ",.0f", lambda r: r["rps"]),
    ("CPU µs/req", 11, ".0f", lambda r: r["cpu_us_per_request"]),
    ("p99 ms", 11, ".1f", lambda r: r["p99_us"] / 1000),
]
_LOAD_RATIOS: list[_Ratio] = [
    ("throughput", lambda m, o: m["rps"] / o["rps"]),
    ("CPU per request", lambda m, o: m["cpu_us_per_request"] / o["cpu_us_per_request"]),
]
_PACED_COLUMNS: list[_Column] = [
    ("p50 µs", 11, ".0f", lambda r: r["p50_us"]),
    ("p99 µs", 11, ".0f", lambda r: r["p99_us"]),
    ("CPU µs/req", 11, ".0f", lambda r: r["cpu_us_per_request"]),
]
_PACED_RATIOS: list[_Ratio] = [
    ("p50", lambda m, o: m["p50_us"] / max(o["p50_us"], 1)),
    ("p99", lambda m, o: m["p99_us"] / max(o["p99_us"], 1)),
]


def report(servers: list[Server], bodies: dict[str, Path], rounds: int, paced_ms: int | None = None) -> str:
    """Each server's figures per body as ranges over rounds, then the first server's against each
    other one, round by round: throughput and CPU, or with ``paced_ms`` latency (one review at a
    time, ``paced_ms`` after each answer)."""
    columns, ratios = (_LOAD_COLUMNS, _LOAD_RATIOS) if paced_ms is None else (_PACED_COLUMNS, _PACED_RATIOS)
    header = f"{'body':8} {'server':8} {'requests':>9} "
    header += " ".join(f"{name:>{width}}" for name, width, _, _ in columns) + f" {'errors':>6}"
    lines = (
        [] if paced_ms is None else [f"one review every {paced_ms} ms after the last answer, one connection"]
    )
    lines.append(header)
    for body in bodies:
        for server in servers:
            runs = server.runs[body]
            errors = sum(sum(run["errors"].values()) for run in runs)
            cells = " ".join(
                f"{_span([read(r) for r in runs], fmt):>{width}}" for _, width, fmt, read in columns
            )
            lines.append(
                f"{body:8} {server.name:8} {sum(r['requests'] for r in runs):9d} {cells} {errors:6d}"
            )
    lines.append("")
    main, others = servers[0], servers[1:]
    for body in bodies:
        for other in others:
            pairs = list(zip(main.runs[body], other.runs[body], strict=True))
            parts = []
            for label, divide in ratios:
                values = [divide(m, o) for m, o in pairs]
                parts.append(f"{label} {_span(values, '.2f')}x (median {statistics.median(values):.2f}x)")
            lines.append(f"{body}: {main.name} / {other.name}: {', '.join(parts)} ({rounds} rounds)")
    return "\n".join(lines)


def rss_run(server: Server, args: argparse.Namespace, body: Path) -> str:
    """One continuous run of at least ``--rss-requests``, RSS sampled every 5 s."""
    url = f"https://127.0.0.1:{server.port}/mutate"
    warm = _wrk(url, body, 3, args.connections, args.client_cpu)
    seconds = max(10, math.ceil(args.rss_requests * 1.15 / max(warm["rps"], 1.0)))
    samples = [_rss_kib(server.proc.pid)]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(5):
            samples.append(_rss_kib(server.proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    run = _wrk(url, body, seconds, args.connections, args.client_cpu)
    stop.set()
    sampler.join()
    samples.append(_rss_kib(server.proc.pid))
    series = " ".join(f"{kib / 1024:.0f}" for kib in samples)
    return f"RSS MiB of {server.name}, every 5 s of one {run['requests']}-request run: {series}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=10, help="seconds per run (default 10)")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--port", type=int, default=18943, help="the first of consecutive ports")
    parser.add_argument(
        "--targets", default="ix-gpu,go,pure", help="comma-separated: ix-gpu, go, pure, bare, floor, lean"
    )
    parser.add_argument(
        "--tree", action="append", default=[], metavar="NAME=PATH", help="also ix-gpu from another checkout"
    )
    parser.add_argument("--rss", action="store_true", help="also the 100k-request RSS run of ix-gpu")
    parser.add_argument("--rss-requests", type=int, default=100_000)
    parser.add_argument(
        "--paced-ms",
        type=int,
        default=None,
        metavar="N",
        help="latency, not throughput: one connection, a review N ms after each answer",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, bodies)")
    args = parser.parse_args()
    for tool in ("wrk", "taskset", "go"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (wrk: apt-get install -y wrk; taskset: util-linux)")
    targets: list[tuple[str, Path | None]] = [(name, None) for name in args.targets.split(",")]
    targets += [(spec.partition("=")[0], Path(spec.partition("=")[2]).resolve()) for spec in args.tree]
    if any(name == "go" for name, _ in targets):
        build_go()
    workdir = Path(tempfile.mkdtemp(prefix="ix-gpu-bench-"))
    if any(name in ("ix-gpu", "lean") for name, _ in targets):
        native = workdir / "native-tree"
        subprocess.run(["bash", str(ROOT / "scripts" / "native-tree.sh"), str(native)], check=True, cwd=ROOT)
        targets = [(name, native if name in ("ix-gpu", "lean") else tree) for name, tree in targets]
    certs = workdir / "certs"
    write_bundle(generate_bundle(["localhost"], ["127.0.0.1"]), certs)
    bodies = write_bodies(workdir / "bodies")
    print(", ".join(f"{name}: {path.stat().st_size} bytes" for name, path in bodies.items()))
    servers = [
        start(name, tree, workdir, certs, args.port + i, args.server_cpu)
        for i, (name, tree) in enumerate(targets)
    ]
    try:
        for server in servers:
            _wait_serving(server, certs / "ca.crt")
        for body in bodies.values():
            expected = _patch(servers[0], certs / "ca.crt", body)
            for server in servers[1:]:
                assert _patch(server, certs / "ca.crt", body) == expected, (
                    f"{server.name} injects differently"
                )
        for server in servers:  # warm-up: connections, caches, the JIT-less interpreter's dicts
            _measured(server, args, bodies["pod-14k"], 2)
        for round_ in range(args.rounds):
            for name, body in bodies.items():
                for server in servers if round_ % 2 == 0 else reversed(servers):
                    server.runs.setdefault(name, []).append(_measured(server, args, body, args.duration))
        print(report(servers, bodies, args.rounds, args.paced_ms))
        if args.rss:
            print(rss_run(servers[0], args, bodies["pod-14k"]))
        results = [{"server": s.name, "runs": s.runs} for s in servers]
        (workdir / "results.json").write_text(json.dumps(results, indent=2))
        print(f"details: {workdir / 'results.json'}")
    finally:
        for server in servers:
            server.proc.send_signal(signal.SIGTERM)
        for server in servers:
            try:
                server.proc.wait(15)
            except subprocess.TimeoutExpired:
                server.proc.kill()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
