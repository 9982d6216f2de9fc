"""``flags.usevolcano`` on real nodes: pods annotated as Iluvatar's ix-volcano-plugin
annotates them get the chips named there, not the kubelet's (Volcano itself does not run: the
default scheduler places the pods, the annotations say what Volcano would have chosen).

``gpu-a`` (two BI-V150 boards of two chips) is labelled ``ix-gpu.io/device-plugin.config=volcano``
before the install, and the release's ``plugin.nodeConfigs.volcano`` turns ``splitboard`` and
``usevolcano`` on there: four devices, one per chip; ``gpu-b`` keeps the default config. Each pod
reads back inside its container which device nodes it was given and its ``IX_VISIBLE_DEVICES``.

The kubelet's own choice is known in advance: its GetPreferredAllocation goes to the plugin, which
chooses best-fit (the board with the fewest free chips that still fits). So after a first pod takes
one chip, the kubelet's next choice is that chip's sibling, and every Volcano choice below differs
from the kubelet's where it matters. The pods run one after the other, each waited for.

``gpu-b`` is labelled for the ``reset`` config: ``flags.reset_gpu`` (Iluvatar's 4.4 key). Its
driver root gets a stand-in ``bin/ixsmi`` (the real one resets chips; this one takes a moment, and
fails saying what a file beside it says while that file exists): every GPU pod there runs after a
reset of its chips, and a pod whose reset fails is refused with the tool's words.

The release also has ``dra.enabled``, with no node labelled for DRA until the last test: it moves
``gpu-b`` to DRA, then upgrades the release to the project's second image and rolls it back while
GPU work is created (tests/k8s/rollout_load.py). This module hosts it because it is short and its
nodes need nothing back afterwards; another real-node module would cost its own cluster.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.k8s.chart_values import real_node_chart_values
from tests.k8s.pods import get_pod, new_namespace, request_ok, wait_failed, wait_running
from tests.k8s.real_nodes import TIER_ROOT, Images, stub_uuids
from tests.k8s.real_release import Release, image_pod, open_release
from tests.k8s.rollout_load import Load, claim_released, import_next_image, upgrade_then_rollback
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(900)

RELEASE = "ixv"
CONFIG_LABEL = "ix-gpu.io/device-plugin.config"
DEV_VOLCANO = "iluvatar.com/DevVolcano"
DEV_KUBELET = "iluvatar.com/DevKubelet"
DEV_REAL_ALLOC = "iluvatar.com/DevRealAlloc"
PREDICATE_TIME = "predicate-time"
CONSUMED = "18446744073709551615"

# What the container got: its device nodes and its visible-devices variable; then it holds them.
CHECK = r"""
import glob, os, time
print("given:", " ".join(sorted(glob.glob("/dev/iluvatar*"))))
print("IX_VISIBLE_DEVICES=" + os.environ.get("IX_VISIBLE_DEVICES", ""))
print("done", flush=True)
time.sleep(3600)
"""


STUB_IXSMI = """#!/bin/sh
# The tier's stand-in for the driver's ixsmi -r: a reset takes a moment; it fails while a file
# ixsmi-fail lies in the driver root, with that file's words.
root=$(dirname "$0")/..
if [ -e "$root/ixsmi-fail" ]; then cat "$root/ixsmi-fail"; exit 1; fi
sleep 0.3
"""


def volcano_values(images: Images) -> dict[str, Any]:
    values = real_node_chart_values(images)
    # The DRA plugin too, for the upgrade at the end (no node is labelled for it until then).
    values["dra"] = {"enabled": True}
    values["plugin"]["nodeConfigs"] = {
        "volcano": {"flags": {"splitboard": True, "usevolcano": True}},
        "reset": {"flags": {"reset_gpu": True}, "gpuReset": {"timeoutSeconds": 20}},
    }
    return values


def install_volcano(release: Release) -> None:
    """Label gpu-a for the ``volcano`` config and gpu-b for ``reset`` (its driver root given the
    stand-in ixsmi), install the chart, wait for gpu-a's four chips."""
    tool = TIER_ROOT / "gpu-b" / "corex" / "bin" / "ixsmi"
    tool.parent.mkdir(exist_ok=True)
    tool.write_text(STUB_IXSMI)
    tool.chmod(0o755)
    release.label_and_install(
        RELEASE, {"gpu-a": {CONFIG_LABEL: "volcano"}, "gpu-b": {CONFIG_LABEL: "reset"}}, "300s"
    )
    wait_until(
        lambda: (release.cluster.node_resource("gpu-a") or (0, 0)) == (4, 4),
        "gpu-a's four chips offered one by one",
        120,
        interval=0.5,
    )


