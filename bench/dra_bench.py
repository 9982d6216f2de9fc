"""DRA plugin benchmark: ResourceSlice publish after start, NodePrepareResources latency and RSS of
the real ``ix-gpu dra`` process, against the targets in docs/benchmarks.md.

    .venv/bin/python bench/dra_bench.py [--claims 200] [--rounds 3] [--boards 8]
        [--layout partitionable|plain|shared|part-shared] [--fake-api] [--json]

What is measured, per round (each round starts a fresh ``ix-gpu dra --backend fake`` process with
fresh plugin, CDI and checkpoint directories):

- **publish after start**: from spawning the process to its ResourceSlice being visible on the API
  server with this node's devices (target < 2 s). A watch on the slice, opened before the spawn,
  sees it appear, so nothing polls the API server meanwhile. The slice is deleted between rounds,
  so every round measures a create. The time until the registration socket appears is shown too.
- **NodePrepareResources**: N claims, one call each, as the kubelet makes them: grpcio (a second
  gRPC implementation, as the kubelet's grpc-go is) over the plugin's unix socket, with the claims
  created on the API server beforehand and an allocation written into their status, so each
  Prepare reads its claim from the API server, writes a CDI spec and the checkpoint. p50/p99 over
  all rounds (target p99 < 50 ms); then the same for NodeUnprepareResources. The plugin process's
  CPU time per call is shown too: latencies on a small shared machine move with the other load,
  CPU time much less.
- **RSS**: VmRSS and VmHWM (the peak) from /proc of the plugin process after its prepares and
  unprepares (target <= 40 MiB).

The API server is a real kube-apiserver v1.37.2 with etcd, both on loopback ports (tests/k8s's
helpers; binaries from the tests/k8s/build.sh cache, ``--k8s-bin`` or ``IX_GPU_K8S_BIN``):
no controllers, no scheduler, no kubelet. The Node object is created by this script, labelled
``ix-gpu.io/gpu.allocation=dra``. Where no kube-apiserver binary is found (or with ``--fake-api``),
the stand-in of tests/dra (tests/dra/fake_resource_api.py, plain HTTP) serves instead, and the
output says so.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ix_gpu.devicemodel.labels import GPU_ALLOCATION  # noqa: E402
from ix_gpu.dra.api import dra_v1_pb2 as dra  # noqa: E402
from ix_gpu.dra.api import dra_v1_pb2_grpc as dra_grpc  # noqa: E402

K8S_VERSION = "v1.37.2"
DRIVER = "gpu.iluvatar.com"
NODE = "bench-node"
NAMESPACE = "default"
RESOURCE = "/apis/resource.k8s.io/v1"
SLICE = f"{NODE}-{DRIVER}"

TARGETS = {"publish_s": 2.0, "prepare_p99_ms": 50.0, "rss_mib": 40.0, "rss_peak_mib": 40.0}


# --------------------------------------------------------------------------- inputs


def devices_yaml(boards: int) -> str:
    """``boards`` BI-V150 boards of two chips each, with PCI bus IDs and a driver version."""
    lines = ["vendor: iluvatar", "driverVersion: 4.3.0", "controlNodes: [/dev/itrctl]", "boards:"]
    for b in range(boards):
        lines += [f"  - id: board{b}", "    product: Iluvatar BI-V150", f"    numaNode: {b * 2 // boards}"]
        lines.append("    chips:")
        for p in range(2):
            minor = b * 2 + p
            lines += [
                f"      - uuid: GPU-dra-bench-{minor:04d}",
                f"        minor: {minor}",
                f"        pciBusId: '0000:{0x10 + minor:02x}:00.0'",
            ]
    return "\n".join(lines) + "\n"


def claim_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
    }


LAYOUTS = {
    "partitionable": ("flags:\n  splitboard: true\n", ()),
    "plain": ("flags:\n  splitboard: true\n", ("--partitionable", "off")),
    "shared": (
        "flags:\n  splitboard: true\nsharing:\n  timeSlicing:\n    replicas: 4\n",
        ("--partitionable", "off"),  # as auto: a shared node's boards are not partitioned
    ),
    "part-shared": (
        "flags:\n  splitboard: true\nsharing:\n  timeSlicing:\n    replicas: 4\n",
        ("--partitionable", "with-shares"),
    ),
}
"""The ix-config and extra flags of each layout the plugin publishes (ix_gpu/dra/devices.py)."""


def published_devices(layout: str, boards: int) -> int:
    """Devices the slice lists: each board and its two chips when partitionable, else the chips."""
    return boards * 3 if layout.startswith("part") else boards * 2


def allocated_device(layout: str, n: int, chips: int) -> str:
    """The device of claim ``n``: with partitionable boards, every third claim a whole board."""
    if layout.startswith("part") and n % 3 == 0:
        return f"board-{(n // 3 * 2) % chips}"
    return f"gpu-{n % chips}"


def allocation(device: str, shared: bool = False, n: int = 0) -> dict[str, Any]:
    """What the scheduler writes into a claim's status (``status.allocation``); a shared device's
    result carries the share's id and the memory it consumed."""
    result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    if shared:
        result.update(shareID=f"5e1a0000-0000-4000-8000-{n:012d}", consumedCapacity={"memory": "8Gi"})
    return {
        "devices": {"results": [result]},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
            ]
        },
    }


