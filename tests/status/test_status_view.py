"""``ix-gpu status``'s view (:func:`ix_gpu.status.view.cluster_status`), from objects shaped as the API
server and the device plugin's /metrics give them: a device-plugin node whose chips, health and
holders come from the plugin's metrics; a DRA node from its slice and claims; a node whose plugin
could not be read; nodes without GPUs left out. The same view over a real cluster is in the
real-node tier (tests/k8s/test_real_nodes_dra.py)."""

from __future__ import annotations

import json
from typing import Any

from ix_gpu.devicemodel.vendors import ILUVATAR
from ix_gpu.dra.devices import dra_devices, slice_devices
from ix_gpu.node.backends.base import Chip
from ix_gpu.status.view import chips_from_metrics, cluster_status, render_text
from tests.status.objects import DRIVER, RESOURCE, claim, metrics, node, pod, slice_

LOST = "chips unknown: the device plugin's /metrics could not be read (ix-gpu-system/p: timed out)"


def status_of(**overrides: Any) -> dict[str, Any]:
    found: dict[str, Any] = {
        "nodes": [
            node("dp", gpus=8),
            node("dra", dra=True, product="BI-V150"),
            node("cpu"),
            node("lost", gpus=4),
        ],
        "pods": [
            pod("ml", "train", "dp", 2),
            pod("ml", "done", "dp", 4, phase="Succeeded"),  # finished: holds nothing
            pod("ml", "cpu-only", "cpu", 0),
            pod("web", "infer", "lost", 1),
        ],
        "slices": [slice_("dra", 4, tainted=(3,))],
        "claims": [
            claim("ml", "shared", "dra", "gpu-0", ["a", "b"]),
            claim("ml", "other-driver", "dra", "gpu-1", ["c"])
            | {
                "status": {
                    "allocation": {
                        "devices": {"results": [{"driver": "x", "pool": "dra", "device": "gpu-1"}]}
                    }
                }
            },
        ],
        "chips": {
            "dp": chips_from_metrics(
                metrics(
                    "dp", 8, {0: [("ml", "train", "")], 1: [("ml", "train", "")]}, {5: "over temperature"}
                ),
                "dp",
            ),
            "dra": chips_from_metrics(
                metrics("dra", 4, {0: [("ml", "a", "ml/shared"), ("ml", "b", "ml/shared")]}, {}), "dra"
            ),
            "lost": LOST,
        },
    }
    found.update(overrides)
    return cluster_status(resource=RESOURCE, driver=DRIVER, **found).as_json()


def test_each_kind_of_node_with_what_is_in_use_and_free() -> None:
    view = status_of()
    by_name = {n["name"]: n for n in view["nodes"]}
    assert list(by_name) == ["dp", "dra", "lost"]  # no GPU, no row
    assert (
        by_name["dp"]["allocator"],
        by_name["dp"]["total"],
        by_name["dp"]["in_use"],
        by_name["dp"]["free"],
    ) == (
        "device-plugin",
        8,
        2,
        6,
    )
    dra = by_name["dra"]
    assert (dra["allocator"], dra["total"], dra["in_use"], dra["free"]) == (
        "dra",
        4,
        1,
        2,
    )  # gpu-3 is tainted
    assert dra["devices"][0] == {
        "name": "gpu-0",
        "uuid": "GPU-dra-0",
        "healthy": True,
        "claims": ["ml/shared"],
        "pods": ["ml/a", "ml/b"],
        "default_form": True,
    }
    assert dra["devices"][1]["claims"] == []  # another driver's allocation is not ours
    assert [d["healthy"] for d in dra["devices"]] == [True, True, True, False]
    assert view["totals"] == {"total": 16, "inUse": 4, "free": 11}


def test_partitionable_boards_count_in_the_default_form_and_a_claimed_board_takes_its_chips() -> None:
    """The slice as ``ix-gpu dra`` writes it for two BI-V150 boards: each board and its chips."""
    chips = [Chip(f"GPU-{i}", i, i, f"b{i // 2}", i % 2, "Iluvatar BI-V150", 32768, 0) for i in range(4)]
    for splitboard, held, counts in ((True, "board-0", (4, 2, 2)), (False, "gpu-3", (2, 1, 1))):
        devices = slice_devices(
            dra_devices(chips, splitboard=splitboard, partitionable=True), ILUVATAR, DRIVER
        )
        slices = [
            {"spec": {"driver": DRIVER, "nodeName": "dra", "pool": {"name": "dra"}, "devices": devices}}
        ]
        view = status_of(slices=slices, claims=[claim("ml", "held", "dra", held, ["ml/p"])])
        dra = next(n for n in view["nodes"] if n["name"] == "dra")
        assert (dra["total"], dra["in_use"], dra["free"]) == counts, splitboard
        assert len(dra["devices"]) == 6  # every form is listed
        assert [d["name"] for d in dra["devices"] if d["claims"]] == [held]


