"""Health hysteresis: immediate failure, recovery only after recoverAfter healthy checks."""

from __future__ import annotations

from dataclasses import replace

from ix_gpu.node.backends.base import Chip
from ix_gpu.node.devices.device_list import build_device_list
from ix_gpu.node.devices.health import HealthTracker

A = Chip("GPU-a", 0, 0, "b0", 0, "BI-V150", 32768, 0)
B = Chip("GPU-b", 1, 1, "b0", 1, "BI-V150", 32768, 0)
HOT_B = replace(B, unhealthy_reason="over temperature (health 0x4)")


def test_board_unhealthy_when_any_chip_is_and_recovers_after_streak() -> None:
    tracker = HealthTracker(recover_after=3)
    board = build_device_list([A, B], splitboard=False, replicas=1).physical[0]
    assert tracker.observe([A, B]) == []
    assert tracker.device_reason(board) == ""

    (t,) = tracker.observe([A, HOT_B])
    assert (t.uuid, t.healthy) == ("GPU-b", False)
    assert "over temperature" in tracker.device_reason(board)

    assert tracker.observe([A, B]) == []
    assert tracker.observe([A, B]) == []
    assert tracker.device_reason(board) != ""
    (t,) = tracker.observe([A, B])
    assert (t.uuid, t.healthy) == ("GPU-b", True)
    assert "3 consecutive healthy checks" in t.reason
    assert tracker.device_reason(board) == ""


def test_a_relapse_resets_the_streak() -> None:
    tracker = HealthTracker(recover_after=2)
    tracker.observe([HOT_B])
    assert tracker.observe([B]) == []
    assert tracker.observe([HOT_B]) == []
    assert tracker.observe([B]) == []
    assert [t.healthy for t in tracker.observe([B])] == [True]


def test_backend_failure_marks_all_known_chips_and_they_recover() -> None:
    tracker = HealthTracker(recover_after=1)
    tracker.observe([A, B])
    transitions = tracker.observe_failure("library error: nvmlInit failed")
    assert {(t.uuid, t.healthy) for t in transitions} == {("GPU-a", False), ("GPU-b", False)}
    assert tracker.chip_reason("GPU-a") == "library error: nvmlInit failed"
    assert {t.uuid for t in tracker.observe([A, B])} == {"GPU-a", "GPU-b"}
    assert tracker.chip_reason("GPU-a") == ""


def test_new_unhealthy_chip_is_reported_and_vanished_chip_forgotten() -> None:
    tracker = HealthTracker(recover_after=3)
    (t,) = tracker.observe([A, HOT_B])
    assert (t.uuid, t.healthy) == ("GPU-b", False)
    tracker.observe([A])
    assert tracker.chip_reason("GPU-b") == ""
    assert tracker.observe([A, B]) == []  # came back healthy: fresh start, no transition
