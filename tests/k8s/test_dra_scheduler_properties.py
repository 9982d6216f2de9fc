"""No over-allocation on the real scheduler: random claims for boards, chips and memory shares,
with CEL selectors, against the pools ``ix-gpu dra`` publishes, read back from ``ResourceClaim.status``.

The Kubernetes v1.37 apiserver and kube-scheduler are real; the Nodes are API objects only (no
kubelet: pods are bound, never run, and nothing is prepared). Their ResourceSlices are written by
the driver's own code (:mod:`ix_gpu.dra.devices`, :class:`ix_gpu.dra.slices.SlicePublisher`), and
the DeviceClasses are the chart's, rendered from ``charts/ix-gpu``:

- four nodes of two BI-V150 boards, partitionable (each board and its two chips, one counter set
  per board; splitboard true on two, false on the others, so both default forms are in play);
- two nodes of two BI-V150 boards with ``sharing.timeSlicing.replicas: 4`` (each chip shared in
  four 8 GiB shares);
- two nodes of two BI-V150 boards, partitionable and shared (``--partitionable with-shares``):
  each board (four 16 GiB shares) and each chip (four 8 GiB shares), all consuming the board's
  counters;
- two nodes of two BI-V100 boards, plain.

Each of 120 pods has its own ResourceClaim of a random kind (a whole board, a chip, the default
form, a memory share of random size) with a random product selector and one or two devices. More
is asked than there is, so some pods stay unschedulable. Every allocation is then checked: no
exclusive device twice, no board together with one of its chips (shared or not), no shared
device's memory over its capacity, every share whole, and every device what its claim's selectors
asked for. The seed is printed; ``IX_GPU_PROPERTY_SEED`` replays one.

A second test walks partitions and shares together step by step on two one-board nodes of their
own, each claim's outcome decided before the next is made.
"""

from __future__ import annotations

import collections
import os
import random
import secrets
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from ix_gpu.devicemodel.quantities import parse_quantity
from tests.k8s.dra_pools import (
    DRIVER,
    RESOURCE_API,
    chips,
    claim_pod,
    create_device_classes,
    create_node,
    delete_pool,
    publish_pool,
)
from tests.k8s.k8s_tier import K8sBinaries, KubeAPI, start_kube_scheduler
from tests.k8s.pods import request_ok
from tests.support.processes import Process
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

PODS = 120
GI = Fraction(1 << 30)


@pytest.fixture(scope="module")
def kube_api(current_kube_api: KubeAPI) -> KubeAPI:
    return current_kube_api


KINDS_OF_NODE: dict[str, dict[str, Any]] = {
    "part-chips": {"chips": ("Iluvatar BI-V150", 2), "splitboard": True, "partitionable": True},
    "part-boards": {"chips": ("Iluvatar BI-V150", 2), "splitboard": False, "partitionable": True},
    "shared": {"chips": ("Iluvatar BI-V150", 2), "splitboard": True, "shares": 4},
    "part-shared": {"chips": ("Iluvatar BI-V150", 2), "splitboard": True, "partitionable": True, "shares": 4},
    "plain": {"chips": ("Iluvatar BI-V100", 1), "splitboard": True},
}
NODES = {f"prop-{kind}-{i}": spec for kind, spec in KINDS_OF_NODE.items() for i in range(2)}
STEP_NODES = ("step-0", "step-1")
"""One BI-V150 board each (board-0, gpu-0, gpu-1), partitionable and shared in four; each labelled
``type=<its name>`` so that only the step test's pods land there."""