@pytest.fixture(scope="module")
def release(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, k8s_log_dir: Path
) -> Iterator[Release]:
    for installed in open_release(
        request, tmp_path_factory, k8s_log_dir / "real-nodes-volcano", volcano_values
    ):
        install_volcano(installed)
        yield installed
        (TIER_ROOT / "gpu-b" / "corex" / "bin" / "ixsmi").unlink(missing_ok=True)


def volcano_pod(name: str, image: str, chosen: str | None) -> dict[str, Any]:
    """A root pod on gpu-a running CHECK with one GPU, annotated as ix-volcano-plugin annotates a
    pod it placed (``chosen``: the device it chose; None: a pod outside Volcano)."""
    pod = image_pod(
        name, image, ["python3", "-c", CHECK], gpus=1, nodeSelector={"kubernetes.io/hostname": "gpu-a"}
    )
    if chosen is not None:
        pod["metadata"]["annotations"] = {DEV_VOLCANO: chosen, PREDICATE_TIME: str(time.time_ns())}
    return pod


def seen(release: Release, namespace: str, name: str) -> tuple[list[str], str]:
    """The device nodes and IX_VISIBLE_DEVICES pod ``name`` printed."""
    wait_until(
        lambda: "done" in release.log(namespace, name).splitlines(),
        f"{name}'s check",
        90,
        details=lambda: release.log(namespace, name),
    )
    lines = release.log(namespace, name).splitlines()
    given = lines[0].removeprefix("given:").split()
    visible = lines[1].removeprefix("IX_VISIBLE_DEVICES=")
    print(f"{name}: given {given}, IX_VISIBLE_DEVICES={visible}")
    return given, visible


def run_pod(release: Release, namespace: str, name: str, chosen: str | None) -> dict[str, Any]:
    pod = volcano_pod(name, release.image, chosen)
    request_ok(release.api, "POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    return wait_running(release.api, namespace, name, timeout=120)


def plugin_counts(release: Release, node: str, family: str) -> dict[str, float]:
    """``<family>`` by result, from ``node``'s plugin's /metrics."""
    (pod,) = [p for p in release.pods("device-plugin") if p["spec"]["nodeName"] == node]
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:9401/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        sample.labels["result"]: sample.value
        for metrics in text_string_to_metric_families(text)
        for sample in metrics.samples
        if sample.name == family
    }


def volcano_counts(release: Release) -> dict[str, float]:
    """``ix_gpu_plugin_volcano_allocations_total`` by result, from gpu-a's plugin's /metrics."""
    return plugin_counts(release, "gpu-a", "ix_gpu_plugin_volcano_allocations_total")


