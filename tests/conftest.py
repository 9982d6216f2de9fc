"""Settings for the whole test process, and the fixtures tests of several layers share.

The suite runs in one process: the plugin's and DRA's tests start gRPC servers and channels in it,
and the webhook's tests fork review workers (``HeavyLane``) from it. gRPC's fork handlers, which
are on by default, make a ``fork`` wait for gRPC's own threads to stop; once, under CI load, that
wait took a worker's whole 5 s budget and the test saw ``OverBudget`` where the child had simply
failed. The webhook process never loads gRPC, so in production its forks never meet those
handlers; here they are turned off (before any test module imports gRPC) so the webhook's tests
measure the webhook.
"""

import os

os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.compiled import not_compiled
from tests.support.files import short_tmp_dir
from tests.support.paths import FAKE_DEVICES


def pytest_sessionstart(session: pytest.Session) -> None:
    """The run on the native build (IX_GPU_EXPECT_COMPILED=1, scripts/test.sh) must load every
    compiled module from its extension, or it would only test the pure Python build again."""
    if os.environ.get("IX_GPU_EXPECT_COMPILED") == "1" and (missing := not_compiled()):
        raise pytest.UsageError("IX_GPU_EXPECT_COMPILED=1 but not compiled: " + ", ".join(missing))


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp dir with a short path: unix socket paths are limited to 107 bytes, and pytest's
    tmp_path under a long test name can exceed that."""
    with short_tmp_dir("ixt") as path:
        yield path


@pytest.fixture
def fake_devices(short_tmp: Path) -> Path:
    """A private copy of examples/fake-devices.yaml that a test may edit (the DRA tests' own
    fixture of this name adds driver version and PCI bus IDs)."""
    target = short_tmp / "devices.yaml"
    shutil.copyfile(FAKE_DEVICES, target)
    return target
