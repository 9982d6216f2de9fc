"""``ix-gpu dra --config DIR``: the device plugin's directory of named configs, picked at start by the
node label ``ix-gpu.io/device-plugin.config``; a later change of the label is only warned about."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from pathlib import Path

import pytest

from ix_gpu.devicemodel.labels import DEVICE_PLUGIN_CONFIG
from ix_gpu.kube.apiserver import ApiServer
from tests.dra.dra_testkit import DRIVER, NODE, running, settings
from tests.dra.fake_resource_api import FakeResourceApi
from tests.support.cli import ix_gpu, ix_gpu_process
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

SLICE = f"{NODE}-{DRIVER}"


@pytest.fixture
def config_dir(short_tmp: Path) -> Path:
    """A mounted ConfigMap's shape: two named configs and Kubernetes' hidden entries."""
    directory = short_tmp / "configs"
    directory.mkdir()
    (directory / "default").write_text("flags:\n  splitboard: true\n")
    (directory / "boards").write_text("flags:\n  splitboard: false\n")
    (directory / "..data").mkdir()
    return directory


def _kubeconfig(path: Path, api: ApiServer) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": api.base_url}}],
                "users": [{"name": "test", "user": {"token": str(api.token)}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "test"}}],
                "current-context": "fake",
            }
        )
    )
    return path


def _dra_args(short_tmp: Path, fake_devices: Path, kubeconfig: Path, *extra: str) -> list[str]:
    return [
        *("--backend", "fake", "--fake-devices", str(fake_devices), "--kubeconfig", str(kubeconfig)),
        *("--plugins-dir", str(short_tmp / "plugins"), "--registry-dir", str(short_tmp / "registry")),
        *("--cdi-dir", str(short_tmp / "cdi"), *extra),
    ]


@pytest.mark.parametrize(
    ("label", "default", "devices"),
    [
        ("boards", None, ["board-0", "board-2"]),
        (None, None, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]),  # unlabelled: the config named default
        (None, "boards", ["board-0", "board-2"]),
    ],
)
def test_the_node_label_picks_the_config_at_start(
    short_tmp: Path,
    fake_devices: Path,
    config_dir: Path,
    resource_api: tuple[FakeResourceApi, ApiServer],
    label: str | None,
    default: str | None,
    devices: list[str],
) -> None:
    fake, api = resource_api
    if label is not None:
        fake.nodes[NODE]["metadata"]["labels"][DEVICE_PLUGIN_CONFIG] = label
    extra = ["--config", str(config_dir), *(["--default-config", default] if default else [])]
    process = ix_gpu_process(
        "dra",
        "dra",
        *_dra_args(short_tmp, fake_devices, _kubeconfig(short_tmp / "kubeconfig", api), *extra),
        log_dir=short_tmp,
        env={"NODE_NAME": NODE},
    )
    try:
        stored = wait_until(lambda: fake.slices.get(SLICE), "the ResourceSlice", 30, process=process)
    finally:
        assert process.stop() == 0, process.tail()
    # Every board and chip is published (partitionable); the config picks the default form.
    published = stored["spec"]["devices"]
    assert [d["name"] for d in published] == ["board-0", "gpu-0", "gpu-1", "board-2", "gpu-2", "gpu-3"]
    assert [d["name"] for d in published if d["attributes"]["defaultForm"]["bool"]] == devices
    picked = "boards" if devices[0].startswith("board") else "default"
    assert f"config {config_dir / picked}: splitboard=" in process.output()


@pytest.mark.parametrize(
    ("label", "args", "message"),
    [
        ("nope", [], "--config {dir}: node label ix-gpu.io/device-plugin.config=nope names no config"),
        (
            None,
            ["--default-config", "nope"],
            "--config {dir}: the default config 'nope' is not in the ConfigMap",
        ),
    ],
)
def test_a_config_the_directory_lacks_is_a_usage_error(
    short_tmp: Path,
    fake_devices: Path,
    config_dir: Path,
    resource_api: tuple[FakeResourceApi, ApiServer],
    label: str | None,
    args: list[str],
    message: str,
) -> None:
    fake, api = resource_api
    if label is not None:
        fake.nodes[NODE]["metadata"]["labels"][DEVICE_PLUGIN_CONFIG] = label
    kubeconfig = _kubeconfig(short_tmp / "kubeconfig", api)
    done = ix_gpu(
        "dra",
        *_dra_args(short_tmp, fake_devices, kubeconfig, "--config", str(config_dir), *args),
        env={"NODE_NAME": NODE},
    )
    assert done.returncode == 2, done.stderr
    assert message.format(dir=config_dir) in done.stderr, done.stderr


def test_default_config_needs_a_directory(short_tmp: Path, fake_devices: Path) -> None:
    config = short_tmp / "ix-config"
    config.write_text("flags:\n  splitboard: true\n")
    done = ix_gpu(
        "dra",
        *("--backend", "fake", "--fake-devices", str(fake_devices)),
        *("--config", str(config), "--default-config", "default"),
        env={"NODE_NAME": NODE},
    )
    assert done.returncode == 2, done.stderr
    assert "--default-config needs --config DIR" in done.stderr


def test_a_changed_label_is_warned_about_once_and_applies_on_restart(
    short_tmp: Path,
    fake_devices: Path,
    config_dir: Path,
    resource_api: tuple[FakeResourceApi, ApiServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, api = resource_api
    config = dataclasses.replace(settings(short_tmp), config_dir=config_dir, config_label=None)
    labels = fake.nodes[NODE]["metadata"]["labels"]

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "config label changed" in r.getMessage()]

    async def scenario() -> list[str]:
        async with running(config, fake_devices, api):
            await asyncio.sleep(0.4)
            labels[DEVICE_PLUGIN_CONFIG] = "default"  # picks the config in use: nothing to say
            await asyncio.sleep(0.4)
            labels[DEVICE_PLUGIN_CONFIG] = "boards"
            for _ in range(100):
                if warnings():
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.4)  # several more node reads: still one warning
            return [d["name"] for d in fake.slices[SLICE]["spec"]["devices"]]

    with caplog.at_level(logging.WARNING, logger="ix_gpu.dra.app"):
        devices = asyncio.run(scenario())
    assert devices == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]  # the config in use stays
    assert warnings() == [
        "this node's config label changed (it picks 'boards': node label "
        f"{DEVICE_PLUGIN_CONFIG}=boards): ix-gpu dra keeps config 'default' until it is restarted"
    ]
