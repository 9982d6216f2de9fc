"""From chips to the device IDs the kubelet sees: board grouping and time-slicing replicas.

The vendor plugin's semantics, which operators' capacity planning already relies on:

* ``splitboard: false`` — one device per *board*, named by the UUID of the chip at board position 0,
  so a BI-V150 (two chips) is one ``iluvatar.com/gpu`` and a pod gets both chips.
* ``splitboard: true`` — one device per chip, named by the chip's UUID.
* ``replicas: R`` (R > 1) — each of those devices is advertised R times as ``<id>::<i>``.
  ``replicas: 1`` keeps the plain IDs, so turning sharing off does not rename devices.
* NVIDIA's ``devices`` selection (see :mod:`ix_gpu.node.devices.sharing`) replicates only some
  devices; the others keep their plain IDs in the same list, as in NVIDIA's plugin. A chip index or
  UUID selects the device holding that chip: with ``splitboard: false``, the whole board.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ix_gpu.config.plugin_runtime import DeviceSelection
from ix_gpu.node.backends.base import Chip

REPLICA_SEPARATOR = "::"


@dataclass(frozen=True)
class PhysicalDevice:
    """What one pod gets exclusively when nothing is shared: a whole board, or one chip."""

    id: str
    chips: tuple[Chip, ...]
    board_id: str

    @property
    def product(self) -> str:
        return self.chips[0].product

    @property
    def memory_mib(self) -> int:
        return sum(chip.memory_mib for chip in self.chips)

    @property
    def numa_node(self) -> int | None:
        # Chips of one board sit behind one PCIe switch, hence one NUMA node; take the first
        # chip's answer rather than inventing a rule for a board that spans two.
        return self.chips[0].numa_node

    @property
    def minors(self) -> tuple[int, ...]:
        return tuple(chip.minor for chip in self.chips)


@dataclass(frozen=True)
class Device:
    """One entry of the ListAndWatch list."""

    id: str
    physical: PhysicalDevice
    replica: int | None = None
    """Replica number under time-slicing, ``None`` when the device is not shared."""


@dataclass(frozen=True)
class DeviceList:
    """The complete advertised set for one configuration and one discovery result."""

    physical: tuple[PhysicalDevice, ...]
    devices: tuple[Device, ...]
    replicas: int
    """Replicas per shared device (1: nothing is shared)."""
    by_id: Mapping[str, Device] = field(repr=False, compare=False)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(device.id for device in self.devices)

    @property
    def shared(self) -> bool:
        return self.replicas > 1


def _group_by_board(chips: Iterable[Chip]) -> list[tuple[Chip, ...]]:
    boards: dict[str, list[Chip]] = {}
    for chip in chips:
        boards.setdefault(chip.board_id, []).append(chip)
    grouped = [
        tuple(sorted(members, key=lambda c: (c.board_position, c.minor))) for members in boards.values()
    ]
    # Present boards in device-node order, which is what ``ixsmi`` shows operators.
    grouped.sort(key=lambda members: min(c.minor for c in members))
    return grouped


def physical_devices(chips: Iterable[Chip], splitboard: bool) -> tuple[PhysicalDevice, ...]:
    """Group chips into the units a pod can own.

    A board whose position-0 chip is missing (one chip hidden by the driver) is named by its
    lowest-positioned chip, so the board still appears instead of vanishing from capacity.
    """
    out: list[PhysicalDevice] = []
    for board in _group_by_board(chips):
        if splitboard:
            out.extend(PhysicalDevice(id=chip.uuid, chips=(chip,), board_id=chip.board_id) for chip in board)
        else:
            out.append(PhysicalDevice(id=board[0].uuid, chips=board, board_id=board[0].board_id))
    return tuple(out)


def replica_id(physical_id: str, replica: int) -> str:
    return f"{physical_id}{REPLICA_SEPARATOR}{replica}"


def selected(physical: Sequence[PhysicalDevice], selection: DeviceSelection, key: str) -> set[str]:
    """IDs of the physical devices ``selection`` names; ``key`` is the config key, for messages.

    A count takes the first devices in list order (what ``ix-gpu devices`` prints). An index or UUID
    that no chip on this node has is an error, as in NVIDIA's plugin: sharing the wrong GPU, or
    none, because of a typo is worse than refusing the new config."""
    if selection == "all":
        return {phys.id for phys in physical}
    if isinstance(selection, int):
        if selection > len(physical):
            raise ValueError(
                f"{key}.devices: {selection} devices to share, but this node has {len(physical)}"
            )
        return {phys.id for phys in physical[:selection]}
    holder = {ref: phys.id for phys in physical for chip in phys.chips for ref in (chip.index, chip.uuid)}
    missing = [ref for ref in selection if ref not in holder]
    if missing and physical:  # no chips at all (not discovered yet): nothing to select, no error
        what = "index" if isinstance(missing[0], int) else "UUID"
        raise ValueError(f"{key}.devices: no chip with {what} {missing[0]!r} on this node")
    return {holder[ref] for ref in selection if ref in holder}


def build_device_list(
    chips: Iterable[Chip],
    *,
    splitboard: bool,
    replicas: int,
    shared: DeviceSelection = "all",
    key: str = "sharing.timeSlicing",
) -> DeviceList:
    """The advertised list: ``replicas`` per device that ``shared`` selects, one of every other.
    ``key`` names the config entry that chose ``shared``, for the error when it selects a chip
    this node does not have."""
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    physical = physical_devices(chips, splitboard)
    replicated = selected(physical, shared, key) if replicas > 1 else set()
    devices: list[Device] = []
    for phys in physical:
        if phys.id not in replicated:
            devices.append(Device(id=phys.id, physical=phys))
        else:
            devices.extend(
                Device(id=replica_id(phys.id, i), physical=phys, replica=i) for i in range(replicas)
            )
    by_id = {device.id: device for device in devices}
    if len(by_id) != len(devices):
        ids = [d.id for d in devices]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"duplicate device IDs from discovery (two chips share a UUID?): {', '.join(dupes)}")
    return DeviceList(physical=physical, devices=tuple(devices), replicas=replicas, by_id=by_id)
