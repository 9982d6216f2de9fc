"""The figures tests/k8s/rollout_load.py gives for a rollout (what ``bench/rollout.py`` prints and
the upgrade test on the real nodes asserts), from a made-up rollout: no cluster. The load itself
runs in test_real_nodes_volcano.py's upgrade test, through the same ``upgrade_then_rollback`` the
bench calls."""

from __future__ import annotations

from tests.k8s.rollout_load import Create, Load, Rollout, Sample


def sample(at: float, allocatable: int, devices: int, dra: set[tuple[str, str]]) -> Sample:
    return Sample(
        at,
        {"gpu-a": allocatable, "gpu-b": 0},
        {"gpu-b": devices},
        {"webhook": frozenset(), "device-plugin": frozenset(), "dra-plugin": frozenset(dra)},
    )


def rollout() -> Rollout:
    """100 s to 130 s: creates stored at 101, 102 and 110 (one refused), gpu-a's allocatable 8
    but 0 at 115, gpu-b's devices 2 throughout; the DRA plugin's pod ``old`` replaced by ``new``
    between 104 and 112."""
    creates = [
        Create(
            "device-plugin",
            "a",
            100.5,
            1,
            101.0,
            mutated=True,
            ended="Succeeded",
            scheduled_s=0.2,
            started_s=1.2,
        ),
        Create(
            "claim", "b", 101.5, 2, 102.0, mutated=True, ended="Succeeded", scheduled_s=0.5, started_s=9.5
        ),
        Create("opted-out", "c", 102.5, 1, 110.0, mutated=False),
        Create("claim", "d", 120.0, 6, None, refusals=["500 failed calling webhook"] * 6),
    ]
    old, new = {("old", "ready")}, {("new", "starting")}
    samples = [
        sample(100.0, 8, 2, old),
        sample(104.0, 8, 2, {("old", "terminating")}),
        sample(108.0, 8, 2, new),
        sample(112.0, 8, 2, {("new", "ready")}),
        sample(115.0, 0, 2, {("new", "ready")}),
        sample(125.0, 8, 2, {("new", "ready")}),
    ]
    load = Load.__new__(Load)
    load.creates, load.samples = creates, samples
    load.device_plugin_node, load.dra_node = "gpu-a", "gpu-b"
    return load.window("upgrade", 100.0, 130.0, 12.0)


def test_the_figures_name_the_longest_gaps_the_least_capacity_and_each_failure() -> None:
    figures = rollout().figures()
    assert figures["rollSeconds"] == 30.0 and figures["helmSeconds"] == 12.0
    # Stored at 101, 102, 110; nothing after 110 until the end at 130.
    assert figures["longestAdmissionGapSeconds"] == 20.0
    # Bound at 102.5, started at 111.5: the claim waited 9 s on its node.
    assert figures["longestPrepareSeconds"] == 9.0 and figures["longestClaimPodStartSeconds"] == 9.5
    assert figures["minCapacity"] == {"gpu-a": 0, "gpu-b": 2}
    assert figures["rollWindows"] == {"dra-plugin": [4.0, 12.0]}
    assert (figures["retried"], figures["failedAfterRetry"]) == (2, 1)
    assert (figures["storedUnmutated"], figures["optedOutMutated"]) == (0, 0)
    assert figures["podEnds"] == {"Succeeded": 2}


def test_a_claim_pod_waiting_on_its_node_while_the_dra_plugin_rolled_is_found() -> None:
    """Bound at 102.5 (before the roll began at 104), started at 111.5 (before it ended at 112): it
    waited through the roll; the device-plugin pod, done at 102.2, did not."""
    assert [c.name for c in rollout().on_node_during("dra-plugin")] == ["b"]
    assert rollout().on_node_during("dra-plugin", kind="device-plugin") == []
