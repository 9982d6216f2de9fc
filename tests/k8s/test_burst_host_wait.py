"""What the scale bench reads from the host about each replica beside its own figures: the time its
threads waited for a CPU and the connections it accepted over the burst (``burst_webhook.py``).
Read from real processes: this one, and a child in a network namespace of its own, as a replica's
pod has."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.k8s.burst_webhook import (
    TCP_COUNTERS,
    HostView,
    cpu_throttled,
    host_view_by_replica,
    host_view_figures,
    run_delay_s,
    socket_retransmissions,
    tcp_counters,
    webhook_values,
)
from tests.k8s.host_cpu import control_plane_figures, process_clocks
from tests.support.processes import Process

_ACCEPTS_THREE = """
import socket, sys, time
server = socket.create_server(("127.0.0.1", 0))
clients = [socket.create_connection(server.getsockname()) for _ in range(3)]
accepted = [server.accept() for _ in range(3)]
print("ready", flush=True)
time.sleep(60)
"""


def test_a_process_in_its_own_network_namespace_has_its_own_tcp_counts() -> None:
    script = f'ip link set lo up && exec "{sys.executable}" -c "$0"'
    child = subprocess.Popen(
        ["unshare", "--net", "sh", "-c", script, _ACCEPTS_THREE],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stderr is not None
        line = child.stdout.readline()
        if not line:
            pytest.fail(f"the child in a new network namespace did not start: {child.stderr.read()}")
        assert line.strip() == "ready"
        counters = tcp_counters(child.pid)
        assert counters is not None
        assert counters["accepted"] == 3
        assert counters["listen_drops"] == counters["timeouts"] == 0
        assert counters["probe_recoveries"] == counters["dsacks_received"] == 0
        assert counters["sent"] >= 3  # the handshakes' SYN-ACKs at least
        sockets = socket_retransmissions(child.pid)
        assert sorted(side for side, _ in sockets.values()) == ["dialed"] * 3 + ["served"] * 3
        assert all(sent_again == 0 for _, sent_again in sockets.values())
    finally:
        child.kill()
        child.wait()


def test_a_process_sharing_this_network_namespace_has_no_count_of_its_own() -> None:
    assert tcp_counters(os.getpid()) is None


def test_the_cpu_wait_of_a_process_is_read_from_its_threads_and_only_grows() -> None:
    first = run_delay_s(os.getpid())
    # Runnable children beside this process on every CPU make it wait at least now and then.
    spinners = [
        subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<1.0: pass"])
        for _ in range((os.cpu_count() or 1) * 2)
    ]
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        pass
    for spinner in spinners:
        spinner.wait()
    assert run_delay_s(os.getpid()) > first >= 0.0


def test_the_burst_adds_each_replicas_wait_tcp_counts_and_open_sockets_retransmissions() -> None:
    def tcp(accepted: int, retransmitted: int = 0, listen_drops: int = 0) -> dict[str, int]:
        counts = dict.fromkeys(TCP_COUNTERS, 0)
        counts.update(accepted=accepted, retransmitted=retransmitted, listen_drops=listen_drops)
        return counts

    served, dialed = "10.0.0.5:8443 10.0.0.1:40000", "10.0.0.5:51000 10.96.0.1:443"
    before = {
        "a": HostView(1.0, tcp(10, 1), {served: ("served", 1), dialed: ("dialed", 2)}),
        "b": HostView(2.0, tcp(20), {}),
        "gone": HostView(5.0, tcp(1), {}),
    }
    opened_since = "10.0.0.5:8443 10.0.0.1:40002"
    after = {
        "a": HostView(
            1.5, tcp(13, 4, 1), {served: ("served", 2), opened_since: ("served", 1), dialed: ("dialed", 2)}
        ),
        "b": HostView(2.25, tcp(20), {}),
        "new": HostView(9.0, tcp(9), {}),
    }
    before["a"].throttled, after["a"].throttled = (2, 0.5), (5, 0.75)
    figures = host_view_figures(before, after, reviews=250)
    assert figures["webhook_cpu_wait_ms_per_review"] == 3.0
    assert figures["webhook_cpu_wait_s_by_replica"] == [0.5, 0.25]
    opened = {"open_served_retransmitted": 2, "open_dialed_retransmitted": 0}
    none = {"open_served_retransmitted": 0, "open_dialed_retransmitted": 0}
    assert figures["webhook_tcp_by_replica"] == [tcp(3, 3, 1) | opened, tcp(0) | none]
    assert figures["webhook_cpu_throttled_by_replica"] == [[3, 0.25]]
    host = {"a": HostView(1.0, None, None)}
    assert host_view_figures(host, {"a": HostView(2.0, None, None)}, reviews=1000) == {
        "webhook_cpu_wait_ms_per_review": 1.0,
        "webhook_cpu_wait_s_by_replica": [1.0],
    }


def test_a_replicas_cpu_throttling_is_read_from_its_cgroup_v1_or_v2(tmp_path: Path) -> None:
    mine = cpu_throttled(os.getpid())
    assert mine is not None and mine[0] >= 0 and mine[1] >= 0.0
    path = Path(f"/proc/{os.getpid()}/cgroup").read_text()
    v1 = "nr_periods 500\nnr_throttled 7\nthrottled_time 250000000\n"
    v2 = "usage_usec 9\nnr_periods 500\nnr_throttled 3\nthrottled_usec 40000\n"
    for line in path.splitlines():
        _, controllers, where = line.split(":", 2)
        if "cpu" in controllers.split(","):
            (tmp_path / "cpu" / where.lstrip("/")).mkdir(parents=True, exist_ok=True)
            (tmp_path / "cpu" / where.lstrip("/") / "cpu.stat").write_text(v1)
            assert cpu_throttled(os.getpid(), tmp_path) == (7, 0.25)
        elif controllers == "":
            (tmp_path / "v2" / where.lstrip("/")).mkdir(parents=True, exist_ok=True)
            (tmp_path / "v2" / where.lstrip("/") / "cpu.stat").write_text(v2)
            assert cpu_throttled(os.getpid(), tmp_path / "v2") == (3, 0.04)


class _Replicas:
    """A webhook under test whose replicas are given processes (see ``WebhookUnderTest``)."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids

    def replica_pids(self) -> dict[str, list[int]]:
        return self.pids


