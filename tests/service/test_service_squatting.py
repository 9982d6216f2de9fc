"""Clients holding the webhook's connections must not lock anyone out (the connection cap's policy,
:mod:`ix_gpu.serving.connection_slots`), against the real ``ix-gpu webhook`` with its default caps.

The squatter of the issue: 128 keep-alive TLS connections (the default ``--max-connections``), one
tiny request on each every 20 s, the first at once; here every 2 s, ten times as busy, and every
connection the server closes is opened again a second later. While it runs, new clients (one fresh
TLS connection and one review each, as the apiserver's next connection) must all be served,
kubelet-like probes (a new connection per probe, 1 s timeout) on the probe port must never fail,
nor those on the HTTPS port, and memory must stay under the chart's limit. Then the same with 200
connections that send nothing. Each runs with the squatter on another address (another pod: the
per-address cap leaves it 64 slots) and on the clients' own address (behind one NAT: the
squatter's idle connections make room).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import orjson
import pytest

from ix_gpu.webhook.service.limit_settings import Limits
from tests.support.monitors import MiB, RssSampler, rss_bytes
from tests.support.objects import pod, review
from tests.support.squatting import KubeletProber, Squatter, new_client
from tests.support.webhook_process import WebhookProcess

SMALL = orjson.dumps(review(pod()))
RSS_LIMIT = 256 * MiB
"""The chart's memory limit for the webhook container."""
SQUAT = Limits().max_connections
INTERVAL = 2.0
NEW_CLIENTS = 60
SAME_ADDRESS = "127.0.0.1"
OTHER_POD = "127.0.0.2"


@contextmanager
def _webhook(tmp_path: Path, cert_dir: Path, *extra: str) -> Iterator[WebhookProcess]:
    with WebhookProcess(tmp_path, cert_dir, extra=["--probe-port", "0", *extra]).start() as webhook:
        yield webhook


def _new_clients(webhook: WebhookProcess, count: int, spacing: float) -> Counter[str]:
    outcomes: Counter[str] = Counter()
    for _ in range(count):
        outcomes[new_client(webhook.url, webhook.cert_dir / "ca.crt", SMALL)] += 1
        time.sleep(spacing)
    return outcomes


@contextmanager
def _probed(webhook: WebhookProcess) -> Iterator[list[tuple[str, KubeletProber]]]:
    """Liveness and readiness probes on the probe port, and a liveness probe on the HTTPS port."""
    probe_url, ca = webhook.probe_url, webhook.cert_dir / "ca.crt"
    probers = [
        ("probe port /healthz", KubeletProber(probe_url, "/healthz")),
        ("probe port /readyz", KubeletProber(probe_url, "/readyz")),
        ("https /healthz", KubeletProber(webhook.url, "/healthz", ca)),
    ]
    with ExitStack() as stack:
        for _, prober in probers:
            stack.enter_context(prober)
        yield probers


def _report(
    what: str,
    outcomes: Counter[str],
    squat: Squatter,
    probers: list[tuple[str, KubeletProber]],
    rss: RssSampler,
    evicted: float,
) -> str:
    lines = [
        f"{what}: new clients {dict(outcomes)}",
        f"  squatter: {squat.connections} connections made, {squat.answers} answers, "
        f"{squat.closed_by_server} closed by the server; webhook evictions {evicted:.0f}",
        *(f"  {prober.record.summary(name)}" for name, prober in probers),
        f"  {rss.summary()}",
    ]
    return "\n".join(lines)


def _assert_probes_held(probers: list[tuple[str, KubeletProber]]) -> None:
    """The probe port's probes never fail. The HTTPS port's are never refused either; one may take
    over the kubelet's 1 s on this shared 2-core machine, where the squatter's handshakes compete
    for the CPU (a handshake costs the webhook about a millisecond)."""
    for name, prober in probers:
        record = prober.record
        assert record.count >= 10, (name, record.count)
        if name.startswith("probe port"):
            assert record.failures == [], (name, record.failures)
        else:
            assert all(f.startswith("slow") for f in record.failures), (name, record.failures)
            assert len(record.failures) <= record.count // 10, (name, record.failures)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("source", [OTHER_POD, SAME_ADDRESS], ids=["other-pod", "same-address"])
def test_keep_alive_squatter_locks_nobody_out(tmp_path: Path, cert_dir: Path, source: str) -> None:
    with _webhook(tmp_path, cert_dir) as webhook:
        assert webhook.process is not None
        pid = webhook.process.pid
        with (
            RssSampler(pid, 0.05) as rss,
            Squatter(webhook.url, webhook.cert_dir / "ca.crt", SQUAT, INTERVAL, source) as squat,
        ):
            squat.wait_open(60)
            with _probed(webhook) as probers:
                outcomes = _new_clients(webhook, NEW_CLIENTS, 0.1)
            answers = squat.answers
        evicted = webhook.metric("ix_gpu_connections_evicted_total")
        print("\n" + _report(f"squatter from {source}", outcomes, squat, probers, rss, evicted))
        assert webhook.metric("ix_gpu_admission_internal_errors_total") == 0
    assert outcomes == Counter({"HTTP 200": NEW_CLIENTS}), outcomes
    _assert_probes_held(probers)
    # It did squat: held at least its address's share of connections, and used them.
    assert squat.peak_open >= Limits().max_connections_per_address and answers >= SQUAT // 4, answers
    assert evicted > 0
    assert rss.max < RSS_LIMIT, rss.summary()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("source", [OTHER_POD, SAME_ADDRESS], ids=["other-pod", "same-address"])
def test_200_silent_connections_lock_nobody_out(tmp_path: Path, cert_dir: Path, source: str) -> None:
    """The header timeout is set past the test's length, so only the cap's policy serves the new
    clients: connections that never sent a request make room at once."""
    with _webhook(tmp_path, cert_dir, "--header-timeout", "120") as webhook:
        assert webhook.process is not None
        pid = webhook.process.pid
        baseline = rss_bytes(pid)
        with (
            RssSampler(pid, 0.05) as rss,
            Squatter(webhook.url, webhook.cert_dir / "ca.crt", 200, None, source) as squat,
        ):
            squat.wait_open(60)
            with _probed(webhook) as probers:
                outcomes = _new_clients(webhook, 99, 0.05)
        evicted = webhook.metric("ix_gpu_connections_evicted_total")
        print("\n" + _report(f"200 silent from {source}", outcomes, squat, probers, rss, evicted))
    assert outcomes == Counter({"HTTP 200": 99}), outcomes
    _assert_probes_held(probers)
    assert rss.max < RSS_LIMIT and rss.max - baseline < 64 * MiB, rss.summary()