@pytest.fixture(scope="module")
def cluster(
    kube_api: KubeAPI, k8s_binaries: K8sBinaries, k8s_log_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, dict[str, Any]]]:
    """The nodes, their pools, the chart's DeviceClasses and a scheduler; the published devices
    by node, by name."""
    classes = create_device_classes(kube_api)
    published: dict[str, dict[str, Any]] = {}
    for name, spec in NODES.items():
        create_node(kube_api, name, {"type": "prop"})
        product, per_board = spec["chips"]
        published[name] = publish_pool(
            kube_api,
            name,
            chips(name, product, per_board),
            splitboard=spec["splitboard"],
            partitionable=spec.get("partitionable", False),
            shares=spec.get("shares", 1),
        )
    for name in STEP_NODES:
        create_node(kube_api, name, {"type": name})
        published[name] = publish_pool(
            kube_api,
            name,
            chips(name, "Iluvatar BI-V150", 2, boards=1),
            splitboard=True,
            partitionable=True,
            shares=4,
        )
    scheduler: Process = start_kube_scheduler(
        k8s_binaries, kube_api.kubeconfig, tmp_path_factory.mktemp("scheduler"), k8s_log_dir
    )
    try:
        yield published
    finally:
        scheduler.stop()
        for name in (*NODES, *STEP_NODES):
            delete_pool(kube_api, name)
        for device_class in classes:
            kube_api.request("DELETE", f"{RESOURCE_API}/deviceclasses/{device_class}")


def _attribute(name: str) -> str:
    return f'device.attributes["{DRIVER}"].{name}'


KINDS = ("board", "chip", "default", "share")


