"""What the kubelet device-manager tests feed the real ``ix-gpu plugin`` process
(``tests.support.plugin_process.PluginProcess``) and how they watch the device manager.

Config files are written in the seed's ix-config format (the ConfigMap's ``ix-config`` key); device
files use the schema of examples/fake-devices.yaml.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import yaml

from tests.k8s.k8s_tier import KubeletHarness
from tests.support.paths import FAKE_DEVICES
from tests.support.waiting import wait_until

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
    data: dict[str, Any] = yaml.safe_load(FAKE_DEVICES.read_text())
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


def poll(
    harness: KubeletHarness, predicate: Callable[[dict[str, Any]], bool], timeout_s: float, what: str
) -> tuple[dict[str, Any], float]:
    """Poll the device manager's ``capacity`` every 50 ms; returns the first matching reply and the
    seconds it took. Fails with the last reply after ``timeout_s``."""
    start = time.monotonic()
    last: dict[str, Any] = {}

    def matching() -> tuple[dict[str, Any], float] | None:
        nonlocal last
        last = harness.capacity()
        elapsed = time.monotonic() - start
        return (last, elapsed) if predicate(last) else None

    return wait_until(
        matching, what, timeout_s, interval=0.05, details=lambda: f"last capacity reply: {last}"
    )
