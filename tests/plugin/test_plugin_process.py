"""The real ``ix-gpu plugin`` process: SIGTERM, /healthz and /metrics, and usage errors."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.plugin.kubelet_fake import FakeKubelet
from tests.plugin.plugin_testkit import FAST_HEALTH, REPO, write_config

pytestmark = pytest.mark.timeout(60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ix_gpu(*args: str) -> list[str]:
    return [sys.executable, "-m", "ix_gpu", *args]


def start_plugin(base: Path, devices: Path, metrics_port: int = 0) -> subprocess.Popen[bytes]:
    directory = base / "dp"
    config = write_config(base, FAST_HEALTH)
    return subprocess.Popen(
        ix_gpu(
            "plugin",
            "--backend",
            "fake",
            "--fake-devices",
            str(devices),
            "--config",
            str(config),
            "--device-plugin-dir",
            str(directory),
            "--metrics-port",
            str(metrics_port),
        ),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_sigterm_sends_all_unhealthy_then_removes_socket(short_tmp: Path, fake_devices: Path) -> None:
    directory = short_tmp / "dp"
    directory.mkdir()
    port = free_port()

    async def scenario() -> tuple[int, str]:
        kubelet = FakeKubelet(directory)
        await kubelet.start()
        proc = start_plugin(short_tmp, fake_devices, port)
        try:
            await kubelet.wait_for(lambda: kubelet.updates, timeout=20, what="registration of the process")
            assert set(kubelet.last_update().health.values()) == {"Healthy"}
            status, body = await asyncio.to_thread(http_get, port, "/healthz")
            assert (status, body) == (200, "ok\n")
            status, metrics = await asyncio.to_thread(http_get, port, "/metrics")
            assert status == 200
            assert 'ix_gpu_plugin_devices{health="Healthy"} 2.0' in metrics
            assert 'ix_gpu_plugin_registrations_total{result="ok"} 1.0' in metrics
            proc.send_signal(signal.SIGTERM)
            await kubelet.wait_for(lambda: kubelet.stream_ends, timeout=10, what="stream end")
            rc = await asyncio.to_thread(proc.wait, 10)
        finally:
            if proc.poll() is None:
                proc.kill()
            await kubelet.stop()
        final = kubelet.last_update()
        assert len(final.devices) == 2
        assert set(final.health.values()) == {"Unhealthy"}
        assert kubelet.errors == []  # the stream ended cleanly after the final update
        assert proc.stdout is not None
        return rc, proc.stdout.read().decode()

    rc, log = asyncio.run(scenario())
    assert rc == 0, log
    assert not (directory / "iluvatar-gpu.sock").exists()
    assert "SIGTERM" in log


def test_healthz_reports_library_failure(short_tmp: Path, fake_devices: Path) -> None:
    (short_tmp / "dp").mkdir()
    port = free_port()
    fake_devices.write_text(fake_devices.read_text().replace("boards:", "libraryError: ixml gone\nboards:"))
    proc = start_plugin(short_tmp, fake_devices, port)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                status, body = http_get(port, "/healthz")
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "metrics port never opened"
                time.sleep(0.1)
        assert status == 503
        assert "ixml gone" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plugin", "--backend", "fake"], "--backend fake needs --fake-devices FILE"),
        (["plugin", "--metrics-port", "70000"], "must be 0-65535"),
        (["devices", "--backend", "fake", "--fake-devices", "/nonexistent"], "no such file"),
        (["devices", "--config", "/nonexistent/ix-config"], "cannot read"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = subprocess.run(ix_gpu(*args), cwd=REPO, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_config_file_is_a_usage_error(short_tmp: Path, fake_devices: Path) -> None:
    config = write_config(short_tmp, "sharing:\n  timeSlicing:\n    replicas: -1\n")
    result = subprocess.run(
        ix_gpu("devices", "--backend", "fake", "--fake-devices", str(fake_devices), "--config", str(config)),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "sharing.timeSlicing.replicas" in result.stderr


def test_devices_lists_what_would_be_advertised(short_tmp: Path, fake_devices: Path) -> None:
    config = write_config(
        short_tmp, "flags:\n  splitboard: true\nsharing:\n  timeSlicing:\n    replicas: 2\n"
    )
    result = subprocess.run(
        ix_gpu("devices", "--backend", "fake", "--fake-devices", str(fake_devices), "--config", str(config)),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "COREX_HOME": "/nonexistent"},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "8 devices" in lines[0]
    assert lines[1].split()[:5] == ["ID", "CHIPS", "BOARD", "MINOR", "NUMA"]
    assert len(lines) == 10
    assert lines[2].split()[0].endswith("::0")
