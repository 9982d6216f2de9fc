"""Device list semantics: the seed's numbers for splitboard and time-slicing replicas."""

from __future__ import annotations

from pathlib import Path

import pytest

from ix_gpu.node.backends.base import BackendError, Chip, decode_ixml_health
from ix_gpu.node.devices.device_list import build_device_list
from ix_gpu.node.fake_devices_file import fake_backend
from tests.support.paths import FAKE_DEVICES


def chip(uuid: str, minor: int, board: str, position: int, numa: int | None = 0) -> Chip:
    return Chip(
        uuid=uuid,
        index=minor,
        minor=minor,
        board_id=board,
        board_position=position,
        product="Iluvatar BI-V150",
        memory_mib=32768,
        numa_node=numa,
    )


ONE_BI_V150 = [chip("GPU-b", 1, "b0", 1), chip("GPU-a", 0, "b0", 0)]


def test_seed_single_board_capacity_one_or_two() -> None:
    whole = build_device_list(ONE_BI_V150, splitboard=False, replicas=1)
    assert whole.ids == ("GPU-a",)  # the chip at board position 0 names the board
    assert [c.uuid for c in whole.devices[0].physical.chips] == ["GPU-a", "GPU-b"]
    assert whole.devices[0].physical.memory_mib == 65536
    split = build_device_list(ONE_BI_V150, splitboard=True, replicas=1)
    assert split.ids == ("GPU-a", "GPU-b")


def test_board_id_follows_position_not_enumeration_order() -> None:
    chips = [chip("GPU-x", 0, "b0", 1), chip("GPU-y", 1, "b0", 0)]
    assert build_device_list(chips, splitboard=False, replicas=1).ids == ("GPU-y",)


@pytest.mark.parametrize(
    ("splitboard", "replicas", "count"),
    [(False, 1, 2), (True, 1, 4), (False, 4, 8), (True, 4, 16)],
)
def test_example_file_gives_the_seed_numbers(splitboard: bool, replicas: int, count: int) -> None:
    chips = fake_backend(FAKE_DEVICES).chips()
    assert len(chips) == 4
    devices = build_device_list(chips, splitboard=splitboard, replicas=replicas)
    assert len(devices.devices) == count
    assert len(set(devices.ids)) == count


def test_replica_ids_and_two_gpus_with_replicas_four() -> None:
    devices = build_device_list(ONE_BI_V150, splitboard=True, replicas=4)
    assert devices.ids == tuple(f"GPU-{c}::{i}" for c in "ab" for i in range(4))
    assert {d.replica for d in devices.devices} == {0, 1, 2, 3}
    assert devices.by_id["GPU-b::2"].physical.id == "GPU-b"


def test_replicas_one_keeps_plain_ids() -> None:
    assert build_device_list(ONE_BI_V150, splitboard=True, replicas=1).ids == ("GPU-a", "GPU-b")


def test_duplicate_uuids_are_refused() -> None:
    with pytest.raises(ValueError, match="GPU-a"):
        build_device_list([chip("GPU-a", 0, "b0", 0), chip("GPU-a", 1, "b1", 0)], splitboard=True, replicas=1)


def test_health_bitmask_is_decoded() -> None:
    assert decode_ixml_health(0) == ""
    assert decode_ixml_health(0x4) == "over temperature (health 0x4)"
    text = decode_ixml_health(0x11 | 0x100)
    assert "SYSHUB error" in text and "ECC error" in text and "unknown bits 0x100" in text


def test_fake_backend_rereads_changed_content(fake_devices: Path) -> None:
    backend = fake_backend(fake_devices)
    assert all(c.healthy for c in backend.chips())
    assert backend.control_nodes() == ("/dev/itrctl",)
    text = fake_devices.read_text()
    fake_devices.write_text(text.replace("health: 0", "health: 0x4", 1))
    chips = backend.chips()
    assert chips[0].unhealthy_reason == "over temperature (health 0x4)"
    assert all(c.healthy for c in chips[1:])
    fake_devices.write_text(text.replace("boards:", "libraryError: driver went away\nboards:"))
    with pytest.raises(BackendError, match="driver went away"):
        backend.chips()
    fake_devices.write_text("boards: [")
    with pytest.raises(BackendError, match="not valid YAML"):
        backend.chips()
    fake_devices.write_text(text)
    assert len(backend.chips()) == 4


def test_fake_backend_rejects_unknown_keys(short_tmp: Path) -> None:
    path = short_tmp / "d.yaml"
    path.write_text("boards:\n  - chips:\n      - uuid: GPU-a\n        helth: 4\n")
    with pytest.raises(BackendError, match=r"boards\[0\]\.chips\[0\]\.helth: unknown key"):
        fake_backend(path)
