"""The fake cluster ``ix-gpu status`` reads in these tests, served on loopback, and the command run
against it in this process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.status.fake_api import FakeCluster, Run, plugin_pod, serve, write_kubeconfig
from tests.status.objects import claim, metrics, node, pod, slice_


@pytest.fixture
def cluster() -> FakeCluster:
    """Two device-plugin nodes and a DRA node, each with the chart's plugin pod and its /metrics,
    a CPU node, and pods holding GPUs; served two objects a page."""
    found = FakeCluster(
        nodes=[node("dp", gpus=8), node("dp2", gpus=4), node("dra", dra=True), node("cpu")],
        pods=[
            pod("ml", "train", "dp", 2),
            pod("ml", "infer", "dp2", 1),
            plugin_pod("ixd-plugin-a", "dp"),
            plugin_pod("ixd-plugin-b", "dp2"),
            plugin_pod("ixd-plugin-c", "dra"),
        ],
        slices=[slice_("dra", 2)],
        claims=[claim("ml", "shared", "dra", "gpu-0", ["a"])],
    )
    found.metrics = {
        "ix-gpu-system/ixd-plugin-a": metrics("dp", 8, {0: [("ml", "train", "")]}, {}),
        "ix-gpu-system/ixd-plugin-b": metrics("dp2", 4, {}, {2: "ECC error"}),
        "ix-gpu-system/ixd-plugin-c": metrics("dra", 2, {0: [("ml", "a", "ml/shared")]}, {}),
    }
    return found


@pytest.fixture
def served(cluster: FakeCluster) -> Iterator[str]:
    yield from serve(cluster)


@pytest.fixture
def run_status(served: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Run:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", served)

    def run(*args: str) -> tuple[int, str, str]:
        from ix_gpu.cli import main

        capsys.readouterr()
        code = main(["status", "--kubeconfig", str(kubeconfig), *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run
