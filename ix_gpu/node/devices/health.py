"""Chip health with hysteresis: fail fast, recover only after a streak of healthy checks.

State is kept per *chip UUID*, not per advertised device, so it survives a config reload that
toggles ``splitboard`` or ``replicas`` (which renames every device). A device is Healthy when all of
its chips are; a board is therefore Unhealthy as soon as any of its chips is.

A backend failure (the library cannot answer at all) makes every known chip Unhealthy with the
library's message as the reason: the scheduler must stop placing pods on GPUs nobody can vouch for.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from ix_gpu.node.backends.base import Chip
from ix_gpu.node.devices.device_list import PhysicalDevice

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Transition:
    uuid: str
    healthy: bool
    reason: str

    def describe(self) -> str:
        if self.healthy:
            return f"chip {self.uuid} is Healthy again: {self.reason}"
        return f"chip {self.uuid} is Unhealthy: {self.reason}"


@dataclass
class _ChipState:
    healthy: bool
    reason: str
    streak: int = 0


class HealthTracker:
    """Feed it one observation per health check; it says which chips changed state."""

    def __init__(self, recover_after: int) -> None:
        self.recover_after = recover_after
        self._state: dict[str, _ChipState] = {}

    def observe(self, chips: Iterable[Chip]) -> list[Transition]:
        """Record a successful poll. Chips seen for the first time take their state as reported:
        there is nothing to recover from yet."""
        transitions: list[Transition] = []
        seen: set[str] = set()
        for chip in chips:
            seen.add(chip.uuid)
            state = self._state.get(chip.uuid)
            if state is None:
                self._state[chip.uuid] = _ChipState(healthy=chip.healthy, reason=chip.unhealthy_reason)
                if not chip.healthy:
                    transitions.append(Transition(chip.uuid, False, chip.unhealthy_reason))
                continue
            transitions.extend(self._step(chip.uuid, state, chip.unhealthy_reason))
        for uuid in list(self._state):
            if uuid not in seen:
                # A vanished chip has no devices to advertise; forget it so a chip that comes back
                # (driver reload) starts fresh.
                del self._state[uuid]
        return transitions

    def observe_failure(self, reason: str) -> list[Transition]:
        """The backend could not answer: every known chip counts as one unhealthy check."""
        transitions: list[Transition] = []
        for uuid, state in self._state.items():
            transitions.extend(self._step(uuid, state, reason))
        return transitions

    def _step(self, uuid: str, state: _ChipState, reason: str) -> list[Transition]:
        if reason:
            state.streak = 0
            if state.healthy:
                state.healthy, state.reason = False, reason
                return [Transition(uuid, False, reason)]
            state.reason = reason
            return []
        if state.healthy:
            return []
        state.streak += 1
        if state.streak >= self.recover_after:
            previous = state.reason
            state.healthy, state.reason, state.streak = True, "", 0
            return [
                Transition(uuid, True, f"{self.recover_after} consecutive healthy checks after: {previous}")
            ]
        return []

    def chip_reason(self, uuid: str) -> str:
        """Why the chip counts as Unhealthy now (``""`` when Healthy or unknown)."""
        state = self._state.get(uuid)
        if state is None or state.healthy:
            return ""
        return state.reason or "unhealthy"

    def device_reason(self, device: PhysicalDevice) -> str:
        reasons = [f"{chip.uuid}: {r}" for chip in device.chips if (r := self.chip_reason(chip.uuid))]
        return "; ".join(reasons)