def test_volcanos_chips_are_bound_a_stray_choice_falls_back_and_no_chip_is_bound_twice(
    release: Release,
) -> None:
    """On gpu-a (chips c0..c3 by minor, /dev/iluvatar0..3; boards {c0, c1} and {c2, c3}):

    1. ``stray`` names a chip of gpu-b: it falls back to the kubelet's choice, say ``f``.
    2. ``one`` names a chip ``a`` of the other board; the kubelet chooses ``f``'s sibling ``s``
       (best fit): ``one`` gets ``a``.
    3. ``two`` names ``b``, the other board's other chip; the kubelet chooses ``a`` or ``b``:
       ``two`` gets ``b``.
    4. ``plain`` (no annotation): the kubelet, which believes ``a`` or ``b`` free, chooses it: it is
       held, so the allocation is refused, naming the holder, and the pod fails.
    5. ``three`` names ``s``, which the kubelet believes taken: it gets ``s``.

    Four running pods, four different chips, each what its annotation (or the fallback) says."""
    api = release.api
    namespace = f"volcano-{secrets.token_hex(3)}"
    ns = new_namespace(api, namespace)
    chips = stub_uuids("gpu-a")
    other_node = stub_uuids("gpu-b")[0]
    assert len(chips) == 4, chips
    node_of = {uuid: f"/dev/iluvatar{i}" for i, uuid in enumerate(chips)}

    stray = run_pod(release, namespace, "stray", other_node)
    notes = stray["metadata"]["annotations"]
    f = notes[DEV_KUBELET]
    assert notes[DEV_REAL_ALLOC] == f and notes[PREDICATE_TIME] == CONSUMED, notes
    assert seen(release, namespace, "stray") == ([node_of[f]], f)

    index = chips.index(f)
    s = chips[index ^ 1]  # its sibling on the board
    a, b = [c for c in chips if c not in (f, s)]
    one = run_pod(release, namespace, "one", a)
    assert one["metadata"]["annotations"][DEV_KUBELET] == s, one["metadata"]["annotations"]  # best fit
    assert one["metadata"]["annotations"][DEV_REAL_ALLOC] == a
    assert seen(release, namespace, "one") == ([node_of[a]], a)

    two = run_pod(release, namespace, "two", b)
    assert two["metadata"]["annotations"][DEV_REAL_ALLOC] == b
    assert seen(release, namespace, "two") == ([node_of[b]], b)

    request_ok(api, "POST", f"{ns}/pods", volcano_pod("plain", release.image, None))
    failed = wait_failed(api, namespace, "plain")
    message = failed["status"].get("message", "")
    print(f"plain: {failed['status'].get('reason')}: {message}")
    assert "which pod" in message and (f"{namespace}/one" in message or f"{namespace}/two" in message), (
        message
    )

    three = run_pod(release, namespace, "three", s)
    assert three["metadata"]["annotations"][DEV_KUBELET] in (a, b), three["metadata"]["annotations"]
    assert seen(release, namespace, "three") == ([node_of[s]], s)

    running = {name: seen(release, namespace, name)[1] for name in ("stray", "one", "two", "three")}
    assert sorted(running.values()) == sorted(chips), running  # every chip once
    counts = volcano_counts(release)
    print(f"ix_gpu_plugin_volcano_allocations_total: {counts}")
    assert (counts["volcano"], counts["fallback"], counts["refused"]) == (3, 1, 1), counts
    assert get_pod(api, namespace, "plain") is not None
    request_ok(api, "DELETE", ns)


def test_with_reset_gpu_a_pod_runs_after_its_chips_reset_and_one_whose_reset_fails_is_refused(
    release: Release,
) -> None:
    """gpu-b's plugin resets a board (one device, all its chips) before each GPU pod there gets it; while
    the stand-in ixsmi fails, the kubelet refuses the pod with the tool's words (the allocation is
    never answered with chips that were not reset); counted in ix_gpu_plugin_gpu_resets_total."""
    api = release.api
    namespace = f"reset-{secrets.token_hex(3)}"
    ns = new_namespace(api, namespace)
    on_b = {"kubernetes.io/hostname": "gpu-b"}
    before = plugin_counts(release, "gpu-b", "ix_gpu_plugin_gpu_resets_total")
    pod = image_pod("cleared", release.image, ["python3", "-c", CHECK], gpus=1, nodeSelector=on_b)
    request_ok(api, "POST", f"{ns}/pods", pod)
    wait_running(api, namespace, "cleared", timeout=120)
    given, visible = seen(release, namespace, "cleared")
    assert len(given) == len(visible.split(",")) >= 1  # a board (gpu-b's BI-V100: one chip each)
    after = plugin_counts(release, "gpu-b", "ix_gpu_plugin_gpu_resets_total")
    assert after["ok"] == before["ok"] + 1, (before, after)
    fail = TIER_ROOT / "gpu-b" / "corex" / "ixsmi-fail"
    fail.write_text("Unable to reset GPU: it is in use by another process\n")
    try:
        pod = image_pod("refused", release.image, ["python3", "-c", CHECK], gpus=1, nodeSelector=on_b)
        request_ok(api, "POST", f"{ns}/pods", pod)
        failed = wait_failed(api, namespace, "refused")
    finally:
        fail.unlink()
    message = failed["status"].get("message", "")
    print(f"refused: {failed['status'].get('reason')}: {message}")
    assert "GPU reset of" in message and "in use by another process" in message, message
    assert "not handed out" in message, message
    counts = plugin_counts(release, "gpu-b", "ix_gpu_plugin_gpu_resets_total")
    assert counts["failed"] == before["failed"] + 1, counts
    request_ok(api, "DELETE", ns)


# --------------------------------------------------------------------------- upgrade under load


