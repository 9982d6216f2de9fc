"""The chart's release upgraded to a second image with a changed config, then rolled back, while GPU
work is created on the real nodes; what each rollout cost the users of the cluster.

    sudo .venv/bin/python bench/rollout.py [--interval 0.5] [--tfjob-every 8] [--in-flight 3] [--json]

It starts the real-node cluster (``tests/k8s/real_release.py``; root, the tier's binaries and
images: ``tests/k8s/build.sh``, ``build-images.sh``, ``build-helm.sh``), labels ``gpu-a`` for the
device plugin and ``gpu-b`` for DRA, installs the chart with ``dra.enabled`` and the training
operator, imports the project's second image (the same Dockerfile, another version label) on both
nodes, and runs ``tests/k8s/rollout_load.py``: a device-plugin pod, a claim pod and an opted-out
pod every ``--interval`` seconds each in turn (a kind with ``--in-flight`` pods not ended lets its
turn pass), a TFJob every ``--tfjob-every`` rounds, while
``helm upgrade --wait`` (the second image, the Iluvatar profile given one more variable) and then
``helm rollback --wait`` run. Per rollout it prints: how long it took, the longest time with no
create stored, the longest a claim pod took to start (its claim prepared), the least capacity the
scheduler saw on each node (allocatable on gpu-a, ResourceSlice devices on gpu-b), the creates
retried and failed, stored unmutated, opted-out ones mutated, how the pods ended; whether the
two pods that held GPUs through both rollouts kept their container and devices, and how long the
claim held through both took to be unprepared once its pod was deleted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.k8s import host_settings, training_operator  # noqa: E402
from tests.k8s.chart_values import real_node_chart_values  # noqa: E402
from tests.k8s.crds import install_crd, kubeflow_tfjob_crd  # noqa: E402
from tests.k8s.k8s_tier import build_helm  # noqa: E402
from tests.k8s.real_release import Release, start_real_node_cluster  # noqa: E402
from tests.k8s.rollout_load import (  # noqa: E402
    Load,
    UpgradeRun,
    claim_released,
    import_next_image,
    upgrade_then_rollback,
)
from tests.support.waiting import wait_until  # noqa: E402

RELEASE = "ixu"
ALLOCATION_LABEL = "ix-gpu.io/gpu.allocation"
ROLES = {"gpu-a": "device-plugin", "gpu-b": "dra"}


def install(release: Release) -> None:
    """Label the nodes, install the chart with dra.enabled, wait until each node's allocator offers
    its GPUs."""
    release.label_and_install(RELEASE, {n: {ALLOCATION_LABEL: a} for n, a in ROLES.items()}, "300s")
    probe = Load(release.api, release.image, device_plugin_node="gpu-a", dra_node="gpu-b", tfjobs=None)
    wait_until(
        lambda: (lambda s: (s.allocatable["gpu-a"] or 0) > 0 and s.devices.get("gpu-b", 0) > 0)(
            probe.sample()
        ),
        "gpu-a's GPUs allocatable and gpu-b's in its ResourceSlice",
        120,
        interval=0.5,
    )


def run(work: Path, interval_s: float, tfjob_every: int, in_flight: int) -> UpgradeRun:
    reason = host_settings.unfit_reason()
    if reason:
        raise SystemExit(f"real nodes cannot run here: {reason}")
    helm = build_helm()
    mini = start_real_node_cluster(work, work / "logs")
    try:
        assert mini.real_nodes is not None and mini.real_nodes.images is not None
        images = mini.real_nodes.images
        values = real_node_chart_values(images, scenario=True)
        values["dra"] = {"enabled": True}
        release = Release(mini, helm, work, values)
        install(release)
        group_version = install_crd(release.api, kubeflow_tfjob_crd())
        training_operator.install(release.api, images.training_operator_ref)
        started = time.monotonic()
        repository, tag = import_next_image(release)
        print(f"second image {repository}:{tag} imported on both nodes in {time.monotonic() - started:.1f}s")

        def upgrade(changed: dict[str, Any]) -> None:
            changed["image"] = {"repository": repository, "tag": tag}
            changed["config"]["profiles"][0].setdefault("env", []).append(
                {"name": "IX_GPU_RELEASE", "value": "upgraded"}
            )

        load = Load(
            release.api,
            release.image,
            device_plugin_node="gpu-a",
            dra_node="gpu-b",
            tfjobs=group_version,
            interval_s=interval_s,
            tfjob_every=tfjob_every,
            in_flight=in_flight,
        )
        result = upgrade_then_rollback(release, RELEASE, load, upgrade)
        (claim_holder,) = [h for h in result.holders if h.claim]
        unprepared_s = claim_released(release.api, claim_holder)
        print(f"the claim held through both rollouts unprepared in {unprepared_s:.1f}s")
        return result
    finally:
        mini.stop()


def report(result: UpgradeRun) -> str:
    lines = []
    for rollout in [result.before, *result.rollouts]:
        figures = rollout.figures()
        lines.append(f"{figures.pop('rollout')}:")
        lines.extend(f"  {key}: {value}" for key, value in figures.items())
    lines.append(f"turns let pass (a kind's pods all still running): {result.skipped}")
    lines.append(f"holders changed: {result.changed()}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between two creates")
    parser.add_argument("--tfjob-every", type=int, default=8, help="a TFJob every N rounds of creates")
    parser.add_argument("--in-flight", type=int, default=3, help="pods of one kind running at once, at most")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ix-rollout-") as work:
        result = run(Path(work), args.interval, args.tfjob_every, args.in_flight)
    print(json.dumps(result.figures()) if args.json else report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
