"""NVIDIA k8s-device-plugin's config file (api/config/v1) read by our plugin config schema: what is
accepted and mapped, accepted and reported, refused naming the key; and that errors in a file name
the line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ix_gpu.config.input_files import ConfigError
from ix_gpu.config.plugin_config import (
    DeviceIdStrategy,
    ReplicaPolicy,
    load_plugin_config,
    parse_plugin_config,
    parse_plugin_yaml,
)

# NVIDIA's README examples, as operators copy them.
NVIDIA_README_FLAGS = """\
version: v1
flags:
  migStrategy: "none"
  failOnInitError: true
  nvidiaDriverRoot: "/"
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: "envvar"
    deviceIDStrategy: "uuid"
"""
NVIDIA_README_SHARING = """\
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""


def test_nvidia_readme_files_load() -> None:
    flags = parse_plugin_yaml(NVIDIA_README_FLAGS, "config")
    assert flags.version == "v1"
    assert flags.flags.mig_strategy == "none"
    assert flags.device_id_strategy is DeviceIdStrategy.UUID
    assert flags.notices() == ()  # every value there is what ix-gpu does anyway
    sharing = parse_plugin_yaml(NVIDIA_README_SHARING, "config").sharing.time_slicing
    assert sharing.rename_by_default and sharing.fail_requests_greater_than_one
    ((entry),) = sharing.resources
    assert (entry.name, entry.rename, entry.replicas, entry.devices) == ("nvidia.com/gpu", None, 10, "all")


