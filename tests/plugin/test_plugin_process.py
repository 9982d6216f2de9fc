"""The real ``ix-gpu plugin`` process: SIGTERM, /healthz and /metrics, what it imports, and usage
errors."""

from __future__ import annotations

import asyncio
import signal
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2 as pb
from tests.plugin.kubelet_fake import FakeKubelet
from tests.plugin.plugin_testkit import FAST_HEALTH, write_config
from tests.support.cli import ix_gpu, ix_gpu_process
from tests.support.net import free_port
from tests.support.plugin_process import PluginProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def start_plugin(base: Path, devices: Path, metrics_port: int = 0) -> PluginProcess:
    """The plugin serving into ``base/dp`` with a 0.1 s health interval; its log is in ``base``."""
    return PluginProcess(
        base, base / "dp", devices.read_text(), FAST_HEALTH, base, metrics_port=metrics_port
    ).start()


def http_get(port: int, path: str, host: str = "127.0.0.1") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=2) as response:
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
        plugin = start_plugin(short_tmp, fake_devices, port)
        try:
            await kubelet.wait_for(lambda: kubelet.updates, timeout=20, what="registration of the process")
            assert set(kubelet.last_update().health.values()) == {"Healthy"}
            status, body = await asyncio.to_thread(http_get, port, "/healthz")
            assert (status, body) == (200, "ok\n")
            status, metrics = await asyncio.to_thread(http_get, port, "/metrics")
            assert status == 200
            assert 'ix_gpu_plugin_devices{health="Healthy"} 2.0' in metrics
            assert 'ix_gpu_plugin_registrations_total{result="success"} 1.0' in metrics
            assert "ix_gpu_plugin_registered 1.0" in metrics
            plugin.popen.send_signal(signal.SIGTERM)
            await kubelet.wait_for(lambda: kubelet.stream_ends, timeout=10, what="stream end")
            rc = await asyncio.to_thread(plugin.popen.wait, 10)
        finally:
            plugin.stop()
            await kubelet.stop()
        final = kubelet.last_update()
        assert len(final.devices) == 2
        assert set(final.health.values()) == {"Unhealthy"}
        assert kubelet.errors == []  # the stream ended cleanly after the final update
        return rc, plugin.running.output()

    rc, log = asyncio.run(scenario())
    assert rc == 0, log
    assert not (directory / "iluvatar-gpu.sock").exists()
    assert "SIGTERM" in log


def test_healthz_reports_library_failure(short_tmp: Path, fake_devices: Path) -> None:
    (short_tmp / "dp").mkdir()
    port = free_port()
    fake_devices.write_text(fake_devices.read_text().replace("boards:", "libraryError: ixml gone\nboards:"))
    plugin = start_plugin(short_tmp, fake_devices, port)

    def healthz() -> tuple[int, str] | None:
        try:
            return http_get(port, "/healthz")
        except (urllib.error.URLError, ConnectionError):
            return None

    try:
        status, body = wait_until(healthz, "the metrics port to open", 20, process=plugin.running)
        assert status == 503
        assert "ixml gone" in body
    finally:
        plugin.terminate(10)


def test_metrics_host_binds_one_address_and_a_taken_port_is_one_error_line(
    short_tmp: Path, fake_devices: Path
) -> None:
    """Pods that share a network namespace (hostNetwork, or fake-cri's) each bind their own address;
    a port already taken there stops the plugin with one line naming the address, no traceback."""
    directory = short_tmp / "dp"
    directory.mkdir()
    config = write_config(short_tmp, FAST_HEALTH)
    port = free_port()
    (short_tmp / "dp2").mkdir()
    common = [
        "plugin", "--backend", "fake", "--fake-devices", str(fake_devices), "--config", str(config),
        "--metrics-port", str(port), "--metrics-host", "127.0.0.2",
    ]  # fmt: skip
    first = ix_gpu_process("plugin-a", *common, "--device-plugin-dir", str(directory), log_dir=short_tmp)
    try:

        def answering() -> bool:
            try:
                return http_get(port, "/healthz", host="127.0.0.2")[0] in (200, 503)
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_until(
            answering,
            "the first plugin's /healthz on 127.0.0.2",
            20,
            process=first,
        )
        with pytest.raises(urllib.error.URLError):
            http_get(port, "/healthz")  # 127.0.0.1: not bound
        # Same address and port: refused at start, as one JSON log line.
        second = ix_gpu(*common, "--device-plugin-dir", str(short_tmp / "dp2"), timeout=30)
        assert second.returncode == 1, second.stderr
        assert f"cannot serve /healthz and /metrics on 127.0.0.2:{port}" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr, second.stderr
    finally:
        first.stop()


