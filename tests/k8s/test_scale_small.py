"""The scale benchmark's small version (``bench/scale.py``, ``burst.py``), as a test: 100 simulated
GPU nodes (kwok), 2,000 namespaces (every 20th opted out), 1,000 GPU pods created at 50 pods/s through the
real apiserver, scheduler and ``ix-gpu webhook`` (failurePolicy Fail), and the apiserver stopped
and started again half-way through the burst.

What must hold whatever the fault: no GPU pod is stored without the webhook's injection, no pod of
an opted-out namespace is injected, a client that retries a failed create gets its pod, and every
pod reaches Running on a simulated node. The figures (latencies, throughput) are the benchmark's
to report, not this test's to judge: on two shared cores they say more about the machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.k8s import burst
from tests.k8s.k8s_tier import K8sBinaries

pytestmark = pytest.mark.timeout(900)


def test_a_burst_across_an_apiserver_restart_admits_no_gpu_pod_unmutated(
    k8s_binaries: K8sBinaries, tmp_path: Path, k8s_log_dir: Path
) -> None:
    result = burst.run(
        tmp_path,
        kwok_nodes=100,
        namespaces=2000,
        pods=1000,
        rate=50,
        fault="apiserver-restart",
        binaries=k8s_binaries,
        log_dir=k8s_log_dir / "scale",
    )
    print(result)  # the figures, in the test's captured output
    assert result["fault_info"].get("seconds", 0) > 2, "the apiserver was restarted during the burst"
    assert result["pods_created"] == 1000, result
    assert result["create_failed_after_retries"] == 0, result
    assert result["gpu_pods_unmutated"] == 0, result
    assert result["opted_out_pods"] == 50 and result["opted_out_pods_mutated"] == 0, result
    assert result["running"] == 1000, result