def test_chips_health_and_holders_come_from_the_plugins_metrics() -> None:
    chips = {n["name"]: n["chips"] for n in status_of()["nodes"]}
    dp = chips["dp"]
    assert [c["index"] for c in dp] == list(range(8))
    assert dp[0]["holders"] == ["ml/train"] and dp[1]["holders"] == ["ml/train"] and dp[2]["holders"] == []
    assert dp[5]["health"] == "Unhealthy" and dp[5]["problems"] == ["over temperature"]
    assert {c["health"] for i, c in enumerate(dp) if i != 5} == {"Healthy"}
    assert chips["dra"][0]["holders"] == ["ml/a (claim ml/shared)", "ml/b (claim ml/shared)"]
    assert (chips["dp"][0]["board"], chips["dp"][0]["product"]) == ("board0", "Iluvatar BI-V100")


def test_a_plugin_that_could_not_be_read_leaves_counts_and_says_so() -> None:
    (lost,) = [n for n in status_of()["nodes"] if n["name"] == "lost"]
    assert (lost["total"], lost["in_use"], lost["free"], lost["chips"]) == (4, 1, 3, [])
    assert lost["note"] == LOST  # the reader's reason, as it gave it
    (quiet,) = [n for n in status_of(chips={})["nodes"] if n["name"] == "dp"]
    assert quiet["chips"] == [] and quiet["note"] == ""  # --no-chips: nothing asked, nothing claimed
    # Asked, and no plugin pod found on a GPU node: the reader's note for that; none on a CPU node.
    view = status_of(chips={}, no_plugin="chips unknown: no device-plugin pod on this node")
    assert {n["name"]: n["note"] for n in view["nodes"]} == {
        "dp": "chips unknown: no device-plugin pod on this node",
        "dra": "chips unknown: no device-plugin pod on this node",
        "lost": "chips unknown: no device-plugin pod on this node",
    }


def test_text_lists_nodes_then_each_nodes_chips_and_devices() -> None:
    from ix_gpu.status.view import cluster_status as build

    text = render_text(
        build(
            resource=RESOURCE,
            driver=DRIVER,
            nodes=[node("dp", gpus=8), node("dra", dra=True)],
            pods=[pod("ml", "train", "dp", 2)],
            slices=[slice_("dra", 2)],
            claims=[claim("ml", "shared", "dra", "gpu-0", ["a"])],
            chips={
                "dp": chips_from_metrics(metrics("dp", 2, {0: [("ml", "train", "")]}, {1: "ECC error"}), "dp")
            },
        )
    )
    lines = text.splitlines()
    assert lines[0].split() == ["NODE", "ALLOCATOR", "PRODUCT", "GPUS", "IN", "USE", "FREE"]
    assert lines[1].split() == ["dp", "device-plugin", "BI-V100", "8", "2", "6"]
    assert lines[2].split() == ["dra", "dra", "BI-V100", "2", "1", "1"]
    assert lines[3] == "2 GPU nodes: 10 GPUs, 3 in use, 7 free"
    assert "ml/train" in text and "Unhealthy (ECC error)" in text
    assert any(line.split()[:1] == ["gpu-0"] and "ml/shared" in line and "ml/a" in line for line in lines)
    json.dumps(status_of())  # the JSON form is JSON


def test_pods_cut_down_as_listed_give_the_same_view() -> None:
    """``read.slim_pod`` keeps only what the view reads, so a cluster's pods cost the CLI little."""
    from ix_gpu.status.read import slim_pod

    whole = pod("ml", "train", "dp", 2)
    whole["spec"]["containers"][0]["env"] = [{"name": "BIG", "value": "x" * 10_000}]
    whole["metadata"]["managedFields"] = [{"manager": "kubectl"}] * 50
    slim = slim_pod(whole)
    assert len(json.dumps(slim)) < 400
    assert status_of(pods=[slim]) == status_of(pods=[whole])


def test_many_dra_nodes_each_look_at_their_own_slices_and_claims() -> None:
    """Each DRA node reads its own slices and the claims of its pools, not the cluster's: 3,000 DRA
    nodes with a claim each took the view 10 s when every node walked every slice and claim."""
    import time

    count = 3000
    started = time.monotonic()
    view = status_of(
        nodes=[node(f"n{i}", dra=True) for i in range(count)],
        pods=[],
        slices=[slice_(f"n{i}", 4) for i in range(count)],
        claims=[claim("ml", f"c{i}", f"n{i}", f"gpu-{i % 4}", [f"p{i}"]) for i in range(count)],
        chips={},
    )
    assert time.monotonic() - started < 3
    assert view["totals"] == {"total": 4 * count, "inUse": count, "free": 3 * count}
    (seventh,) = [n for n in view["nodes"] if n["name"] == "n7"]
    assert [d["pods"] for d in seventh["devices"]] == [[], [], [], ["ml/p7"]]
