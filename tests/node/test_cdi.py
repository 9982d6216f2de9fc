"""The CDI spec the plugin writes: valid against the CDI spec's documented schema, one device per
advertised ID (replicas included), driver edits shared, written atomically."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from ix_gpu.devicemodel.vendors import ILUVATAR, NVIDIA
from ix_gpu.node.backends.base import Chip
from ix_gpu.node.devices.cdi import (
    CdiError,
    cdi_spec,
    device_name,
    qualified_name,
    render,
    spec_path,
    write_spec,
)
from ix_gpu.node.devices.device_list import build_device_list
from ix_gpu.node.devices.ldcache_hook import ldcache_hook

SCHEMA = json.loads((Path(__file__).parent / "data" / "cdi-spec.schema.json").read_text())


def _chips(boards: int) -> list[Chip]:
    return [
        Chip(f"GPU-{b}{p}-5f2c", 2 * b + p, 2 * b + p, f"b{b}", p, "Iluvatar BI-V150", 32768, 0)
        for b in range(boards)
        for p in range(2)
    ]


def _valid(spec: dict[str, Any]) -> None:
    jsonschema.validate(spec, SCHEMA)


def test_the_schema_itself_refuses_what_cdi_refuses() -> None:
    """The schema can fail: a test that only ever validates our output would not show it."""
    good = {
        "cdiVersion": "0.5.0",
        "kind": "iluvatar.com/gpu",
        "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}],
    }
    _valid(good)
    bad: list[dict[str, Any]] = [
        {**good, "kind": "gpu"},
        {**good, "kind": "iluvatar.com/gpu/x"},
        {**good, "devices": []},
        {**good, "devices": [{"name": "-a", "containerEdits": {"env": ["A=1"]}}]},
        {**good, "devices": [{"name": "a b", "containerEdits": {"env": ["A=1"]}}]},
        {**good, "devices": [{"name": "a", "containerEdits": {}}]},
        {**good, "devices": [{"name": "a", "containerEdits": {"deviceNodes": [{"path": "dev/x"}]}}]},
        {**good, "devices": [{"name": "a", "containerEdits": {"mounts": [{"hostPath": "/x"}]}}]},
        {**good, "unknown": 1},
        {**good, "cdiVersion": "9.9.9"},
    ]
    for spec in bad:
        with pytest.raises(jsonschema.ValidationError):
            _valid(spec)


def test_one_device_per_board_with_both_chips_and_the_shared_driver_edits() -> None:
    devices = build_device_list(_chips(2), splitboard=False, replicas=1)
    spec = cdi_spec(devices, ILUVATAR, ["/dev/itrctl"])
    _valid(spec)
    assert spec["kind"] == "iluvatar.com/gpu"
    assert [d["name"] for d in spec["devices"]] == ["GPU-00-5f2c", "GPU-10-5f2c"]
    assert spec["devices"][0]["containerEdits"] == {
        "deviceNodes": [{"path": "/dev/iluvatar0"}, {"path": "/dev/iluvatar1"}]
    }
    assert spec["containerEdits"] == {
        "deviceNodes": [{"path": "/dev/itrctl"}],
        "mounts": [
            {
                "hostPath": "/usr/local/corex",
                "containerPath": "/usr/local/corex",
                "options": ["ro", "nosuid", "nodev", "bind"],
            }
        ],
        "hooks": [ldcache_hook(["/usr/local/corex/lib64"])],
    }
    # No variable at all: a CDI env edit replaces the image's and the pod's value. The
    # visible-devices variable is Allocate's (two devices would overwrite each other here).
    assert "env" not in spec["devices"][0]["containerEdits"]
    assert "IX_VISIBLE_DEVICES" not in json.dumps(spec)


def test_every_advertised_replica_is_a_cdi_device_so_any_allocated_id_resolves() -> None:
    devices = build_device_list(_chips(2), splitboard=True, replicas=4)
    spec = cdi_spec(devices, ILUVATAR, [])
    _valid(spec)
    names = {d["name"] for d in spec["devices"]}
    assert len(names) == 16 == len(devices.devices)
    for device in devices.devices:
        qualified = qualified_name(ILUVATAR, device.id)
        assert qualified.startswith("iluvatar.com/gpu=")
        assert qualified.split("=", 1)[1] in names
    assert "deviceNodes" not in spec["containerEdits"]  # no control nodes on this node


def test_a_moved_driver_root_moves_the_mount_and_the_cached_library_directory() -> None:
    spec = cdi_spec(
        build_device_list(_chips(1), splitboard=False, replicas=1), ILUVATAR, [], driver_root="/opt/corex"
    )
    _valid(spec)
    assert spec["containerEdits"]["mounts"][0]["hostPath"] == "/opt/corex"
    assert spec["containerEdits"]["hooks"] == [ldcache_hook(["/opt/corex/lib64"])]
    assert "env" not in spec["containerEdits"]


def test_nvidia_gets_device_nodes_only_its_toolkit_provides_the_driver() -> None:
    spec = cdi_spec(build_device_list(_chips(1), splitboard=True, replicas=1), NVIDIA, ["/dev/nvidiactl"])
    _valid(spec)
    assert spec["kind"] == "nvidia.com/gpu"
    assert spec["containerEdits"] == {"deviceNodes": [{"path": "/dev/nvidiactl"}]}
    assert spec["devices"][1]["containerEdits"] == {"deviceNodes": [{"path": "/dev/nvidia1"}]}


@pytest.mark.parametrize(
    ("device_id", "name"),
    [("GPU-1", "GPU-1"), ("GPU-1::3", "GPU-1::3"), ("0", "0"), ("a b/c", "a_b_c"), ("-x-", "x")],
)
def test_device_names_keep_ids_cdi_allows_and_mend_the_rest(device_id: str, name: str) -> None:
    assert device_name(device_id) == name


def test_ids_that_would_share_a_cdi_name_are_refused() -> None:
    chips = [Chip("a b", 0, 0, "b0", 0, "X", 1, 0), Chip("a/b", 1, 1, "b1", 0, "X", 1, 0)]
    with pytest.raises(CdiError, match="both become CDI name 'a_b'"):
        cdi_spec(build_device_list(chips, splitboard=True, replicas=1), ILUVATAR, [])
    with pytest.raises(CdiError):
        device_name("/::/")


def test_written_atomically_and_only_when_changed(tmp_path: Path) -> None:
    path = spec_path(tmp_path / "cdi", ILUVATAR)
    assert path.name == "iluvatar.com-gpu.json"
    first = cdi_spec(build_device_list(_chips(1), splitboard=False, replicas=1), ILUVATAR, [])
    assert write_spec(first, path) is True
    assert json.loads(path.read_text()) == first
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    mtime = path.stat().st_mtime_ns
    assert write_spec(first, path) is False
    assert path.stat().st_mtime_ns == mtime

    # A reader polling the file while it is rewritten many times never sees a partial spec.
    second = cdi_spec(build_device_list(_chips(8), splitboard=True, replicas=4), ILUVATAR, [])
    seen: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                json.loads(path.read_bytes())
            except ValueError as exc:
                seen.append(str(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(200):
        write_spec(second if i % 2 else first, path)
    stop.set()
    thread.join()
    assert seen == []
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary files left
    assert render(first).endswith(b"\n")
    assert not os.access(path.parent / f".{path.name}.tmp", os.F_OK)


def test_cdi_generate_command_writes_the_spec_for_what_the_plugin_would_advertise(tmp_path: Path) -> None:
    from tests.support.cli import ix_gpu
    from tests.support.paths import FAKE_DEVICES

    config = tmp_path / "ix-config"
    config.write_text(f"sharing:\n  timeSlicing:\n    replicas: 2\ncdi:\n  specDir: {tmp_path / 'cdi'}\n")
    args = (
        "cdi",
        "generate",
        "--backend",
        "fake",
        "--fake-devices",
        str(FAKE_DEVICES),
        "--config",
        str(config),
    )
    first = ix_gpu(*args, check=True)
    path = tmp_path / "cdi" / "iluvatar.com-gpu.json"
    assert first.stdout.strip() == f"wrote {path} (4 iluvatar.com/gpu devices)"
    spec = json.loads(path.read_text())
    _valid(spec)
    devices = ix_gpu(
        "devices", "--backend", "fake", "--fake-devices", str(FAKE_DEVICES), "--config", str(config)
    )
    advertised = {line.split()[0] for line in devices.stdout.splitlines()[2:]}
    assert {d["name"] for d in spec["devices"]} == advertised
    assert ix_gpu(*args, check=True).stdout.startswith("unchanged:")
    printed = ix_gpu(*args, "--output", "-", check=True).stdout
    assert json.loads(printed) == spec


def _failing_devices(tmp_path: Path) -> Path:
    """A fake devices file whose management library fails, as a node's broken driver would."""
    from tests.support.paths import FAKE_DEVICES

    path = tmp_path / "devices.yaml"
    path.write_text(FAKE_DEVICES.read_text() + "libraryError: driver not loaded\n")
    return path


@pytest.mark.parametrize("command", [("devices",), ("cdi", "generate", "--output", "-")])
def test_errors_go_to_stderr_never_into_the_output(tmp_path: Path, command: tuple[str, ...]) -> None:
    # cdi generate --output - is a spec stream: an error in it would be read as (broken) JSON.
    from tests.support.cli import ix_gpu

    result = ix_gpu(*command, "--backend", "fake", "--fake-devices", str(_failing_devices(tmp_path)))
    assert result.returncode == 1
    assert result.stdout == ""
    assert "driver not loaded" in result.stderr


def test_a_relative_driver_root_is_a_usage_error(tmp_path: Path) -> None:
    # A CDI spec's hostPath is read by the container runtime, relative to nothing we know.
    from tests.support.cli import ix_gpu
    from tests.support.paths import FAKE_DEVICES

    out = tmp_path / "spec.json"
    args = ("cdi", "generate", "--backend", "fake", "--fake-devices", str(FAKE_DEVICES), "--output", str(out))
    result = ix_gpu(*args, "--driver-root", "usr/local/corex")
    assert result.returncode == 2
    assert "--driver-root 'usr/local/corex': must be an absolute path" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()