def rss_mib(pid: int, name: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {name} in /proc/{pid}/status")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_pressure() -> str:
    """How much of the last 60 s runnable tasks waited for a CPU (Linux PSI), when the kernel says."""
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return ""
    fields = dict(part.split("=", 1) for part in some.split()[1:])
    return f"; CPU pressure (PSI some avg60) {fields.get('avg60', '?')} %"


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least ``q`` of the samples at or below it."""
    rank = max(1, -(-len(sorted_values) * q // 1))
    return sorted_values[int(rank) - 1]


# --------------------------------------------------------------------------- the API server


class Cluster:
    """What the benchmark needs of an API server: set up the node and claims, see the slice."""

    description: str
    kubeconfig: Path

    def prepare_node(self) -> None:
        raise NotImplementedError

    def create_allocated_claims(self, count: int, chips: int, layout: str) -> list[tuple[str, str]]:
        """``count`` claims, each allocated one device of this node; (name, uid) of each."""
        raise NotImplementedError

    def delete_slice(self) -> None:
        raise NotImplementedError

    def slice_watch(self) -> SliceWatch:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


@dataclass
class SliceWatch:
    """Records when this node's slice is first seen listing devices."""

    seen_at: float | None = None
    devices: int = 0
    event: threading.Event = field(default_factory=threading.Event)
    stop: Callable[[], None] = lambda: None

    def saw(self, body: Any) -> None:
        spec = (body or {}).get("spec") or {}
        if self.seen_at is None and spec.get("devices"):
            self.seen_at = time.monotonic()
            self.devices = len(spec["devices"])
            self.event.set()


def find_apiserver(given: str | None) -> Path | None:
    """kube-apiserver v1.37.2: ``--k8s-bin``, ``IX_GPU_K8S_BIN``, else the newest
    tests/k8s/build.sh cache directory of that version (nothing is built here: that takes tens of
    minutes)."""
    for candidate in (given, os.environ.get("IX_GPU_K8S_BIN")):
        if candidate:
            return Path(candidate) if (Path(candidate) / "kube-apiserver").is_file() else None
    cache = Path(os.environ.get("IX_GPU_CACHE", Path.home() / ".cache" / "ix-gpu"))
    found = sorted(
        (p.parent for p in cache.glob(f"k8s-{K8S_VERSION}-*/bin/kube-apiserver") if os.access(p, os.X_OK)),
        key=lambda d: (d / "kube-apiserver").stat().st_mtime,
    )
    return found[-1] if found else None


class RealCluster(Cluster):
    """etcd and kube-apiserver on loopback, from tests/k8s/k8s_tier.py."""

    def __init__(self, bin_dir: Path, work: Path) -> None:
        from tests.k8s.k8s_tier import K8sBinaries, start_etcd, start_kube_apiserver

        binaries = K8sBinaries(bin_dir)
        logs = work / "logs"
        logs.mkdir()
        self.etcd = start_etcd(binaries, logs)
        try:
            self.api = start_kube_apiserver(binaries, self.etcd, work, logs)
        except BaseException:
            self.etcd.stop()
            raise
        self.kubeconfig = self.api.kubeconfig
        version = self.call("GET", "/version")
        self.description = f"kube-apiserver {version.get('gitVersion', '?')} (real, loopback, with etcd)"

    def call(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self.api.request(method, path, body)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {answer}")
        return answer

    def prepare_node(self) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {GPU_ALLOCATION: "dra"}},
        }
        self.call("POST", "/api/v1/nodes", node)
        device_class = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
        self.call("POST", f"{RESOURCE}/deviceclasses", device_class)

    def create_allocated_claims(self, count: int, chips: int, layout: str) -> list[tuple[str, str]]:
        out = []
        collection = f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims"
        for n in range(count):
            created = self.call("POST", collection, claim_body(f"bench-claim-{n:05d}"))
            device = allocated_device(layout, n, chips)
            created["status"] = {"allocation": allocation(device, layout.endswith("shared"), n)}
            name = created["metadata"]["name"]
            self.call("PUT", f"{collection}/{name}/status", created)
            out.append((name, created["metadata"]["uid"]))
        return out

    def delete_slice(self) -> None:
        for name in (SLICE, f"{SLICE}-counters-0"):
            status, answer = self.api.request("DELETE", f"{RESOURCE}/resourceslices/{name}")
            if status not in (200, 404):
                raise RuntimeError(f"DELETE slice {name}: {status} {answer}")

    def slice_watch(self) -> SliceWatch:
        listed = self.call("GET", f"{RESOURCE}/resourceslices?fieldSelector=metadata.name%3D{SLICE}")
        version = listed["metadata"]["resourceVersion"]
        url = urllib.parse.urlsplit(self.api.url)
        connection = http.client.HTTPSConnection(
            url.hostname or "127.0.0.1",
            url.port,
            context=ssl.create_default_context(cafile=str(self.api.ca_path)),
        )
        query = urllib.parse.urlencode(
            {
                "watch": "1",
                "fieldSelector": f"metadata.name={SLICE}",
                "resourceVersion": version,
                "timeoutSeconds": "120",
            }
        )
        connection.request(
            "GET", f"{RESOURCE}/resourceslices?{query}", headers={"Authorization": f"Bearer {self.api.token}"}
        )
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"watch: {response.status} {response.read()[:300]!r}")
        watch = SliceWatch()

        def follow() -> None:
            with contextlib.suppress(OSError, ValueError):
                for line in response:
                    event = json.loads(line)
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        watch.saw(event.get("object"))
                        if watch.event.is_set():
                            return

        def stop() -> None:
            if connection.sock is not None:  # wakes the reader
                with contextlib.suppress(OSError):
                    connection.sock.shutdown(socket.SHUT_RDWR)
            connection.close()

        threading.Thread(target=follow, daemon=True, name="slice-watch").start()
        watch.stop = stop
        return watch

    def close(self) -> None:
        self.api.stop()
        self.etcd.stop()