def test_the_seed_format_is_unchanged_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "ix-config"
    path.write_text("flags:\n  splitboard: false\nsharing:\n  timeSlicing:\n      replicas: 4 \n")
    config = load_plugin_config(path)
    assert (config.flags.splitboard, config.replicas, config.version) == (False, 4, None)
    assert config.sharing.time_slicing.resources == ()


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ("all", "all"),
        (2, 2),
        ([0, "1", "GPU-7d0d7c1e"], (0, 1, "GPU-7d0d7c1e")),
        (["PCI-0000:3b:00.0"], ("PCI-0000:3b:00.0",)),
    ],
)
def test_devices_forms_accepted(devices: object, expected: object) -> None:
    config = parse_plugin_config(
        {"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "devices": devices}]}}}
    )
    assert config.sharing.time_slicing.resources[0].devices == expected


def test_nvidia_keys_with_an_equivalent_are_mapped() -> None:
    config = parse_plugin_config(
        {"flags": {"plugin": {"deviceIDStrategy": "index", "sharedDevicesAllocationPolicy": "packed"}}}
    )
    assert config.device_id_strategy is DeviceIdStrategy.INDEX
    assert config.allocation.replica_policy is ReplicaPolicy.PACK
    distributed = {"flags": {"plugin": {"sharedDevicesAllocationPolicy": "distributed"}}}
    assert parse_plugin_config(distributed).allocation.replica_policy is ReplicaPolicy.SPREAD
    # Both spellings given and agreeing is fine.
    agree = parse_plugin_config(
        {"deviceIdStrategy": "index", "flags": {"plugin": {"deviceIDStrategy": "index"}}}
    )
    assert agree.device_id_strategy is DeviceIdStrategy.INDEX
    # The digest follows the effective value: switching the NVIDIA key is a config change.
    assert config.digest() != parse_plugin_config({}).digest()


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"version": "v2"}, "version: Value error, unknown version 'v2'"),
        ({"flags": {"migStrategy": "single"}}, "flags.migStrategy: Value error, MIG is not supported"),
        ({"flags": {"migStrategy": "mixed"}}, "flags.migStrategy: Value error, MIG is not supported"),
        ({"flags": {"migStrategy": "some"}}, "flags.migStrategy: Value error, unknown MIG strategy"),
        ({"flags": {"gdsEnabled": True}}, "flags.gdsEnabled: Value error, ix-gpu does not inject"),
        ({"flags": {"gdrcopyEnabled": True}}, "flags.gdrcopyEnabled: Value error, ix-gpu does not inject"),
        ({"flags": {"mofedEnabled": True}}, "flags.mofedEnabled: Value error, ix-gpu does not inject"),
        (
            {"flags": {"plugin": {"deviceListStrategy": "cdi-annotations"}}},
            "flags.plugin.deviceListStrategy: Value error, only 'envvar' and 'cdi-cri'",
        ),
        (
            {"flags": {"plugin": {"deviceListStrategy": ["envvar", "volume-mounts"]}}},
            "only 'envvar' and 'cdi-cri' are supported (the visible-devices variable is always set), "
            "got 'volume-mounts'",
        ),
        (
            {"deviceListStrategy": "envvar", "flags": {"plugin": {"deviceListStrategy": "cdi-cri"}}},
            "deviceListStrategy: Value error, envvar contradicts flags.plugin.deviceListStrategy",
        ),
        ({"cdi": {"specDir": "var/run/cdi"}}, "cdi.specDir: Value error, must be an absolute path"),
        (
            {"flags": {"plugin": {"deviceIDStrategy": "serial"}}},
            "flags.plugin.deviceIDStrategy: Input should be 'uuid' or 'index'",
        ),
        (
            {"flags": {"plugin": {"sharedDevicesAllocationPolicy": "x"}}},
            "flags.plugin.sharedDevicesAllocationPolicy: Input should be 'distributed' or 'packed'",
        ),
        ({"flags": {"plugin": {"passDevicesSpecs": True}}}, "flags.plugin.passDevicesSpecs: unknown key"),
        ({"sharing": {"mps": {"resources": []}}}, "sharing.mps: Value error, MPS is NVIDIA's"),
        ({"imex": {"channelIDs": [0]}}, "imex: Value error, IMEX channels"),
        (
            {"deviceIdStrategy": "uuid", "flags": {"plugin": {"deviceIDStrategy": "index"}}},
            "deviceIdStrategy: Value error, uuid contradicts flags.plugin.deviceIDStrategy: index",
        ),
        (
            {
                "allocation": {"replicaPolicy": "spread"},
                "flags": {"plugin": {"sharedDevicesAllocationPolicy": "packed"}},
            },
            "allocation: Value error, replicaPolicy: spread contradicts "
            "flags.plugin.sharedDevicesAllocationPolicy: packed",
        ),
    ],
)
def test_refused_flags_name_the_key(doc: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_plugin_config(doc, "ix-config")
    assert message in str(info.value)


def entry(**fields: object) -> dict[str, object]:
    return {"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 4, **fields}]}}}


RESOURCES = "sharing.timeSlicing.resources[0]"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (entry(replicas=1), f"{RESOURCES}.replicas: Value error, must be at least 2"),
        (entry(name="Nvidia.com/gpu"), f"{RESOURCES}.name: Value error, must look like"),
        (entry(name="-gpu"), f"{RESOURCES}.name: Value error, must be a resource name"),
        (entry(rename="nvidia.com/"), f"{RESOURCES}.rename: Value error, must look like"),
        (entry(devices="some"), f"{RESOURCES}.devices: Value error, the only word accepted is 'all'"),
        (entry(devices=0), f"{RESOURCES}.devices: Value error, a count of devices must be at least 1"),
        (entry(devices=True), f"{RESOURCES}.devices: Value error, must be 'all', a count"),
        (entry(devices=[]), f"{RESOURCES}.devices: Value error, must be 'all', a count or a non-empty list"),
        (entry(devices=["0:1"]), f"{RESOURCES}.devices: Value error, '0:1' is a MIG device"),
        (entry(devices=["MIG-b1028956-cfa2-0990-bf4a-5da9abb51763"]), "is a MIG device"),
        (entry(devices=[0, "0"]), f"{RESOURCES}.devices: Value error, lists device 0 twice"),
        (entry(devices=[-1]), f"{RESOURCES}.devices: Value error, a device is a chip index"),
        (
            entry(rename="gpu.shared", devices=[0]),
            "resources[0].devices selects some devices of a renamed resource (rename)",
        ),
        (
            {
                "sharing": {
                    "timeSlicing": {
                        "renameByDefault": True,
                        "resources": [{"name": "gpu", "replicas": 2, "devices": 1}],
                    }
                }
            },
            "resources[0].devices selects some devices of a renamed resource (renameByDefault)",
        ),
        (
            {
                "sharing": {
                    "timeSlicing": {
                        "resources": [{"name": "gpu", "replicas": 2}, {"name": "gpu", "replicas": 3}]
                    }
                }
            },
            "sharing.timeSlicing: Value error, resources[1].name 'gpu' repeats resources[0].name",
        ),
        (
            {"sharing": {"timeSlicing": {"replicas": 2, "resources": [{"name": "gpu", "replicas": 2}]}}},
            "give replicas (the Iluvatar plugin's form) or resources (NVIDIA's form), not both",
        ),
        (
            {"sharing": {"timeSlicing": {"resources": [{"name": "gpu"}]}}},
            f"{RESOURCES}.replicas: Field required",
        ),
        ({"sharing": {"timeSlicing": {"resources": [{"replicas": 2}]}}}, f"{RESOURCES}.name: Field required"),
    ],
)
def test_refused_resources_name_the_key(doc: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_plugin_config(doc, "ix-config")
    assert message in str(info.value)


def test_a_subset_without_rename_and_a_rename_of_all_are_accepted() -> None:
    subset = parse_plugin_config(entry(devices=[1]))
    assert subset.sharing.time_slicing.resources[0].devices == (1,)
    renamed = parse_plugin_config(entry(rename="gpu.shared"))
    assert renamed.sharing.time_slicing.resources[0].rename == "gpu.shared"
    # Renaming to itself renames nothing, so it may select some devices.
    assert parse_plugin_config(entry(rename="gpu", devices=[0])).sharing.time_slicing.resources[
        0
    ].devices == (0,)


@pytest.mark.parametrize(
    ("doc", "notice"),
    [
        ({"flags": {"failOnInitError": False}}, "flags.failOnInitError: false is ignored"),
        ({"flags": {"nvidiaDriverRoot": "/run/nvidia/driver"}}, "flags.nvidiaDriverRoot is ignored"),
        ({"flags": {"nvidiaDevRoot": "/host"}}, "flags.nvidiaDevRoot is ignored"),
        ({"flags": {"mpsRoot": "/run/nvidia/mps"}}, "flags.mpsRoot is ignored"),
        ({"flags": {"useNodeFeatureAPI": True}}, "flags.useNodeFeatureAPI is ignored"),
        ({"flags": {"deviceDiscoveryStrategy": "nvml"}}, "flags.deviceDiscoveryStrategy is ignored"),
        ({"flags": {"plugin": {"passDeviceSpecs": False}}}, "flags.plugin.passDeviceSpecs: false is ignored"),
        (
            {"flags": {"plugin": {"cdiAnnotationPrefix": "cdi.k8s.io/"}}},
            "flags.plugin.cdiAnnotationPrefix is ignored",
        ),
        (
            {"flags": {"plugin": {"nvidiaCTKPath": "/usr/bin/nvidia-ctk"}}},
            "flags.plugin.nvidiaCTKPath is ignored",
        ),
        (
            {"flags": {"plugin": {"containerDriverRoot": "/driver-root"}}},
            "flags.plugin.containerDriverRoot is ignored",
        ),
        ({"flags": {"gfd": {"oneshot": True, "sleepInterval": "60s"}}}, "flags.gfd is ignored"),
        ({"resources": {"gpus": [{"pattern": "*A100*", "name": "a100"}]}}, "resources is ignored"),
    ],
)
def test_harmless_nvidia_keys_are_accepted_and_reported(doc: dict[str, object], notice: str) -> None:
    notices = parse_plugin_config(doc).notices()
    assert len(notices) == 1 and notices[0].startswith(notice), notices


def test_no_notices_for_values_that_match_what_ix_gpu_does() -> None:
    config = parse_plugin_config(
        {
            "flags": {
                "migStrategy": "none",
                "failOnInitError": True,
                "nvidiaDriverRoot": "/",
                "gdsEnabled": False,
                "deviceDiscoveryStrategy": "auto",
                "plugin": {"passDeviceSpecs": True, "deviceListStrategy": ["envvar"]},
            },
            "resources": {"gpus": []},
        }
    )
    assert config.notices() == ()


# --------------------------------------------------------------------------- errors in a file

NVIDIA_ENTRY = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 4\n"
"""Lines 1-6; line 7 is the entry's next key."""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            NVIDIA_ENTRY + "      renam: x\n",
            "ix-config: line 7: sharing.timeSlicing.resources[0].renam: unknown key",
        ),
        (
            "flags:\n  splitboard: true\n  splitBoard: true\n",
            "ix-config: line 3: flags.splitBoard: unknown key",
        ),
        (
            "version: v1\nflags:\n  migStrategy: mixed\n",
            "ix-config: line 3: flags.migStrategy: Value error, MIG",
        ),
        (
            "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n",
            "ix-config: line 4: sharing.timeSlicing.resources[0].replicas: Field required",
        ),
    ],
)
def test_errors_in_a_file_name_key_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "ix-config"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_plugin_config(path)
    assert str(info.value).startswith(f"{path}: {message.removeprefix('ix-config: ')}")


@pytest.mark.parametrize(
    ("doc", "strategy"),
    [
        ({}, "envvar"),
        ({"deviceListStrategy": "cdi"}, "cdi"),
        ({"flags": {"plugin": {"deviceListStrategy": "cdi-cri"}}}, "cdi"),
        ({"flags": {"plugin": {"deviceListStrategy": ["envvar", "cdi-cri"]}}}, "cdi"),
        ({"flags": {"plugin": {"deviceListStrategy": "envvar"}}}, "envvar"),
    ],
)
def test_device_list_strategy_ours_or_nvidias(doc: dict[str, Any], strategy: str) -> None:
    assert parse_plugin_config(doc).device_list_strategy == strategy
