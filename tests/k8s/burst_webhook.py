"""The webhook a burst runs against, in either of the two forms the tier has, behind one small
interface: its processes (for CPU and RSS), its own ``/metrics`` and a SIGKILL. A SIGKILL takes the
victim's counters and CPU seconds with it, so each form reads both just before the kill and keeps
them (``killed``): the burst's figures then cover the victim's reviews before it died too.

- :class:`HostWebhook`: one ``ix-gpu webhook`` host process (the fake-cri mini cluster, where pods
  are host processes and nothing runs the chart); a kill is followed by starting it again, as a
  kubelet would.
- :class:`ChartWebhook`: charts/ix-gpu installed with helm on the real-node cluster, its webhook
  Deployment's replicas in real containers (containerd, runc) behind the chart's Service and
  kube-proxy. A kill is a SIGKILL of one replica's first process from the host (``kill -9 1`` in the
  container); the kubelet restarts the container and the Service keeps the other replicas.
"""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

from tests.k8s.chart_values import real_node_chart_values
from tests.k8s.cluster import MiniCluster
from tests.k8s.histograms import added, buckets_of, buckets_quantile, ms
from tests.k8s.k8s_tier import build_helm
from tests.k8s.real_nodes import container_pids
from tests.k8s.real_release import Release
from tests.support.paths import ROOT
from tests.support.processes import Process
from tests.support.waiting import wait_until

RELEASE = "ixs"
ADMISSION_FAMILY = "ix_gpu_admission_duration_seconds"
CHART = ROOT / "charts" / "ix-gpu"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_delay_s(pid: int) -> float:
    """Seconds the threads of ``pid`` have spent runnable but waiting for a CPU (the second field
    of each thread's ``schedstat``): what a saturated host adds to a replica's answers, which
    its own latency histogram, started once a request is read, does not see. A thread that has
    exited since is not counted, so compare a replica with itself over a window."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the thread exited between the listing and the read
    return total / 1e9


TCP_COUNTERS = {
    "accepted": ("snmp", "Tcp:", "PassiveOpens"),
    "sent": ("snmp", "Tcp:", "OutSegs"),
    "retransmitted": ("snmp", "Tcp:", "RetransSegs"),
    "loss_probes": ("netstat", "TcpExt:", "TCPLossProbes"),
    "probe_recoveries": ("netstat", "TcpExt:", "TCPLossProbeRecovery"),
    "dsacks_received": ("netstat", "TcpExt:", "TCPDSACKRecv"),
    "timeouts": ("netstat", "TcpExt:", "TCPTimeouts"),
    "syn_retransmitted": ("netstat", "TcpExt:", "TCPSynRetrans"),
    "listen_drops": ("netstat", "TcpExt:", "ListenDrops"),
}
"""What :func:`tcp_counters` reads: connections accepted, segments sent and sent again, and of
those sent again the tail-loss probes (an answer's last segment unacknowledged within the
kernel's probe timeout, set from the connection's round trip), the retransmission timeouts
(200 ms at least) and the handshakes' SYN-ACKs; and connections the listen queue dropped (a
client then waits a second for its SYN again).