class FakeCluster(Cluster):
    """tests/dra's stand-in API server, in this process; the slice is looked for every 2 ms in its
    memory (no HTTP), as it has no watch."""

    def __init__(self, work: Path, reason: str) -> None:
        from tests.dra.fake_resource_api import FakeResourceApi, serving

        self.fake = FakeResourceApi()
        self._serving = serving(self.fake)
        api = self._serving.__enter__()
        self.kubeconfig = work / "kubeconfig"
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": api.base_url}}],
                    "users": [{"name": "bench", "user": {"token": str(api.token)}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "bench"}}],
                    "current-context": "fake",
                }
            )
        )
        self.description = f"FAKE API server (tests/dra/fake_resource_api.py, plain HTTP): {reason}"

    def prepare_node(self) -> None:
        self.fake.add_node(NODE, labels={GPU_ALLOCATION: "dra"})

    def create_allocated_claims(self, count: int, chips: int, layout: str) -> list[tuple[str, str]]:
        out = []
        for n in range(count):
            name, uid = f"bench-claim-{n:05d}", f"00000000-0000-4000-8000-{n:012d}"
            results = allocation(allocated_device(layout, n, chips), layout.endswith("shared"), n)["devices"][
                "results"
            ]
            self.fake.add_claim(NAMESPACE, name, uid, results)
            out.append((name, uid))
        return out

    def delete_slice(self) -> None:
        with self.fake.lock:
            self.fake.slices.pop(SLICE, None)
            self.fake.slices.pop(f"{SLICE}-counters-0", None)

    def slice_watch(self) -> SliceWatch:
        watch = SliceWatch()
        done = threading.Event()

        def follow() -> None:
            while not done.is_set() and not watch.event.is_set():
                with self.fake.lock:
                    stored = self.fake.slices.get(SLICE)
                if stored is not None:
                    watch.saw(stored)
                time.sleep(0.002)

        threading.Thread(target=follow, daemon=True, name="slice-poll").start()
        watch.stop = done.set
        return watch

    def close(self) -> None:
        self._serving.__exit__(None, None, None)


