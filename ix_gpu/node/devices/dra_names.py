"""The names of a node's devices in its DRA ResourceSlice, and back: which chips a name means.

Both agents need them: ``ix-gpu dra`` names the devices it publishes, and the device plugin, which
serves every chip's telemetry, finds the chips of a DRA claim that the kubelet's PodResources API
reports by pool and device name. One rule, here, so the two cannot drift apart.

Names must be DNS labels, so a chip's UUID (upper case in libixml) cannot be one: a chip device is
``gpu-<index>`` and a board device ``board-<index of its first chip>``.
"""

from __future__ import annotations

from collections.abc import Iterable

from ix_gpu.node.backends.base import Chip
from ix_gpu.node.devices.device_list import PhysicalDevice


def dra_device_name(device: PhysicalDevice, *, board: bool) -> str:
    first = min(chip.index for chip in device.chips)
    return f"board-{first}" if board else f"gpu-{first}"


def chips_of_dra_device(name: str, chips: Iterable[Chip]) -> tuple[Chip, ...]:
    """The chips ``name`` covers on this node (none for a name that is not ours)."""
    kind, _, number = name.partition("-")
    if kind not in ("gpu", "board") or not number.isdigit():
        return ()
    index = int(number)
    chips = list(chips)
    if kind == "gpu":
        return tuple(chip for chip in chips if chip.index == index)
    boards = {chip.board_id for chip in chips if chip.index == index}
    return tuple(sorted((chip for chip in chips if chip.board_id in boards), key=lambda chip: chip.index))
