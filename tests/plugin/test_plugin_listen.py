"""The real ``ix-gpu plugin`` without ``--metrics-host``: /healthz and /metrics answer on ``::1`` and
on ``127.0.0.1`` (one dual-stack socket on ``::``), so the kubelet's probe and Prometheus reach them
on IPv4-only, IPv6-only and dual-stack clusters alike; the log says which families it took.

The fallback to IPv4 where the kernel has no IPv6, and explicit addresses, are in
tests/serving/test_listen_socket.py (the same function binds every listener)."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.plugin.plugin_testkit import FAST_HEALTH
from tests.support.net import free_port
from tests.support.plugin_process import PluginProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError):
        return None


def test_the_default_metrics_host_answers_on_both_families(short_tmp: Path, fake_devices: Path) -> None:
    (short_tmp / "dp").mkdir()
    port = free_port()
    plugin = PluginProcess(
        short_tmp, short_tmp / "dp", fake_devices.read_text(), FAST_HEALTH, short_tmp, metrics_port=port
    ).start()
    try:
        # No kubelet here, so /healthz may well say 503 (not registered): any answer is one.
        wait_until(lambda: status(f"http://127.0.0.1:{port}/healthz"), "/healthz on 127.0.0.1", 20)
        for host in ("127.0.0.1", "[::1]"):
            assert status(f"http://{host}:{port}/healthz") in (200, 503), host
            assert status(f"http://{host}:{port}/metrics") == 200, host
        log = plugin.running.output()
        assert f"listening on [::]:{port}, IPv6 and IPv4" in log, log[-2000:]
        assert f"serving /healthz and /metrics on [::]:{port}" in log, log[-2000:]
    finally:
        plugin.terminate(10)