# --------------------------------------------------------------------------- one round


@dataclass
class Round:
    publish_s: float
    socket_s: float
    devices: int
    prepare_ms: list[float]
    unprepare_ms: list[float]
    cpu_per_prepare_ms: float
    cpu_per_unprepare_ms: float
    rss_mib: float
    rss_peak_mib: float


@contextlib.contextmanager
def dra_process(
    work: Path, cluster: Cluster, devices_file: Path, log: Path, flags: tuple[str, ...] = ()
) -> Iterator[subprocess.Popen[bytes]]:
    argv = [
        *(sys.executable, "-m", "ix_gpu", "dra", "--backend", "fake", "--fake-devices", str(devices_file)),
        *("--node-name", NODE, "--kubeconfig", str(cluster.kubeconfig), "--config", str(work / "ix-config")),
        *("--plugins-dir", str(work / "plugins"), "--registry-dir", str(work / "registry")),
        *("--cdi-dir", str(work / "cdi"), "--log-level", "INFO", *flags),
    ]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def one_round(
    n: int,
    base: Path,
    cluster: Cluster,
    devices_file: Path,
    claims: list[tuple[str, str]],
    expected: int,
    layout: str,
) -> Round:
    work = base / f"r{n}"
    work.mkdir()
    config, flags = LAYOUTS[layout]
    (work / "ix-config").write_text(config)
    log = base / f"dra-round{n}.log"
    cluster.delete_slice()
    watch = cluster.slice_watch()
    registration = work / "registry" / f"{DRIVER}-reg.sock"
    try:
        started = time.monotonic()
        with dra_process(work, cluster, devices_file, log, flags) as proc:
            socket_at = None
            deadline = started + 60
            while not watch.event.is_set():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"ix-gpu dra exited {proc.returncode}; log {log}:\n{log.read_text()[-3000:]}"
                    )
                if socket_at is None and registration.exists():
                    socket_at = time.monotonic()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no ResourceSlice within 60 s; log {log}:\n{log.read_text()[-3000:]}")
                watch.event.wait(0.005)
            assert watch.seen_at is not None
            while socket_at is None and time.monotonic() < deadline:
                if registration.exists():
                    socket_at = time.monotonic()
                time.sleep(0.005)
            if watch.devices != expected:
                raise RuntimeError(f"the slice lists {watch.devices} devices, expected {expected}")
            prepare, unprepare, cpu_prepare, cpu_unprepare = kubelet_calls(work, proc.pid, claims)
            time.sleep(0.5)
            rss, peak = rss_mib(proc.pid, "VmRSS"), rss_mib(proc.pid, "VmHWM")
    finally:
        watch.stop()
    return Round(
        publish_s=watch.seen_at - started,
        socket_s=(socket_at or float("nan")) - started,
        devices=watch.devices,
        prepare_ms=prepare,
        unprepare_ms=unprepare,
        cpu_per_prepare_ms=cpu_prepare,
        cpu_per_unprepare_ms=cpu_unprepare,
        rss_mib=rss,
        rss_peak_mib=peak,
    )


