"""The real nodes' runtime (node_runtime.py) as the lane in use builds it: by default containerd
2.3 and runc 1.4 or newer, and a config its containerd reads as written (no migration warning), with
CDI on and the tier's runc as the runc shim's binary. Checked with ``containerd config dump``, which
starts nothing, so this runs beside a real-node cluster."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.node_runtime import NodeRuntime, containerd_config, find_runtime
from tests.support.tier_runc import MINIMUM, runc_version

DEFAULT_CONTAINERD = "2.3.7"


@pytest.fixture(scope="module")
def runtime() -> NodeRuntime:
    if os.geteuid() != 0:
        pytest.skip("the real nodes' runtime is built as root, with them (runc needs libseccomp-dev)")
    return find_runtime()


def dumped_config(runtime: NodeRuntime, root: Path) -> tuple[dict[str, Any], str]:
    """What containerd makes of the config the node at ``root`` gets, and what it warned."""
    config = root / "containerd.toml"
    config.write_text(containerd_config(root, "registry.k8s.io/pause:3.10", runtime))
    dump = subprocess.run(
        [str(runtime.containerd_bin / "containerd"), "--config", str(config), "config", "dump"],
        capture_output=True,
        text=True,
        check=True,
    )
    return tomllib.loads(dump.stdout), dump.stderr


def test_the_default_lane_is_containerd_2_3_with_a_runc_of_1_4_or_newer(runtime: NodeRuntime) -> None:
    if os.environ.get("IX_GPU_CONTAINERD", "2.3") == "2.3":
        assert runtime.containerd_version == DEFAULT_CONTAINERD, runtime
    assert runc_version(str(runtime.runc))[:2] >= MINIMUM, runtime


def test_the_nodes_containerd_reads_their_config_as_written(runtime: NodeRuntime, tmp_path: Path) -> None:
    dumped, warnings = dumped_config(runtime, tmp_path)
    assert "level=warning" not in warnings, warnings  # e.g. "Configuration migrated from version 3"
    if runtime.containerd_release >= (2, 0):
        cri = dumped["plugins"]["io.containerd.cri.v1.runtime"]
        assert dumped["plugins"]["io.containerd.nri.v1.nri"]["socket_path"].startswith(str(tmp_path))
    else:
        cri = dumped["plugins"]["io.containerd.grpc.v1.cri"]
    # Both lanes resolve a DRA claim's CDI device IDs from the node's own /run/cdi.
    assert cri["enable_cdi"] is True and "/var/run/cdi" in cri["cdi_spec_dirs"], cri
    assert cri["containerd"]["runtimes"]["runc"]["options"]["BinaryName"] == str(runtime.runc)
