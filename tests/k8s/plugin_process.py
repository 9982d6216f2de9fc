"""The real ``ix-gpu plugin`` process (fake backend) for the kubelet device-manager tests.

Config files are written in the seed's ix-config format (the ConfigMap's ``ix-config`` key); device
files use the schema of examples/fake-devices.yaml and are replaced atomically, because the fake
backend re-reads them by content on every health check and must never see half a file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from tests.k8s.k8s_tier import KubeletHarness, tail

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_DEVICES = REPO / "examples" / "fake-devices.yaml"
RESOURCE = "iluvatar.com/gpu"
OVER_TEMPERATURE = 0x4
"""An ixmlDeviceGetHealth bit: the fake backend reports such a chip Unhealthy."""


def seed_config(
    *,
    splitboard: bool = False,
    replicas: int | None = None,
    interval_s: float | None = None,
    recover: int = 3,
) -> str:
    """An ix-config document as the seed writes it, plus our ``health`` keys when asked for."""
    text = f"flags:\n  splitboard: {'true' if splitboard else 'false'}\n"
    if replicas is not None:
        text += f"sharing:\n  timeSlicing:\n      replicas: {replicas} \n"
    if interval_s is not None:
        text += f"health:\n  intervalSeconds: {interval_s}\n  recoverAfter: {recover}\n"
    return text


def example_devices() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE_DEVICES.read_text())
    return data


def devices_yaml(boards: int | None = None, unhealthy: Iterable[str] = ()) -> str:
    """examples/fake-devices.yaml cut to its first ``boards`` boards, ``unhealthy`` chips over temperature."""
    data = example_devices()
    if boards is not None:
        data["boards"] = data["boards"][:boards]
    bad = set(unhealthy)
    for board in data["boards"]:
        for chip in board["chips"]:
            chip["health"] = OVER_TEMPERATURE if chip["uuid"] in bad else 0
    return yaml.safe_dump(data, sort_keys=False)


def chip_uuids(boards: int | None = None) -> list[list[str]]:
    """Chip UUIDs per board of the example file."""
    return [[c["uuid"] for c in b["chips"]] for b in example_devices()["boards"][:boards]]


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def poll(
    harness: KubeletHarness, predicate: Callable[[dict[str, Any]], bool], timeout_s: float, what: str
) -> tuple[dict[str, Any], float]:
    """Poll the device manager's ``capacity`` every 50 ms; returns the first matching reply and the
    seconds it took. Fails with the last reply after ``timeout_s``."""
    start = time.monotonic()
    while True:
        reply = harness.capacity()
        elapsed = time.monotonic() - start
        if predicate(reply):
            return reply, elapsed
        if elapsed > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s:.1f}s; last capacity reply: {reply}")
        time.sleep(0.05)


class PluginProcess:
    """``ix-gpu plugin --backend fake`` serving into ``plugin_dir`` (a harness directory)."""

    def __init__(self, work: Path, plugin_dir: Path, devices: str, config: str, log: Path) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.devices = work / "fake-devices.yaml"
        self.config = work / "ix-config"
        self.socket = plugin_dir / "iluvatar-gpu.sock"
        self.log = log
        write_atomic(self.devices, devices)
        self.config.write_text(config)
        argv = [
            sys.executable,
            "-m",
            "ix_gpu",
            "plugin",
            "--backend",
            "fake",
            "--fake-devices",
            str(self.devices),
            "--device-plugin-dir",
            str(plugin_dir),
            "--config",
            str(self.config),
            "--metrics-port",
            "0",
        ]
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(
                argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )

    def set_devices(self, text: str) -> None:
        write_atomic(self.devices, text)

    def log_tail(self, lines: int = 20) -> str:
        return tail(self.log, lines)

    def terminate(self, timeout_s: float = 15) -> int:
        """SIGTERM by PID; returns the exit status (SIGKILL and fail when it does not stop)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)
            raise AssertionError(f"plugin ignored SIGTERM for {timeout_s}s:\n{self.log_tail()}") from None

    def stop(self) -> None:
        with contextlib.suppress(AssertionError):
            self.terminate()