def kubelet_calls(
    work: Path, pid: int, claims: list[tuple[str, str]]
) -> tuple[list[float], list[float], float, float]:
    """Prepare every claim (one call each, in turn), check each answer, then unprepare them."""
    channel = grpc.insecure_channel(f"unix://{work / 'plugins' / DRIVER / 'dra.sock'}")
    try:
        stub = dra_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
        grpc.channel_ready_future(channel).result(timeout=10)
        prepare: list[float] = []
        cpu_before = cpu_seconds(pid)
        for name, uid in claims:
            request = dra.NodePrepareResourcesRequest(
                claims=[dra.Claim(namespace=NAMESPACE, name=name, uid=uid)]
            )
            t0 = time.perf_counter()
            answer = stub.NodePrepareResources(request, timeout=30)
            prepare.append((time.perf_counter() - t0) * 1000)
            entry = answer.claims[uid]
            if entry.error or not entry.devices or not entry.devices[0].cdi_device_ids:
                raise RuntimeError(f"prepare of {name}: {entry}")
        cpu_prepare = (cpu_seconds(pid) - cpu_before) / len(claims) * 1000
        specs = len(list((work / "cdi").glob("*-claim-*.json")))
        if specs != len(claims):
            raise RuntimeError(f"{specs} CDI specs after {len(claims)} prepares")
        unprepare: list[float] = []
        cpu_before = cpu_seconds(pid)
        for name, uid in claims:
            undo = dra.NodeUnprepareResourcesRequest(
                claims=[dra.Claim(namespace=NAMESPACE, name=name, uid=uid)]
            )
            t0 = time.perf_counter()
            undone = stub.NodeUnprepareResources(undo, timeout=30)
            unprepare.append((time.perf_counter() - t0) * 1000)
            if undone.claims[uid].error:
                raise RuntimeError(f"unprepare of {name}: {undone.claims[uid].error}")
        cpu_unprepare = (cpu_seconds(pid) - cpu_before) / len(claims) * 1000
        if list((work / "cdi").glob("*-claim-*.json")):
            raise RuntimeError("CDI specs left after unprepare")
    finally:
        channel.close()
    return prepare, unprepare, cpu_prepare, cpu_unprepare


# --------------------------------------------------------------------------- report


def summarise(rounds: list[Round]) -> dict[str, float]:
    prepare = sorted(x for r in rounds for x in r.prepare_ms)
    unprepare = sorted(x for r in rounds for x in r.unprepare_ms)
    publish = [r.publish_s for r in rounds]
    return {
        "publish_s": max(publish),
        "publish_median_s": statistics.median(publish),
        "publish_min_s": min(publish),
        "registration_socket_median_s": statistics.median(r.socket_s for r in rounds),
        "prepare_p50_ms": percentile(prepare, 0.5),
        "prepare_p99_ms": percentile(prepare, 0.99),
        "prepare_max_ms": prepare[-1],
        "first_prepare_median_ms": statistics.median(r.prepare_ms[0] for r in rounds),
        "plugin_cpu_per_prepare_ms": statistics.median(r.cpu_per_prepare_ms for r in rounds),
        "unprepare_p50_ms": percentile(unprepare, 0.5),
        "unprepare_p99_ms": percentile(unprepare, 0.99),
        "plugin_cpu_per_unprepare_ms": statistics.median(r.cpu_per_unprepare_ms for r in rounds),
        "rss_mib": max(r.rss_mib for r in rounds),
        "rss_peak_mib": max(r.rss_peak_mib for r in rounds),
    }


ROWS = (
    ("publish_s", "ResourceSlice visible after start, worst round", "s", "< 2 s"),
    ("publish_median_s", "  median round", "s", ""),
    ("publish_min_s", "  best round", "s", ""),
    ("registration_socket_median_s", "  registration socket after start, median", "s", ""),
    ("prepare_p50_ms", "NodePrepareResources p50", "ms", ""),
    ("prepare_p99_ms", "NodePrepareResources p99", "ms", "< 50 ms"),
    ("prepare_max_ms", "  max", "ms", ""),
    ("first_prepare_median_ms", "  first call after start, median round", "ms", ""),
    ("plugin_cpu_per_prepare_ms", "  plugin CPU per prepare", "ms", ""),
    ("unprepare_p50_ms", "NodeUnprepareResources p50", "ms", ""),
    ("unprepare_p99_ms", "NodeUnprepareResources p99", "ms", ""),
    ("plugin_cpu_per_unprepare_ms", "  plugin CPU per unprepare", "ms", ""),
    ("rss_mib", "RSS (VmRSS) after the calls, worst round", "MiB", "<= 40 MiB"),
    ("rss_peak_mib", "peak RSS (VmHWM), worst round", "MiB", "<= 40 MiB"),
)