HEAVY = ("grpc", "prometheus_client")
"""Top-level packages the plugin process must never import (grpcio's C core alone is ~9 MiB RSS)."""


def test_the_process_never_imports_grpcio_prometheus_client_or_pydantic(
    short_tmp: Path, fake_devices: Path
) -> None:
    """Through a whole life: start, register, ListAndWatch, Allocate, /metrics, a config reload,
    SIGTERM. Python writes every import to the log (``PYTHONPROFILEIMPORTTIME``), lazy ones
    included; compiled extensions, OpenSSL's among them, show in the process's memory map. pydantic
    validates the config and devices files, in forked children only: their imports are in the log
    (they share stderr), never in the plugin's own map."""
    directory = short_tmp / "dp"
    directory.mkdir()
    config = write_config(short_tmp, FAST_HEALTH)
    port = free_port()

    async def scenario() -> tuple[int | None, str]:
        kubelet = FakeKubelet(directory)
        await kubelet.start()
        plugin = ix_gpu_process(
            "ix-gpu-plugin",
            "plugin",
            "--backend", "fake",
            "--fake-devices", str(fake_devices),
            "--device-plugin-dir", str(directory),
            "--config", str(config),
            "--metrics-port", str(port),
            log_dir=short_tmp,
            env={"PYTHONPROFILEIMPORTTIME": "1"},
        )  # fmt: skip
        try:
            await kubelet.wait_for(lambda: kubelet.updates, timeout=20, what="registration of the process")
            devices = len(kubelet.last_update().devices)
            device = kubelet.last_update().devices[0][0]
            request = pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=[device])]
            )
            await kubelet.plugin.Allocate(request, timeout=5)
            status, _ = await asyncio.to_thread(http_get, port, "/metrics")
            assert status == 200
            # A config change is validated (in a child) and applied: every device twice.
            write_config(short_tmp, FAST_HEALTH + "sharing:\n  timeSlicing:\n    replicas: 2\n")
            await kubelet.wait_for(
                lambda: len(kubelet.last_update().devices) == 2 * devices, timeout=20, what="the reload"
            )
            maps = Path(f"/proc/{plugin.pid}/maps").read_text()
            assert "cygrpc" not in maps and "grpc/_cython" not in maps
            assert "_pydantic_core" not in maps, "pydantic was imported by the plugin process itself"
            # No API server to talk to, so no TLS: OpenSSL is 4.5 MiB (ix_gpu.process.openssl_free).
            assert "libcrypto" not in maps, "OpenSSL was loaded by a plugin without cluster access"
            plugin.popen.send_signal(signal.SIGTERM)
            rc = await asyncio.to_thread(plugin.popen.wait, 10)
        finally:
            plugin.stop()
            await kubelet.stop()
        return rc, plugin.output()

    rc, log = asyncio.run(scenario())
    assert rc == 0, log
    imported = {line.split("|")[-1].strip() for line in log.splitlines() if line.startswith("import time:")}
    assert "grpclib.server" in imported and "ix_gpu.serving.agent_http" in imported, log[-2000:]
    heavy = sorted(name for name in imported if name.split(".")[0] in HEAVY)
    assert not heavy, f"the plugin process imported {heavy}"
    # The validation did run, in the children.
    assert {"ix_gpu.config.plugin_config", "ix_gpu.node.backends.fake_devices"} <= imported


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
    result = ix_gpu(*args, timeout=30)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_config_file_is_a_usage_error(short_tmp: Path, fake_devices: Path) -> None:
    config = write_config(short_tmp, "sharing:\n  timeSlicing:\n    replicas: -1\n")
    result = ix_gpu(
        "devices",
        "--backend",
        "fake",
        "--fake-devices",
        str(fake_devices),
        "--config",
        str(config),
        timeout=30,
    )
    assert result.returncode == 2
    assert "sharing.timeSlicing.replicas" in result.stderr


def test_devices_lists_what_would_be_advertised(short_tmp: Path, fake_devices: Path) -> None:
    config = write_config(
        short_tmp, "flags:\n  splitboard: true\nsharing:\n  timeSlicing:\n    replicas: 2\n"
    )
    result = ix_gpu(
        "devices",
        "--backend", "fake",
        "--fake-devices", str(fake_devices),
        "--config", str(config),
        timeout=30,
        env={"COREX_HOME": "/nonexistent"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "8 devices" in lines[0]
    assert lines[1].split()[:5] == ["ID", "CHIPS", "BOARD", "MINOR", "NUMA"]
    assert len(lines) == 10
    assert lines[2].split()[0].endswith("::0")