def random_request(rng: random.Random) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(kind, the request's ``exactly``, what the allocated device must be)."""
    kind = rng.choice(KINDS)
    selectors: list[str] = []
    want: dict[str, Any] = {}
    exactly: dict[str, Any] = {"deviceClassName": f"any.{DRIVER}" if kind in ("board", "chip") else DRIVER}
    if kind == "board":
        selectors.append(f"{_attribute('wholeBoard')} && {_attribute('chips')} == 2")
        want.update(wholeBoard=True, chips=2)
    elif kind == "chip":
        selectors.append(f"{_attribute('chips')} == 1")
        want.update(chips=1)
    elif kind == "share":
        memory = rng.choice((4, 8, 12, 16, 24))
        exactly["capacity"] = {"requests": {"memory": f"{memory}Gi"}}
        want.update(memory=memory)
    else:
        want.update(defaultForm=True)
    product = rng.choice((None, "BI-V150", "BI-V100"))
    if product is not None:
        selectors.append(f'{_attribute("product")} == "{product}"')
        want.update(product=product)
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": " && ".join(selectors)}}]
    if rng.random() < 0.2:
        exactly["count"] = 2
    return kind, exactly, want


def _value(attribute: dict[str, Any]) -> Any:
    return next(iter(attribute.values()))


def covered(pool: dict[str, Any], device: dict[str, Any]) -> set[str]:
    """The UUIDs of the physical chips ``device`` gives: its own, or its board's chips (the pool's
    one-chip devices on the same board), whatever counters say."""
    attributes = {k: _value(v) for k, v in device["attributes"].items()}
    if attributes["chips"] == 1:
        return {attributes["uuid"]}
    found = {
        _value(d["attributes"]["uuid"])
        for d in pool.values()
        if _value(d["attributes"]["chips"]) == 1 and _value(d["attributes"]["board"]) == attributes["board"]
    }
    assert len(found) == attributes["chips"], (device["name"], found)
    return found


def test_random_claims_are_never_double_booked(kube_api: KubeAPI, cluster: dict[str, dict[str, Any]]) -> None:
    seed = int(os.environ.get("IX_GPU_PROPERTY_SEED") or secrets.randbits(32))
    print(f"\nseed {seed} (IX_GPU_PROPERTY_SEED={seed} replays it)")
    rng = random.Random(seed)
    namespace = f"prop-{secrets.token_hex(3)}"
    request_ok(kube_api, "POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    ns = f"/api/v1/namespaces/{namespace}"
    claims_path = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims"
    wants: dict[str, tuple[str, dict[str, Any]]] = {}
    for i in range(PODS):
        kind, exactly, want = random_request(rng)
        name = f"c{i:03d}"
        wants[name] = (kind, want)
        claim = {
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        }
        request_ok(kube_api, "POST", claims_path, claim)
        request_ok(kube_api, "POST", f"{ns}/pods", claim_pod(name, {"type": "prop"}))

    def decided() -> dict[str, Any] | None:
        pods = request_ok(kube_api, "GET", f"{ns}/pods")["items"]
        done = [
            p
            for p in pods
            if p["spec"].get("nodeName")
            or any(
                c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in p.get("status", {}).get("conditions", [])
            )
        ]
        return {p["metadata"]["name"]: p for p in done} if len(done) == PODS else None

    wait_until(decided, f"the scheduler's decision on all {PODS} pods", 180, interval=1)
    # An unschedulable pod is retried when the cluster changes: wait for the bindings to settle.
    seen: list[int] = []

    def settled() -> dict[str, Any] | None:
        found = decided()
        seen.append(sum(1 for p in (found or {}).values() if p["spec"].get("nodeName")))
        return found if len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3] else None

    pods = wait_until(settled, "the bindings to settle", 120, interval=2)
    messages = collections.Counter(
        c.get("message", "")
        for p in pods.values()
        for c in p.get("status", {}).get("conditions", [])
        if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
    )
    print(f"unschedulable: {dict(messages)}")
    claims = {c["metadata"]["name"]: c for c in request_ok(kube_api, "GET", claims_path)["items"]}

    exclusive: dict[tuple[str, str], str] = {}
    consumed: dict[tuple[str, str], Fraction] = collections.defaultdict(Fraction)
    holders: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    by_chip: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    """(pool, chip uuid) -> claim:device of each allocation that covers that chip."""
    allocated_kinds: collections.Counter[str] = collections.Counter()
    for name, claim in claims.items():
        allocation = claim.get("status", {}).get("allocation")
        bound = pods[name]["spec"].get("nodeName")
        if allocation is None:
            assert not bound, f"pod {name} bound to {bound} without its claim allocated"
            continue
        kind, want = wants[name]
        allocated_kinds[kind] += 1
        results = allocation["devices"]["results"]
        count = claims[name]["spec"]["devices"]["requests"][0]["exactly"].get("count", 1)
        assert len(results) == count, (name, results)
        for result in results:
            assert result["driver"] == DRIVER and result["pool"] == bound, (name, result, bound)
            key = (result["pool"], result["device"])
            device = cluster[result["pool"]][result["device"]]
            attributes = {k: _value(v) for k, v in device["attributes"].items()}
            for attribute, value in want.items():
                if attribute != "memory":
                    assert attributes[attribute] == value, (name, kind, attribute, device["name"])
            holders[key].append(name)
            if device.get("allowMultipleAllocations"):
                policy = device["capacity"]["memory"]["requestPolicy"]
                share = parse_quantity(policy["default"])
                taken = parse_quantity(result["consumedCapacity"]["memory"])
                assert taken % share == 0 and taken >= share, (name, result)
                if kind == "share":
                    assert taken >= want["memory"] * GI, (name, result)
                consumed[key] += taken
            else:
                assert key not in exclusive, f"{key} given to {exclusive.get(key)} and {name}"
                exclusive[key] = name
                if kind == "share":
                    assert parse_quantity(device["capacity"]["memory"]["value"]) >= want["memory"] * GI
            for chip in covered(cluster[result["pool"]], device):
                by_chip[(result["pool"], chip)].append(f"{name}:{device['name']}")

    # No chip with its board, no chip twice: every physical chip goes to one claim, or only to
    # claims sharing its device.
    doubled = {key: who for key, who in by_chip.items() if len({w.partition(":")[2] for w in who}) > 1}
    assert not doubled, doubled
    doubled = {
        key: who
        for key, who in by_chip.items()
        if len(who) > 1 and not cluster[key[0]][who[0].partition(":")[2]].get("allowMultipleAllocations")
    }
    assert not doubled, doubled
    for key, taken in consumed.items():
        capacity = parse_quantity(cluster[key[0]][key[1]]["capacity"]["memory"]["value"])
        assert taken <= capacity, (key, taken, capacity, holders[key])
    shared = max((len(holders[key]) for key in consumed), default=0)
    pending = sum(1 for name in claims if "allocation" not in claims[name].get("status", {}))
    print(
        f"allocated by kind: {dict(allocated_kinds)}; pending {pending}/{PODS}; "
        f"most claims on one shared chip: {shared}"
    )
    # Not vacuous: each kind was allocated, a chip was shared, and more was asked than there is.
    assert all(allocated_kinds[kind] for kind in KINDS), allocated_kinds
    assert shared >= 2 and pending > 0, (shared, pending)
    request_ok(kube_api, "DELETE", ns)


def test_a_shared_board_and_its_shared_chips_never_go_together(
    kube_api: KubeAPI, cluster: dict[str, dict[str, Any]]
) -> None:
    """Partitions and shares together, one decision at a time. On step-0, board shares stack up to
    the board's memory while no chip can be had; on step-1, two shares of one chip stack up to
    the chip's memory and the other chip is free, while the board cannot be had. So the scheduler
    charges a shared device's counters once, with its first share, and keeps a board's shares and
    its chips' shares apart."""
    namespace = f"step-{secrets.token_hex(3)}"
    request_ok(kube_api, "POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    ns = f"/api/v1/namespaces/{namespace}"
    claims_path = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims"
    outcomes: dict[str, tuple[str, str]] = {}

    def ask(name: str, node: str, selector: str, memory: str | None = None) -> tuple[str, str]:
        """One claim and its pod on ``node``; (device, memory taken) once bound, ("", why) once
        the scheduler calls it unschedulable."""
        exactly: dict[str, Any] = {
            "deviceClassName": f"any.{DRIVER}",
            "selectors": [{"cel": {"expression": selector}}],
        }
        if memory is not None:
            exactly["capacity"] = {"requests": {"memory": memory}}
        claim = {
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        }
        request_ok(kube_api, "POST", claims_path, claim)
        request_ok(kube_api, "POST", f"{ns}/pods", claim_pod(name, {"type": node}))

        def decided() -> tuple[str, str] | None:
            pod = request_ok(kube_api, "GET", f"{ns}/pods/{name}")
            if pod["spec"].get("nodeName"):
                found = (
                    request_ok(kube_api, "GET", f"{claims_path}/{name}").get("status", {}).get("allocation")
                )
                if found is None:
                    return None
                [result] = found["devices"]["results"]
                assert result["pool"] == node, (name, result)
                taken = result.get("consumedCapacity", {}).get("memory")
                return result["device"], "" if taken is None else f"{parse_quantity(taken) / GI}Gi"
            for condition in pod.get("status", {}).get("conditions", []):
                if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
                    return "", condition.get("message", "")
            return None

        outcomes[name] = wait_until(decided, f"the scheduler's decision on {name}", 60, interval=0.3)
        return outcomes[name]

    board = f"{_attribute('wholeBoard')} && {_attribute('chips')} == 2"
    chip = f"{_attribute('chips')} == 1"
    # step-0: a board's shares first.
    assert ask("board-a", "step-0", board) == ("board-0", "16Gi")  # the default share
    assert ask("chip-a", "step-0", chip)[0] == ""  # the board's share holds both chips' counters
    assert ask("board-b", "step-0", board, "48Gi") == ("board-0", "48Gi")  # counters charged once
    assert ask("board-c", "step-0", board)[0] == ""  # 16 + 48 GiB: the board's memory is taken
    # step-1: a chip's shares first.
    first, taken = ask("chip-b", "step-1", chip, "8Gi")
    assert first in ("gpu-0", "gpu-1") and taken == "8Gi", (first, taken)
    uuid = _value(cluster["step-1"][first]["attributes"]["uuid"])
    same = f'{chip} && {_attribute("uuid")} == "{uuid}"'
    assert ask("chip-c", "step-1", same, "24Gi") == (first, "24Gi")  # 8 + 24 GiB of one chip
    assert ask("chip-d", "step-1", same)[0] == ""  # that chip's memory is taken
    assert ask("board-d", "step-1", board)[0] == ""  # a chip of the board holds shares
    other = ask("chip-e", "step-1", chip)
    assert other[0] in ("gpu-0", "gpu-1") and other[0] != first, other  # its sibling is free
    print(f"\nstep outcomes: {outcomes}")
    # Later attempts (the scheduler retries unschedulable pods on every change) change nothing.
    time.sleep(3)
    for name in ("chip-a", "board-c", "chip-d", "board-d"):
        pod = request_ok(kube_api, "GET", f"{ns}/pods/{name}")
        assert not pod["spec"].get("nodeName"), (name, pod["spec"].get("nodeName"))
    request_ok(kube_api, "DELETE", ns)
