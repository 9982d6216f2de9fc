"""What the fake backend's devices file says, as plain data: made by the validating scan in a child
(:mod:`.fake_devices`, pydantic) and read by the backend in the agent (:mod:`.fake`), which
therefore never imports the schema.
"""

from __future__ import annotations

from dataclasses import dataclass

from ix_gpu.node.backends.base import Chip


@dataclass(frozen=True)
class FakeScan:
    """A validated devices file (schema: :mod:`.fake_devices`), as plain data."""

    vendor: str
    control_nodes: tuple[str, ...]
    library_error: str | None
    chips: tuple[Chip, ...]
    telemetry: tuple[tuple[str, tuple[tuple[str, float], ...], float], ...] = ()
    """Per chip: (uuid, its figures, seconds a read of it blocks), as the file gives them."""
    resets: tuple[FakeReset, ...] = ()
    """Per chip whose file entry says how a reset of it goes (``reset:``)."""


@dataclass(frozen=True)
class FakeReset:
    """How a reset of one fake chip goes (its ``reset:`` in the devices file)."""

    uuid: str
    fails: str | None = None
    """The tool's error: the reset fails with it."""
    seconds: float = 0.0
    """How long the reset takes (past the caller's timeout: it times out)."""
    uuid_after: str | None = None
    """The chip's UUID once reset (a board whose identity changes, as real ones may)."""
