"""Fixtures for the DRA plugin tests: a devices file with what DRA publishes, a fake API server
(short socket paths: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ix_gpu.devicemodel.labels import GPU_ALLOCATION
from ix_gpu.kube.apiserver import ApiServer
from tests.dra.fake_resource_api import FakeResourceApi, serving
from tests.support.paths import FAKE_DEVICES


@pytest.fixture
def fake_devices(short_tmp: Path) -> Path:
    """examples/fake-devices.yaml plus a driver version and PCI bus IDs, which a test may edit."""
    text = FAKE_DEVICES.read_text().replace("vendor: iluvatar\n", "vendor: iluvatar\ndriverVersion: 4.1.0\n")
    for minor in range(4):
        text = text.replace(
            f"        minor: {minor}\n",
            f"        minor: {minor}\n        pciBusId: '0000:{0x3B + minor:02x}:00.0'\n",
        )
    target = short_tmp / "devices.yaml"
    target.write_text(text)
    return target


@pytest.fixture
def resource_api() -> Iterator[tuple[FakeResourceApi, ApiServer]]:
    fake = FakeResourceApi()
    fake.add_node("node1", labels={GPU_ALLOCATION: "dra"})  # this node's GPUs are DRA's to hand out
    with serving(fake) as api:
        yield fake, api
