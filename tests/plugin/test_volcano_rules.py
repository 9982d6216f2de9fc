"""``flags.usevolcano``'s rules (ix_gpu.plugin.offer.volcano), pure: which pod an Allocate is for,
what this node's pods hold, and what one request binds: Volcano's devices, the kubelet's, or
nothing."""

from __future__ import annotations

from typing import Any

import pytest

from ix_gpu.node.backends.base import Chip
from ix_gpu.node.devices.device_list import build_device_list
from ix_gpu.plugin.offer.volcano import (
    CONSUMED,
    DEV_KUBELET,
    DEV_REAL_ALLOC,
    DEV_VOLCANO,
    FALLBACK,
    PREDICATE_TIME,
    REFUSED,
    UNMATCHED,
    UNTIMED,
    VOLCANO,
    PodFacts,
    decide,
    holdings,
    match,
    pod_facts,
    predicate_order,
    resolver,
)

CHIPS = [
    Chip(f"GPU-{b}{p}", 2 * b + p, 2 * b + p, f"b{b}", p, "Iluvatar BI-V150", 32768, 0)
    for b in range(2)
    for p in range(2)
]
SPLIT = build_device_list(CHIPS, splitboard=True, replicas=1)
BOARDS = build_device_list(CHIPS, splitboard=False, replicas=1)
SHARED = build_device_list(CHIPS, splitboard=True, replicas=2)
HEALTHY = {d.id: True for d in SPLIT.devices}


