"""The real ``ix-gpu dra`` against the oldest supported kube-apiserver (v1.35.4), where the
DRADeviceTaints feature is off by default and the apiserver silently drops device taints.

The plugin publishes plain per-chip devices, which the apiserver accepts, and reads each write
back: seeing its taint dropped, it takes the unhealthy chip out of the slice instead (so the
scheduler cannot give it out) and says why once. Likewise DRAConsumableCapacity and
DRAPartitionableDevices are off: its chips' memory shares (sharing.timeSlicing.replicas: 4) and then
the boards' shared counters are dropped, so it publishes each chip whole and alone (splitboard:
true), deletes its counter slice, and says so once for each. No kubelet is needed to publish a slice: the
plugin serves its sockets into a directory of its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.k8s_tier import OLDEST_K8S_VERSION, KubeAPI
from tests.k8s.pods import request_ok
from tests.support.cli import ix_gpu_process
from tests.support.files import short_tmp_dir
from tests.support.paths import FAKE_DEVICES
from tests.support.processes import Process
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

DRIVER = "gpu.iluvatar.com"
NODE = "oldest-dra-node"
SLICE = f"/apis/resource.k8s.io/v1/resourceslices/{NODE}-{DRIVER}"


@pytest.fixture
def dra_node(kube_api: KubeAPI) -> Iterator[str]:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": {"ix-gpu.io/gpu.allocation": "dra"}},
    }
    request_ok(kube_api, "POST", "/api/v1/nodes", node)
    try:
        yield NODE
    finally:
        kube_api.request("DELETE", f"/api/v1/nodes/{NODE}")
        kube_api.request("DELETE", SLICE)
        kube_api.request("DELETE", f"{SLICE}-counters-0")


def device_names(api: KubeAPI) -> set[str] | None:
    status, stored = api.request("GET", SLICE)
    if status != 200:
        return None
    return {d["name"] for d in stored["spec"]["devices"]}


def test_taints_dropped_by_the_oldest_apiserver_make_the_unhealthy_chip_leave_the_slice(
    kube_api: KubeAPI, dra_node: str, k8s_log_dir: Path
) -> None:
    status, version = kube_api.request("GET", "/version")
    assert status == 200 and version["gitVersion"] == OLDEST_K8S_VERSION
    with short_tmp_dir("ixold") as tmp:
        devices = tmp / "devices.yaml"
        # The second chip over temperature (health bit 0x4) from the start.
        text = FAKE_DEVICES.read_text()
        first = text.index("health: 0")
        second = text.index("health: 0", first + 1)
        devices.write_text(text[:second] + "health: 4" + text[second + len("health: 0") :])
        config = tmp / "ix-config"
        # One device per chip (gpu-0 .. gpu-3), shared in 4 where consumable capacity is served.
        config.write_text("flags:\n  splitboard: true\nsharing:\n  timeSlicing:\n    replicas: 4\n")
        plugin: Process = ix_gpu_process(
            "dra-oldest",
            "dra",
            f"--node-name={dra_node}",
            f"--config={config}",
            "--backend=fake",
            f"--fake-devices={devices}",
            f"--plugins-dir={tmp / 'plugins'}",
            f"--registry-dir={tmp / 'registry'}",
            f"--cdi-dir={tmp / 'cdi'}",
            "--health-interval=0.5",
            f"--kubeconfig={kube_api.kubeconfig}",
            log_dir=k8s_log_dir,
        )
        try:
            # The layouts are tried in turn (shares, then boards and chips, then plain chips), each
            # written and read back: wait for the last, a one-slice pool without chip 1.
            wait_until(
                lambda: (
                    device_names(kube_api) == {"gpu-0", "gpu-2", "gpu-3"}
                    and "dropped the shared counters" in plugin.log.read_text()
                    and kube_api.request("GET", f"{SLICE}-counters-0")[0] == 404
                ),
                "chip 1 out of the plain layout",
                60,
                process=plugin,
            )
            stored: dict[str, Any] = request_ok(kube_api, "GET", SLICE)
            assert all("taints" not in d for d in stored["spec"]["devices"])
            assert all("consumesCounters" not in d for d in stored["spec"]["devices"])
            assert all("allowMultipleAllocations" not in d for d in stored["spec"]["devices"])
            assert stored["spec"]["pool"]["name"] == NODE
            # The pool is the one devices slice: the counter slice the apiserver emptied is gone.
            assert stored["spec"]["pool"]["resourceSliceCount"] == 1
            assert kube_api.request("GET", f"{SLICE}-counters-0")[0] == 404
            # Healthy again: back in the slice.
            devices.write_text(text)
            wait_until(lambda: device_names(kube_api) == {f"gpu-{i}" for i in range(4)}, "chip 1 back", 60)
            time.sleep(1.5)  # a few more health intervals: the warning must not repeat
        finally:
            plugin.stop()
        log = plugin.log.read_text()
        assert log.count("dropped the device taints") == 1, log[-3000:]
        assert "DRADeviceTaints" in log
        assert log.count("dropped the shared counters") == 1, log[-3000:]
        assert log.count("dropped allowMultipleAllocations") == 1, log[-3000:]
        assert "DRAConsumableCapacity" in log
        assert "DRAPartitionableDevices" in log
