"""The real ``ix-gpu plugin --backend fake`` as a subprocess, for the plugin suite (against the fake
kubelet) and the real-Kubernetes tier (against the kubelet's own device manager).

The devices file uses the schema of examples/fake-devices.yaml and is replaced atomically, because
the fake backend re-reads it on every health check and must never see half a file. The config is an
ix-config document (the ConfigMap's ``ix-config`` key).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.cli import ix_gpu_process
from tests.support.files import write_atomic
from tests.support.processes import Process

SOCKET = "iluvatar-gpu.sock"
"""The plugin's socket in the device-plugin directory."""


class PluginProcess:
    """``ix-gpu plugin --backend fake`` serving into ``plugin_dir``; ``devices`` and ``config`` are
    written to ``work``; output goes to ``<log_dir>/<name>.log``."""

    def __init__(
        self,
        work: Path,
        plugin_dir: Path,
        devices: str,
        config: str,
        log_dir: Path,
        *,
        name: str = "ix-gpu-plugin",
        metrics_port: int = 0,
        kubeconfig: Path | None = None,
        node: str | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        """``kubeconfig`` and ``node``: the API server and the Node the plugin labels (with
        ``labels.enabled`` in ``config``), as NODE_NAME and the service account give it in a pod;
        ``extra_args``: more flags of ``ix-gpu plugin``."""
        work.mkdir(parents=True, exist_ok=True)
        self.plugin_dir = plugin_dir
        self.devices = work / "fake-devices.yaml"
        self.config = work / "ix-config"
        self.socket = plugin_dir / SOCKET
        self.log_dir = log_dir
        self.name = name
        self.metrics_port = metrics_port
        self.kubeconfig = kubeconfig
        self.node = node
        self.extra_args = extra_args
        self.process: Process | None = None
        write_atomic(self.devices, devices)
        self.config.write_text(config)

    def start(self) -> PluginProcess:
        self.process = ix_gpu_process(
            self.name,
            "plugin",
            "--backend", "fake",
            "--fake-devices", str(self.devices),
            "--device-plugin-dir", str(self.plugin_dir),
            "--config", str(self.config),
            "--metrics-port", str(self.metrics_port),
            *(["--kubeconfig", str(self.kubeconfig)] if self.kubeconfig else []),
            *self.extra_args,
            log_dir=self.log_dir,
            env={"NODE_NAME": self.node} if self.node else None,
        )  # fmt: skip
        return self

    @property
    def running(self) -> Process:
        assert self.process is not None, "the plugin was not started"
        return self.process

    @property
    def popen(self) -> subprocess.Popen[bytes]:
        return self.running.popen

    @property
    def log(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def set_devices(self, text: str) -> None:
        write_atomic(self.devices, text)

    def log_tail(self, lines: int = 20) -> str:
        return self.running.tail(lines)

    def terminate(self, timeout_s: float = 15) -> int:
        """SIGTERM by PID; returns the exit status (SIGKILL and fail when it does not stop in time)."""
        returncode = self.running.stop(timeout_s)
        if self.running.killed:
            raise AssertionError(f"plugin ignored SIGTERM for {timeout_s}s:\n{self.log_tail()}")
        assert returncode is not None
        return returncode

    def stop(self) -> None:
        """SIGTERM, SIGKILL when it does not stop (for teardown: never fails)."""
        if self.process is not None:
            self.process.stop(15)