def print_table(figures: dict[str, float], header: list[str]) -> None:
    for line in header:
        print(line)
    print()
    print(f"  {'figure':48} {'value':>10}  {'unit':4} {'target':10} verdict")
    print(f"  {'-' * 48} {'-' * 10}  {'-' * 4} {'-' * 10} -------")
    for key, label, unit, target in ROWS:
        value = figures[key]
        bound = TARGETS.get(key)
        within = bound is not None and (value <= bound if unit == "MiB" else value < bound)
        verdict = "" if bound is None else ("ok" if within else "OVER")
        print(f"  {label:48} {value:10.3f}  {unit:4} {target:10} {verdict}".rstrip())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--claims", type=int, default=200, metavar="N", help="claims prepared per round (default 200)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        metavar="R",
        help="plugin processes started, one after the other (default 3)",
    )
    parser.add_argument(
        "--boards", type=int, default=8, metavar="B", help="fake boards of 2 chips (default 8)"
    )
    parser.add_argument(
        "--layout",
        choices=tuple(LAYOUTS),
        default="partitionable",
        help="what the plugin publishes: each board and its chips with shared counters (partitionable, "
        "the default on Kubernetes 1.36+), the chips alone (plain), or the chips in 4 memory shares "
        "each (shared)",
    )
    parser.add_argument(
        "--fake-api", action="store_true", help="use tests/dra's fake API server, not kube-apiserver"
    )
    parser.add_argument("--k8s-bin", metavar="DIR", help="a directory with kube-apiserver v1.37.x")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) and print it")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args()
    if args.claims < 1 or args.rounds < 1 or args.boards < 1:
        parser.error("--claims, --rounds and --boards must be at least 1")

    load = os.getloadavg()
    base = Path(tempfile.mkdtemp(prefix="ixdrab", dir="/tmp"))  # short: unix socket paths
    devices_file = base / "devices.yaml"
    devices_file.write_text(devices_yaml(args.boards))
    chips = args.boards * 2
    expected = published_devices(args.layout, args.boards)
    cluster: Cluster
    bin_dir = None if args.fake_api else find_apiserver(args.k8s_bin)
    if bin_dir is None:
        reason = "--fake-api" if args.fake_api else f"no kube-apiserver {K8S_VERSION} binary found"
        cluster = FakeCluster(base, reason)
    else:
        cluster = RealCluster(bin_dir, base)
    try:
        cluster.prepare_node()
        t0 = time.monotonic()
        claims = cluster.create_allocated_claims(args.claims, chips, args.layout)
        setup_s = time.monotonic() - t0
        rounds = [
            one_round(n, base, cluster, devices_file, claims, expected, args.layout)
            for n in range(args.rounds)
        ]
    finally:
        cluster.close()
        if args.keep:
            print(f"work directory kept: {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    figures = summarise(rounds)
    if args.json:
        print(
            json.dumps(
                {
                    "api_server": cluster.description,
                    "layout": args.layout,
                    "claims": args.claims,
                    "rounds": args.rounds,
                    **figures,
                },
                indent=2,
            )
        )
        return 0
    print_table(
        figures,
        [
            f"ix-gpu dra, fake backend: {args.boards} boards x 2 chips, splitboard, layout {args.layout} "
            f"({expected} devices)",
            f"API server: {cluster.description}",
            f"{args.rounds} rounds (a fresh process each) x {args.claims} claims created and allocated "
            f"beforehand ({setup_s:.1f} s), one NodePrepareResources call per claim, then one "
            "NodeUnprepareResources each",
            "publish per round: " + ", ".join(f"{r.publish_s:.3f}" for r in rounds) + " s",
            f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} at the start, "
            f"{os.getloadavg()[0]:.2f} at the end{cpu_pressure()}",
        ],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