A probe tells a lost segment from a late acknowledgement only with the two counters beside it:
``probe_recoveries`` are probes that repaired a real loss, ``dsacks_received`` the peer's reports
of a segment it already had (the probe, or any retransmission, was spurious: the data had
arrived, its ACK had not). Linux arms the probe at twice the round trip plus 2 jiffies when an
answer left as two segments or more, but adds 200 ms when it left as one, so a one-segment answer
practically never shows a probe however late its ACK is: counts of probes compare only webhooks
whose answers leave in the same number of segments."""


def tcp_counters(pid: int) -> dict[str, int] | None:
    """The TCP counters of the network namespace of ``pid`` (its ``net/snmp`` and ``net/netstat``),
    as :data:`TCP_COUNTERS` names them. A replica in a pod of its own has the namespace to itself:
    these are its connections (the apiserver's, and the kubelet's probes). None for a process in
    this one's namespace (a host process: the counts would be the whole host's)."""
    if os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino:
        return None
    tables: dict[tuple[str, str], dict[str, int]] = {}
    for file in ("snmp", "netstat"):
        rows = [line.split() for line in Path(f"/proc/{pid}/net/{file}").read_text().splitlines()]
        for names, values in zip(rows[::2], rows[1::2], strict=False):
            if names and values and names[0] == values[0]:
                tables[file, names[0]] = dict(zip(names[1:], map(int, values[1:]), strict=False))
    return {name: tables[file, table][field] for name, (file, table, field) in TCP_COUNTERS.items()}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class KilledReplicas:
    """What SIGKILLed replicas had counted, read just before each kill (the reviews between that
    read and the signal, a few milliseconds' worth, are not in it)."""

    metrics: list[str] = field(default_factory=list)
    cpu_s: float = 0.0


class WebhookUnderTest(Protocol):
    killed: KilledReplicas

    def replica_pids(self) -> dict[str, list[int]]:
        """Each replica's processes, by replica name."""

    def metrics(self) -> list[str]:
        """Each running replica's own /metrics text (see ``killed`` for the replicas killed)."""

    def kill_one(self) -> dict[str, Any]:
        """SIGKILL one replica; returns when it serves again: what happened, with its seconds."""


def cpu_of(webhook: WebhookUnderTest) -> float:
    """CPU seconds of the replicas running now, and of those killed up to their kill."""
    running = sum(cpu_seconds(pid) for pids in webhook.replica_pids().values() for pid in pids)
    return running + webhook.killed.cpu_s


def cpu_by_replica(webhook: WebhookUnderTest) -> dict[str, float]:
    """CPU seconds of each replica running now (by pod name): how the work was shared."""
    return {name: sum(cpu_seconds(pid) for pid in pids) for name, pids in webhook.replica_pids().items()}


_RETRANS = re.compile(r"\bretrans:\d+/(\d+)")


def socket_retransmissions(pid: int) -> dict[str, tuple[str, int]]:
    """The TCP sockets open now in the network namespace of ``pid`` (``ss -ti`` there), each
    (``local peer``) with its side and the segments it has sent again. ``served``: accepted on
    one of the namespace's listening ports (the apiserver's connections to a replica, and
    probes); ``dialed``: opened from it (a replica's own watches of the apiserver)."""
    listing = subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "ss", "-tinaH"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    sockets = [
        (line.split(), listing[i + 1] if i + 1 < len(listing) and listing[i + 1][:1].isspace() else "")
        for i, line in enumerate(listing)
        if line[:1] and not line[:1].isspace()
    ]
    listening = {fields[3].rpartition(":")[2] for fields, _ in sockets if fields[0] == "LISTEN"}
    found: dict[str, tuple[str, int]] = {}
    for fields, info in sockets:
        if fields[0] == "LISTEN" or len(fields) < 5:
            continue
        side = "served" if fields[3].rpartition(":")[2] in listening else "dialed"
        sent_again = _RETRANS.search(info)
        found[f"{fields[3]} {fields[4]}"] = (side, int(sent_again.group(1)) if sent_again else 0)
    return found


def cpu_throttled(pid: int, root: Path = Path("/sys/fs/cgroup")) -> tuple[int, float] | None:
    """Periods in which the CPU cgroup of ``pid`` was throttled, and the seconds it spent so
    (its ``cpu.stat``, cgroup v1's ``cpu`` controller or v2's unified tree under ``root``): a
    replica over its CPU limit in a period waits for the next, up to 100 ms, and its own latency
    histogram does not see it. None where the file is not there."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            stat = root / controllers / path.lstrip("/") / "cpu.stat"
            if not stat.exists():
                stat = root / "cpu" / path.lstrip("/") / "cpu.stat"
        elif controllers == "":
            stat = root / path.lstrip("/") / "cpu.stat"
        else:
            continue
        try:
            fields = dict(row.split() for row in stat.read_text().splitlines() if row.count(" ") == 1)
        except OSError:
            continue
        if "throttled_usec" in fields:
            return int(fields["nr_throttled"]), int(fields["throttled_usec"]) / 1e6
        if "throttled_time" in fields:
            return int(fields["nr_throttled"]), int(fields["throttled_time"]) / 1e9
    return None


@dataclass
class HostView:
    """What the host shows of one replica at one moment (see :func:`host_view_by_replica`)."""

    cpu_wait_s: float
    tcp: dict[str, int] | None
    sockets: dict[str, tuple[str, int]] | None
    throttled: tuple[int, float] | None = None


def host_view_by_replica(webhook: WebhookUnderTest) -> dict[str, HostView]:
    """Each running replica's seconds waiting for a CPU, its CPU cgroup's throttling, and in a pod
    of its own its TCP counters and open sockets (:func:`run_delay_s`, :func:`cpu_throttled`,
    :func:`tcp_counters`, :func:`socket_retransmissions`; its first process's)."""
    views = {}
    for name, pids in webhook.replica_pids().items():
        try:
            tcp = tcp_counters(pids[0]) if pids else None
            sockets = socket_retransmissions(pids[0]) if tcp is not None else None
            throttled = cpu_throttled(pids[0]) if pids else None
            views[name] = HostView(sum(run_delay_s(pid) for pid in pids), tcp, sockets, throttled)
        except (OSError, subprocess.CalledProcessError):
            continue  # gone between the listing and the reads (a killed replica): left out
    return views


def host_view_figures(
    before: dict[str, HostView], after: dict[str, HostView], reviews: int
) -> dict[str, Any]:
    """What the burst added to :func:`host_view_by_replica`, for the replicas running at both
    reads: the CPU wait per review over all of them, each one's wait, its TCP counts, and the
    retransmissions of its sockets open at the end by side (what a socket had sent again before
    the burst taken off; sockets closed during it are in the TCP counts only)."""
    names = sorted(before.keys() & after.keys())
    waits = [after[name].cpu_wait_s - before[name].cpu_wait_s for name in names]
    figures: dict[str, Any] = {
        "webhook_cpu_wait_ms_per_review": round(sum(waits) / max(reviews, 1) * 1000, 3),
        "webhook_cpu_wait_s_by_replica": sorted((round(w, 2) for w in waits), reverse=True),
    }
    tcp = []
    for name in names:
        first, last = before[name], after[name]
        if first.tcp is None or last.tcp is None or first.sockets is None or last.sockets is None:
            continue
        counts = {counter: last.tcp[counter] - first.tcp[counter] for counter in TCP_COUNTERS}
        for side in ("served", "dialed"):
            counts[f"open_{side}_retransmitted"] = sum(
                total - first.sockets.get(key, (side, 0))[1]
                for key, (where, total) in last.sockets.items()
                if where == side
            )
        tcp.append(counts)
    if tcp:
        figures["webhook_tcp_by_replica"] = sorted(tcp, key=lambda c: c["accepted"], reverse=True)
    throttled = [
        [last[0] - first[0], round(last[1] - first[1], 3)]
        for first, last in ((before[name].throttled, after[name].throttled) for name in names)
        if first is not None and last is not None
    ]
    if throttled:
        figures["webhook_cpu_throttled_by_replica"] = sorted(throttled, reverse=True)
    return figures


def admission_figures(before: str, after: str) -> dict[str, Any]:
    """The apiserver's admission histogram over the burst: what ``after`` (the reads before each
    restart and the last one) counted less what ``before`` (read before the burst) had."""
    family = "apiserver_admission_webhook_admission_duration_seconds"
    match = {"operation": "CREATE", "type": "admit"}
    admitted = added(buckets_of(before, family, match), buckets_of(after, family, match))
    return {
        "admissions_counted": int(admitted.get(float("inf"), 0)),
        "admission_p50_ms": ms(buckets_quantile(admitted, 0.5)),
        "admission_p99_ms": ms(buckets_quantile(admitted, 0.99)),
    }


GO_REVIEWS = "ix_gpu_go_reference_reviews"
"""The Go reference webhook's one counter (bench/go-webhook), without the ``_total`` suffix."""


def reviews_in(text: str) -> int:
    """The reviews one replica's /metrics counted: ix-gpu's histogram count, or the Go
    reference's counter."""
    counted = buckets_of(text, ADMISSION_FAMILY, {}).get(float("inf"))
    if counted is not None:
        return int(counted)
    for metric in text_string_to_metric_families(text):
        if metric.name == GO_REVIEWS:
            return int(sum(s.value for s in metric.samples if s.name == f"{GO_REVIEWS}_total"))
    return 0


def webhook_figures(webhook: WebhookUnderTest) -> dict[str, Any]:
    """The webhook's own review histogram: the running replicas' and the killed ones' last; and
    how the reviews were shared among the running replicas (the apiserver keeps its connections,
    so one replica can get most of them; the Go reference counts its reviews for this too)."""
    family = ADMISSION_FAMILY
    running = webhook.metrics()
    own = buckets_of("\n".join([*running, *webhook.killed.metrics]), family, {})
    killed = buckets_of("\n".join(webhook.killed.metrics), family, {})
    shares = [reviews_in(text) for text in running]
    return {
        "webhook_reviews_by_replica": sorted(shares, reverse=True),
        "webhook_reviews_counted": int(own.get(float("inf"), 0)),
        "webhook_reviews_counted_before_kills": int(killed.get(float("inf"), 0)),
        "webhook_p99_ms": ms(buckets_quantile(own, 0.99)),
    }


def pod_metrics(pod: dict[str, Any], port: int) -> str:
    """A replica's /metrics at its pod IP, over TLS left unverified: this reads figures from each
    replica, not the webhook's identity (the apiserver checks that on every review)."""
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    url = f"https://{pod['status']['podIP']}:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10, context=tls) as response:
        text: str = response.read().decode()
        return text


def rss_by_replica(webhook: WebhookUnderTest) -> dict[str, float]:
    return {
        name: round(sum(rss_mib(pid) for pid in pids), 1) for name, pids in webhook.replica_pids().items()
    }


class HostWebhook:
    def __init__(self, cluster: MiniCluster) -> None:
        self.webhook = cluster.install_webhook()
        self.killed = KilledReplicas()

    @property
    def process(self) -> Process:
        assert self.webhook.process is not None
        return self.webhook.process

    def replica_pids(self) -> dict[str, list[int]]:
        return {"ix-gpu-webhook": [self.process.pid]}

    def metrics(self) -> list[str]:
        with self.webhook.client() as client:
            return [client.get("/metrics").text]

    def kill_one(self) -> dict[str, Any]:
        self.killed.metrics += self.metrics()
        self.killed.cpu_s += cpu_seconds(self.process.pid)
        at = time.monotonic()
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.popen.wait()
        self.webhook.start(ready=True)
        return {"killed": "ix-gpu-webhook", "serving_again_s": round(time.monotonic() - at, 2)}


def webhook_values(replicas: int, cpu_request: str | None = None) -> dict[str, Any]:
    """The chart's ``webhook`` values for a burst: ``replicas``, and with ``cpu_request`` that CPU
    request instead of the chart's (its CPU weight on a contended node; the limit stays)."""
    values: dict[str, Any] = {"replicas": replicas}
    if cpu_request is not None:
        values["resources"] = {"requests": {"cpu": cpu_request}}
    return values


class ChartWebhook:
    def __init__(
        self, cluster: MiniCluster, work: Path, replicas: int, cpu_request: str | None = None
    ) -> None:
        """``helm install --wait`` of charts/ix-gpu with the real-node values and ``replicas``
        webhook replicas (``cpu_request``: see :func:`webhook_values`); RuntimeError with helm's
        words when it fails."""
        assert cluster.real_nodes is not None and cluster.real_nodes.images is not None
        values = real_node_chart_values(cluster.real_nodes.images)
        values["webhook"] = webhook_values(replicas, cpu_request)
        self.release = Release(cluster, build_helm(), work, values)
        self.replicas = replicas
        self.killed = KilledReplicas()
        started = time.monotonic()
        result = self.release.helm(
            "install", RELEASE, str(CHART), "--create-namespace", "-f", str(self.release.values_file()),
            "--wait", "--timeout", "5m", timeout=330,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"helm install: {result.stdout}{result.stderr}")
        self.install_s = round(time.monotonic() - started, 1)

    def pods(self) -> list[dict[str, Any]]:
        return self.release.pods("webhook")

    def replica_pids(self) -> dict[str, list[int]]:
        return {p["metadata"]["name"]: container_pids(p, "webhook") for p in self.pods() if _ready(p)}

    def metrics(self) -> list[str]:
        return [self._metrics_of(pod) for pod in self.pods()]

    def _metrics_of(self, pod: dict[str, Any]) -> str:
        return pod_metrics(pod, self.release.values.get("webhook", {}).get("port", 8443))

    def kill_one(self) -> dict[str, Any]:
        (victim, *_) = sorted(self.pods(), key=lambda p: str(p["metadata"]["name"]))
        name = victim["metadata"]["name"]
        restarts = _restarts(victim)
        pids = container_pids(victim, "webhook")
        self.killed.metrics.append(self._metrics_of(victim))
        self.killed.cpu_s += sum(cpu_seconds(pid) for pid in pids)
        at = time.monotonic()
        os.kill(pids[0], signal.SIGKILL)

        def back() -> bool:
            try:
                pods = [p for p in self.pods() if p["metadata"]["name"] == name]
            except (OSError, AssertionError):  # the apiserver down meanwhile (another fault)
                return False
            return bool(pods) and _restarts(pods[0]) > restarts and _ready(pods[0])

        wait_until(back, f"webhook replica {name} restarted and Ready", 120, interval=0.2)
        return {"killed": name, "serving_again_s": round(time.monotonic() - at, 2)}


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _restarts(pod: dict[str, Any]) -> int:
    return sum(s.get("restartCount", 0) for s in pod.get("status", {}).get("containerStatuses") or [])
