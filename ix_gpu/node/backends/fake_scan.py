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