def test_an_upgrade_to_another_image_and_its_rollback_under_load_refuse_no_pod_and_keep_every_gpu(
    release: Release,
) -> None:
    """gpu-b moves to DRA; then ``helm upgrade`` to the project's second image (the same Dockerfile,
    another version) with one more variable in the Iluvatar profile, and ``helm rollback``, each
    rolling the webhook, the device plugin and the DRA plugin, while a one-GPU pod (gpu-a, exits at
    once), a claim pod (gpu-b) and an opted-out GPU pod (dry run) are created one after another
    (tests/k8s/rollout_load.py). Through both rollouts:

    - every create is stored within the client's retries, every GPU pod mutated, no opted-out one;
      the last one of the upgrade met its config, the last one of the rollback the one before;
    - the kubelet refuses no pod (``UnexpectedAdmissionError``), and pods were admitted while the
      device plugin rolled;
    - gpu-a's allocatable never drops below what it offered before, nor gpu-b's devices in its
      ResourceSlice (the capacity the scheduler fits against);
    - a claim pod waiting on gpu-b while its DRA plugin rolls starts within 5 s of the slowest one
      before the upgrade: its claim is prepared by whichever instance serves, not after the roll
      (a prepare refused as the old instance goes is retried by the kubelet about 15 s later);
    - a device-plugin pod and a claim pod started before the upgrade run on in the same container,
      with the same device cgroup, device nodes, environment, mounts and CDI spec, their claim still
      allocated to them; deleted at the end, the claim is unprepared by the plugin that runs now."""
    api = release.api
    wait_until(
        lambda: (
            not [
                p
                for p in request_ok(api, "GET", "/api/v1/pods")["items"]
                if p["metadata"]["namespace"] not in ("ix-gpu-system", "kube-system")
            ]
        ),
        "the earlier tests' pods gone",
        120,
    )
    # The second image goes onto the nodes while gpu-b changes allocator.
    importing = ThreadPoolExecutor(1).submit(import_next_image, release)
    status, reply = api.request(
        "PATCH",
        "/api/v1/nodes/gpu-b",
        {"metadata": {"labels": {"ix-gpu.io/gpu.allocation": "dra"}}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, reply
    load = Load(api, release.image, device_plugin_node="gpu-a", dra_node="gpu-b", tfjobs=None)
    wait_until(
        lambda: (lambda s: s.allocatable["gpu-b"] == 0 and s.devices.get("gpu-b", 0) > 0)(load.sample()),
        "gpu-b's GPUs published by the DRA plugin and none offered by the device plugin",
        120,
        interval=0.5,
    )
    full = load.sample()
    repository, tag = importing.result(timeout=120)

    def upgrade(values: dict[str, Any]) -> None:
        values["image"] = {"repository": repository, "tag": tag}
        values["config"]["profiles"][0].setdefault("env", []).append(
            {"name": "IX_GPU_RELEASE", "value": "upgraded"}
        )

    started = time.monotonic()
    result = upgrade_then_rollback(release, RELEASE, load, upgrade)
    print(f"\nupgrade and rollback under load in {time.monotonic() - started:.1f}s")
    for rollout in [result.before, *result.rollouts]:
        print(json.dumps(rollout.figures()))
    baseline = max((c.on_node_s or 0) for c in result.before.creates if c.kind == "claim")
    for rollout in result.rollouts:
        figures = rollout.figures()
        failed = [c.refusals for c in rollout.creates if c.stored is None]
        assert figures["failedAfterRetry"] == 0, failed
        assert figures["storedUnmutated"] == 0 and figures["optedOutMutated"] == 0, figures
        assert set(figures["podEnds"]) == {"Succeeded"}, figures["podEnds"]
        assert figures["minCapacity"] == {
            "gpu-a": full.allocatable["gpu-a"],
            "gpu-b": full.devices["gpu-b"],
        }, (
            figures["minCapacity"],
            full,
        )
        # Pods were admitted on gpu-a while its device plugin rolled.
        assert rollout.on_node_during("device-plugin", kind="device-plugin"), (rollout.label, figures)
        # Claim pods were waiting on gpu-b while its DRA plugin rolled, and were served as fast as before.
        during = rollout.on_node_during("dra-plugin")
        assert during, (rollout.label, figures)
        # A claim the kubelet retries (its prepare refused as the old instance goes) waits about 15 s.
        assert max(c.on_node_s or 0 for c in during) <= baseline + 5, (baseline, figures)
    # The upgrade's config was served, and the rollback's.
    upgraded, rolled_back = result.rollouts
    assert upgraded.last_stored_marked() is True and rolled_back.last_stored_marked() is False
    assert result.changed() == {}, result.changed()
    assert all(h["restarts"] == 0 for h in result.held_after.values()), result.held_after
    (claim_holder,) = [h for h in result.holders if h.claim]
    print(f"the claim held through both rollouts unprepared in {claim_released(api, claim_holder):.1f}s")
    load.close()
