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
from ix_gpu.runtime.text_metrics import Gauge, labels_text
from ix_gpu.status.view import chips_from_metrics, cluster_status, render_text

RESOURCE, DRIVER = "iluvatar.com/gpu", "gpu.iluvatar.com"
CHIP_LABELS = ("node", "uuid", "index", "board", "product")


def node(name: str, gpus: int = 0, dra: bool = False, product: str = "BI-V100") -> dict[str, Any]:
    labels = {"ix-gpu.io/gpu.product": product}
    if dra:
        labels["ix-gpu.io/gpu.allocation"] = "dra"
    allocatable = {"cpu": "8", **({RESOURCE: str(gpus)} if gpus else {})}
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}


def pod(namespace: str, name: str, node_name: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    container = {"name": "main", "resources": {"limits": {RESOURCE: str(gpus)}}}
    return {
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"nodeName": node_name, "containers": [container]},
        "status": {"phase": phase},
    }


def metrics(
    node_name: str, chips: int, held: dict[int, list[tuple[str, str, str]]], sick: dict[int, str]
) -> str:
    """A device plugin's /metrics for ``chips`` chips: holders (namespace, pod, claim) and problems."""
    lines = ["# TYPE ix_gpu_chip_telemetry_stale gauge"]
    for index in range(chips):
        values = (node_name, f"GPU-{node_name}-{index}", str(index), f"board{index // 2}", "Iluvatar BI-V100")
        lines.append(f"ix_gpu_chip_telemetry_stale{labels_text(CHIP_LABELS, values)} 0.0")
    lines.append("# TYPE ix_gpu_chip_health_problem gauge")
    for index in range(chips):
        values = (node_name, f"GPU-{node_name}-{index}", str(index), f"board{index // 2}", "Iluvatar BI-V100")
        for problem in ("over temperature", "ECC error"):
            bad = 1.0 if sick.get(index) == problem else 0.0
            series = labels_text((*CHIP_LABELS, "problem"), (*values, problem))
            lines.append(f"ix_gpu_chip_health_problem{series} {bad}")
    lines.append("# TYPE ix_gpu_chip_allocation gauge")
    names = (*CHIP_LABELS, "namespace", "pod", "container", "claim")
    for index, holders in held.items():
        values = (node_name, f"GPU-{node_name}-{index}", str(index), f"board{index // 2}", "Iluvatar BI-V100")
        for namespace, pod_name, claim in holders:
            series = labels_text(names, (*values, namespace, pod_name, "main", claim))
            lines.append(f"ix_gpu_chip_allocation{series} 1.0")
    # Another family's series are ignored, whatever their labels.
    other = Gauge("ix_gpu_plugin_registered", "registered")
    other.set(1)
    return "\n".join([*lines, *other.render()]) + "\n"


def slice_(node_name: str, devices: int, tainted: tuple[int, ...] = ()) -> dict[str, Any]:
    return {
        "spec": {
            "driver": DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name},
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {"uuid": {"string": f"GPU-{node_name}-{i}"}},
                    **(
                        {"taints": [{"key": "gpu.iluvatar.com/unhealthy", "effect": "NoSchedule"}]}
                        if i in tainted
                        else {}
                    ),
                }
                for i in range(devices)
            ],
        }
    }


def claim(namespace: str, name: str, node_name: str, device: str, pods: list[str]) -> dict[str, Any]:
    result = {"request": "gpu", "driver": DRIVER, "pool": node_name, "device": device}
    return {
        "metadata": {"namespace": namespace, "name": name},
        "status": {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"resource": "pods", "name": p, "uid": "x"} for p in pods],
        },
    }


def status_of(**overrides: Any) -> dict[str, Any]:
    found = {
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
            "lost": None,
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
    assert "could not be read" in lost["note"]
    (quiet,) = [n for n in status_of(chips={})["nodes"] if n["name"] == "dp"]
    assert quiet["chips"] == [] and quiet["note"] == ""  # --no-chips: nothing asked, nothing claimed


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
