"""Shared fixtures for the device-plugin tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.files import short_tmp_dir
from tests.support.paths import FAKE_DEVICES


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp dir with a short path: unix socket paths are limited to 107 bytes, and pytest's
    tmp_path under a long test name can exceed that."""
    with short_tmp_dir("ixdp") as path:
        yield path


@pytest.fixture
def fake_devices(short_tmp: Path) -> Path:
    """A private copy of examples/fake-devices.yaml that a test may edit."""
    target = short_tmp / "devices.yaml"
    shutil.copyfile(FAKE_DEVICES, target)
    return target
