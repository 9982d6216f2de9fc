"""``ix-gpu dra`` reads the config's sharing as the device plugin does: the Iluvatar form
(``sharing.timeSlicing.replicas``) and NVIDIA's (``sharing.timeSlicing.resources[]``, the entry for
this vendor's resource) share a node's devices alike, so one ConfigMap means the same whichever
agent serves the node. The real started agent, over its kubelet sockets, against a fake apiserver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ix_gpu.kube.apiserver import ApiServer
from tests.dra.dra_testkit import DRIVER, NODE
from tests.dra.fake_resource_api import FakeResourceApi
from tests.dra.test_dra_config_dir import _dra_args, _kubeconfig
from tests.support.cli import ix_gpu_process
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

SLICE = f"{NODE}-{DRIVER}"
ILUVATAR_FORM = "sharing:\n  timeSlicing:\n    replicas: 4\n"
NVIDIA_FORM = "sharing:\n  timeSlicing:\n    resources:\n    - name: iluvatar.com/gpu\n      replicas: 4\n"


def _published(
    short_tmp: Path, fake_devices: Path, api_pair: tuple[FakeResourceApi, ApiServer], config: str
) -> tuple[list[dict[str, Any]], str]:
    """The devices ``ix-gpu dra`` publishes with ``config`` as its ix-config, and its log."""
    fake, api = api_pair
    fake.slices.pop(SLICE, None)
    config_file = short_tmp / "ix-config.yaml"
    config_file.write_text(config)
    args = _dra_args(
        short_tmp, fake_devices, _kubeconfig(short_tmp / "kubeconfig", api), "--config", str(config_file)
    )
    process = ix_gpu_process("dra", "dra", *args, log_dir=short_tmp, env={"NODE_NAME": NODE})
    try:
        stored = wait_until(lambda: fake.slices.get(SLICE), "the ResourceSlice", 30, process=process)
    finally:
        assert process.stop() == 0, process.tail()
    return stored["spec"]["devices"], process.output()


def _shares(devices: list[dict[str, Any]]) -> list[tuple[str, bool, str | None]]:
    """Each device's name, whether it may be allocated to several claims, and its share size."""
    return [
        (
            d["name"],
            d.get("allowMultipleAllocations", False),
            d["capacity"]["memory"].get("requestPolicy", {}).get("default"),
        )
        for d in devices
    ]


def test_nvidia_form_replicas_share_the_devices_as_the_iluvatar_form_does(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    iluvatar, _ = _published(short_tmp, fake_devices, resource_api, ILUVATAR_FORM)
    nvidia, log = _published(short_tmp, fake_devices, resource_api, NVIDIA_FORM)
    assert _shares(nvidia) == _shares(iluvatar)
    # Two BI-V150 boards (splitboard is off by default), each in four shares of its memory.
    assert len(nvidia) == 2 and all(multiple and share is not None for _, multiple, share in _shares(nvidia))
    assert "replicas=4" in log


@pytest.mark.parametrize(
    ("entries", "said"),
    [
        # An entry for another vendor's resource only: this node's devices are not shared.
        ("    - name: nvidia.com/gpu\n      replicas: 4\n", "has no entry for iluvatar.com/gpu"),
        # An entry that shares some devices: a DRA device is shared in full or not at all.
        (
            "    - name: iluvatar.com/gpu\n      replicas: 4\n      devices: [0, 1]\n",
            "shares only some devices, which DRA cannot",
        ),
    ],
)
def test_an_nvidia_form_entry_dra_cannot_follow_publishes_unshared_and_says_why(
    short_tmp: Path,
    fake_devices: Path,
    resource_api: tuple[FakeResourceApi, ApiServer],
    entries: str,
    said: str,
) -> None:
    devices, log = _published(
        short_tmp, fake_devices, resource_api, "sharing:\n  timeSlicing:\n    resources:\n" + entries
    )
    # Unshared: every board and chip published whole (the partitionable layout), none shared.
    assert len(devices) == 6 and not any(multiple for _, multiple, _ in _shares(devices))
    assert said in log and "replicas=1" in log