def test_a_replica_gone_before_its_reads_is_left_out_of_the_view() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    views = host_view_by_replica(_Replicas({"here": [os.getpid()], "gone": [gone.pid]}))
    assert list(views) == ["here"]
    assert views["here"].tcp is None and views["here"].cpu_wait_s >= 0.0


def test_the_webhooks_values_give_the_replicas_and_a_cpu_request_only_when_asked() -> None:
    assert webhook_values(3) == {"replicas": 3}
    assert webhook_values(3, "1") == {"replicas": 3, "resources": {"requests": {"cpu": "1"}}}


def test_the_control_planes_clocks_are_its_live_processes_and_a_restarted_one_is_left_out() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    here = Process("here", sleeper, Path(os.devnull))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        processes = {
            "kube-apiserver": here,
            "etcd": Process("gone", gone, Path(os.devnull)),
            "fake-cri-gpu-a": here,  # a node's process, not the control plane's
        }
        clocks = process_clocks(processes)
        assert list(clocks) == ["kube-apiserver"]
        assert clocks["kube-apiserver"][0] == here.pid
    finally:
        here.popen.kill()
        here.popen.wait()
    before = {"kube-apiserver": (10, 1.0, 0.5), "etcd": (11, 2.0, 1.0), "kube-scheduler": (12, 0.0, 0.0)}
    after = {"kube-apiserver": (10, 3.0, 1.5), "etcd": (99, 9.0, 9.0)}  # etcd restarted: not comparable
    assert control_plane_figures(before, after, 1000) == {
        "control_plane_by_process": {
            "kube-apiserver": {"cpu_ms_per_review": 2.0, "cpu_wait_ms_per_review": 1.0},
        }
    }
    assert control_plane_figures(before, {"etcd": (99, 0.0, 0.0)}, 1000) == {}
