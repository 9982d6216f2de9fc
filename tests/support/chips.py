"""Chips as a discovery backend reports them, for the device-list, allocation and sharing tests."""

from __future__ import annotations

from collections.abc import Sequence

from ix_gpu.node.backends.base import Chip


def chips(boards: int, per_board: int = 2, numa_of: Sequence[int | None] = (0, 0, 1, 1)) -> list[Chip]:
    """``boards`` BI-V150 boards of ``per_board`` chips: chip i has UUID C<i>, index and minor i,
    board b<i // per_board>, and board b's NUMA node is ``numa_of[b % len(numa_of)]``."""
    return [
        Chip(
            f"C{b * per_board + p}",
            b * per_board + p,
            b * per_board + p,
            f"b{b}",
            p,
            "BI-V150",
            32768,
            numa_of[b % len(numa_of)],
        )
        for b in range(boards)
        for p in range(per_board)
    ]