def api_pod(
    name: str,
    annotations: dict[str, str] | None = None,
    phase: str = "Pending",
    deleting: bool = False,
    namespace: str = "ml",
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "namespace": namespace,
        "name": name,
        "uid": f"uid-{name}",
        "annotations": annotations or {},
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": metadata, "spec": {"nodeName": "n"}, "status": {"phase": phase}}


def pod(name: str, volcano: str | None = None, when: str | None = None, **kw: Any) -> PodFacts:
    notes = dict(kw.pop("annotations", {}))
    if volcano is not None:
        notes[DEV_VOLCANO] = volcano
    if when is not None:
        notes[PREDICATE_TIME] = when
    facts = pod_facts(api_pod(name, notes, **kw))
    assert facts is not None
    return facts


def running(name: str, real_alloc: str, kubelet: str = "") -> PodFacts:
    """A running pod that was bound ``real_alloc`` where the kubelet chose ``kubelet`` (as the
    write-back records them)."""
    notes = {DEV_REAL_ALLOC: real_alloc, **({DEV_KUBELET: kubelet} if kubelet else {})}
    return pod(name, phase="Running", annotations=notes)


def test_a_pod_is_read_as_the_annotations_4_4_writes_and_reads() -> None:
    facts = pod_facts(
        api_pod(
            "p",
            {DEV_VOLCANO: "GPU-00, GPU-01", PREDICATE_TIME: "17", DEV_REAL_ALLOC: "GPU-00", "x": "y"},
            phase="Running",
        )
    )
    assert facts == PodFacts(
        "uid-p", "ml", "p", "Running", False, ("GPU-00", "GPU-01"), "17", None, ("GPU-00",)
    )
    assert facts.key == "ml/p" and facts.consumed and not facts.waiting
    for junk in (None, [], {"metadata": []}, {"metadata": {"name": "p"}}, {"metadata": {"uid": 3}}):
        assert pod_facts(junk) is None
    huge = pod_facts(api_pod("h", {DEV_VOLCANO: "G," * 20000}))
    assert huge is not None and huge.volcano is None  # never kept, never matched


def test_the_smallest_predicate_time_wins_and_an_untimed_pod_comes_last() -> None:
    pods = [
        pod("late", "GPU-00", "300"),
        pod("untimed", "GPU-01"),
        pod("garbage", "GPU-02", "soon"),
        pod("early", "GPU-03", "20"),
        pod("earlier", "GPU-10", "9"),
    ]
    assert [predicate_order(p) for p in pods] == [300, UNTIMED, UNTIMED, 20, 9]
    chosen = match(pods, 1)
    assert chosen is not None and chosen.name == "earlier"
    # Among pods without a time, the key decides: one answer, whatever the order of the cache.
    untimed = match([pods[2], pods[1]], 1)
    assert untimed is not None and untimed.name == "garbage"
    assert match(list(reversed(pods)), 1) == chosen


def test_only_a_devvolcano_of_the_requested_size_matches() -> None:
    pods = [pod("two", "GPU-00,GPU-01", "1"), pod("one", "GPU-10", "2")]
    assert match(pods, 2) == pods[0]
    assert match(pods, 1) == pods[1]
    assert match(pods, 3) is None
    assert match([pod("plain")], 1) is None  # no annotation: not a Volcano pod


@pytest.mark.parametrize(
    ("skipped", "why"),
    [
        (pod("x", "GPU-00", "1", deleting=True), "being deleted"),
        (pod("x", "GPU-00", "1", phase="Running"), "running: allocated already"),
        (pod("x", "GPU-00", "1", phase="Succeeded"), "over"),
        (pod("x", "GPU-00", "1", phase="Failed"), "over"),
        (pod("x", "GPU-00", CONSUMED), "consumed: predicate-time MaxUint64"),
        (pod("x", "GPU-00", "1", annotations={DEV_REAL_ALLOC: "GPU-00"}), "bound before a restart"),
    ],
)
def test_consumed_deleted_and_started_pods_are_never_matched(skipped: PodFacts, why: str) -> None:
    later = pod("later", "GPU-01", "5")
    assert match([skipped, later], 1) == later, why


def test_pods_bound_in_memory_or_listed_by_the_kubelet_are_not_matched_again() -> None:
    first, second = pod("a", "GPU-00", "1"), pod("b", "GPU-01", "2")
    assert match([first, second], 1, taken={"uid-a"}) == second
    assert match([first, second], 1, busy={"ml/a"}) == second
    assert match([first, second], 1, taken={"uid-a"}, busy={"ml/b"}) is None


def test_volcanos_devices_are_bound_when_on_the_node_healthy_and_free() -> None:
    resolve = resolver(SPLIT)
    p = pod("p", "GPU-11", "1")
    decision = decide(["GPU-00"], p, HEALTHY, [], resolve, verified=True)
    assert (decision.outcome, decision.ids, decision.pod) == (VOLCANO, ("GPU-11",), p)


@pytest.mark.parametrize(
    ("volcano", "reason"),
    [
        ("GPU-99", "'GPU-99', not among this node's advertised devices"),
        ("GPU-00::1", "not among this node's advertised devices"),  # a replica of another config
        ("GPU-10,GPU-10", "a repeated entry"),
        ("GPU-10,", "an empty"),
        ("GPU-01", "'GPU-01', which is Unhealthy"),
        ("GPU-10", "'GPU-10', which pod ml/holder holds"),
    ],
)
def test_devices_not_on_the_node_unhealthy_or_held_fall_back_to_the_kubelets(
    volcano: str, reason: str
) -> None:
    resolve = resolver(SPLIT)
    health = {**HEALTHY, "GPU-01": False}
    holder = running("holder", "GPU-10", "GPU-00")
    held = holdings([holder], {"ml/holder": ("GPU-00",)}, {}, resolve, verified=True)
    p = pod("p", volcano, "1")
    decision = decide(["GPU-00"] * len(p.volcano or ()), p, health, held, resolve, verified=True)
    assert (decision.outcome, decision.ids) == (FALLBACK, ("GPU-00",) * len(p.volcano or ()))
    assert reason in decision.reason


def test_without_the_kubelets_answer_volcanos_devices_are_not_bound() -> None:
    resolve = resolver(SPLIT)
    decision = decide(["GPU-00"], pod("p", "GPU-11", "1"), HEALTHY, [], resolve, verified=False)
    assert decision.outcome == FALLBACK and "PodResources API did not answer" in decision.reason


def test_the_kubelets_choice_colliding_with_a_volcano_holding_is_refused_naming_the_holder() -> None:
    """The kubelet believes ml/v holds GPU-00 (its own choice for it); Volcano bound GPU-11. The
    kubelet now gives GPU-11 to another pod: refused, whether that pod matched or not."""
    resolve = resolver(SPLIT)
    v = pod("v", phase="Running", annotations={DEV_KUBELET: "GPU-00", DEV_REAL_ALLOC: "GPU-11"})
    held = holdings([v], {"ml/v": ("GPU-00",)}, {}, resolve, verified=True)
    assert [(h.holder, h.device_id) for h in held] == [("ml/v", "GPU-11")]
    unmatched = decide(["GPU-11"], None, HEALTHY, held, resolve, verified=True)
    assert unmatched.outcome == REFUSED and unmatched.ids == ()
    assert "chose 'GPU-11', which pod ml/v holds" in unmatched.reason
    assert "no pod on this node waits" in unmatched.reason
    stray = pod("p", "GPU-99", "1")
    fallback = decide(["GPU-11"], stray, HEALTHY, held, resolve, verified=True)
    assert fallback.outcome == REFUSED and "not among this node's advertised devices" in fallback.reason
    # The chip the kubelet believes taken is free: binding it is no collision.
    assert decide(["GPU-00"], None, HEALTHY, held, resolve, verified=True).outcome == UNMATCHED


def test_devrealalloc_is_read_back_after_a_restart_and_wins_over_the_kubelets_list() -> None:
    """A fresh process (nothing bound in memory): each pod holds its DevRealAlloc; a pod without
    one holds what PodResources lists; a pod the watch does not show yet holds the kubelet's
    list; a pod that is over holds nothing."""
    resolve = resolver(SPLIT)
    pods = [
        pod("volcano", phase="Running", annotations={DEV_REAL_ALLOC: "GPU-11", DEV_KUBELET: "GPU-00"}),
        pod("plain", phase="Running"),
        pod("done", phase="Succeeded", annotations={DEV_REAL_ALLOC: "GPU-10"}),
    ]
    kubelet = {"ml/volcano": ("GPU-00",), "ml/plain": ("GPU-01",), "ml/new": ("GPU-10",)}
    held = holdings(pods, kubelet, {}, resolve, verified=True)
    assert sorted((h.holder, h.device_id) for h in held) == [
        ("ml/new", "GPU-10"),
        ("ml/plain", "GPU-01"),
        ("ml/volcano", "GPU-11"),
    ]
    # What this process bound and the watch has not shown yet wins over the kubelet's list.
    fresh = pod("fresh", phase="Pending")
    held = holdings([fresh], {"ml/fresh": ("GPU-00",)}, {"uid-fresh": ("GPU-10",)}, resolve, verified=True)
    assert [(h.holder, h.device_id) for h in held] == [("ml/fresh", "GPU-10")]


def test_a_board_holds_both_its_chips_and_replicas_share_a_chip_but_not_an_id() -> None:
    resolve = resolver(BOARDS)
    held = holdings([running("b", "GPU-00", "GPU-10")], {"ml/b": ("GPU-10",)}, {}, resolve, verified=True)
    assert held[0].chips == {"GPU-00", "GPU-01"}
    boards = {d.id: True for d in BOARDS.devices}
    assert decide(["GPU-00"], None, boards, held, resolve, verified=True).outcome == REFUSED
    assert (
        decide(["GPU-00"], pod("p", "GPU-10", "1"), boards, held, resolve, verified=True).outcome == VOLCANO
    )
    shared = resolver(SHARED)
    held = holdings(
        [running("r", "GPU-00::0", "GPU-11::1")], {"ml/r": ("GPU-11::1",)}, {}, shared, verified=True
    )
    health = {d.id: True for d in SHARED.devices}
    other_replica = decide(["GPU-10::0"], pod("p", "GPU-00::1", "1"), health, held, shared, verified=True)
    assert other_replica.outcome == VOLCANO
    same_replica = decide(["GPU-10::0"], pod("p", "GPU-00::0", "1"), health, held, shared, verified=True)
    assert same_replica.outcome == FALLBACK and "which pod ml/r holds" in same_replica.reason
    whole = holdings([running("w", "GPU-00", "GPU-11")], {"ml/w": ("GPU-11",)}, {}, shared, verified=True)
    assert decide(["GPU-00::1"], None, health, whole, shared, verified=True).outcome == REFUSED


def test_a_pod_never_collides_with_itself() -> None:
    """A second container of a matched pod: its own holding is not another pod's."""
    resolve = resolver(SPLIT)
    p = pod("p", "GPU-10", "1")
    held = holdings([p], {}, {"uid-p": ("GPU-10",)}, resolve, verified=True)
    assert decide(["GPU-00"], p, HEALTHY, held, resolve, verified=True).outcome == VOLCANO


def test_a_devrealalloc_the_kubelet_does_not_back_is_not_believed() -> None:
    """A pod's owner writes its annotations. A DevRealAlloc forged at creation must neither hide the
    chip the kubelet really gave the pod (another pod would be bound to it too) nor take chips the
    pod never got: it counts only with a DevKubelet naming what the kubelet lists, and as many.
    Without PodResources every DevRealAlloc is believed (a refusal too many, never a chip twice)."""
    resolve = resolver(SPLIT)
    forged = [
        running("idle", "GPU-00,GPU-01,GPU-10,GPU-11"),  # no GPU from the kubelet
        running("greedy", "GPU-00,GPU-01,GPU-10"),  # one GPU from the kubelet
        running("hiding", "GPU-01", "GPU-00"),  # got GPU-11; claims it was bound GPU-01 instead
    ]
    kubelet = {"ml/greedy": ("GPU-10",), "ml/hiding": ("GPU-11",)}
    held = holdings(forged, kubelet, {}, resolve, verified=True)
    assert sorted((h.holder, h.device_id) for h in held) == [("ml/greedy", "GPU-10"), ("ml/hiding", "GPU-11")]
    assert decide(["GPU-00"], None, HEALTHY, held, resolve, verified=True).outcome == UNMATCHED
    stealing = decide(["GPU-00"], pod("p", "GPU-11", "1"), HEALTHY, held, resolve, verified=True)
    assert stealing.outcome == FALLBACK and "which pod ml/hiding holds" in stealing.reason
    unverified = holdings(forged, {}, {}, resolve, verified=False)
    assert len(unverified) == 8
    assert decide(["GPU-00"], None, HEALTHY, unverified, resolve, verified=False).outcome == REFUSED
