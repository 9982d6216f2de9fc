"""The scale bench's ``none`` arm (``burst_arms.py``) creates pods carrying what the ix-gpu webhook
would have added, so the scheduler and kubelets work on the same pods as under the webhook: each
such pod is one the webhook itself would leave unchanged (its reinvocation check finds nothing to
add), and a pod of an opted-out namespace stays as the client wrote it. No cluster: the mutation
core alone, with the config the real-node chart values give (the nodes' driver root)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ix_gpu.config.webhook_config import default_config, parse_config
from ix_gpu.devicemodel import labels
from ix_gpu.webhook.core.decision import Decision
from ix_gpu.webhook.core.mutation import mutate
from ix_gpu.webhook.service.metrics import ServiceMetrics
from tests.k8s import real_nodes
from tests.k8s.burst import gpu_pod, namespace_facts
from tests.k8s.burst_arms import PreApplied
from tests.k8s.burst_compare import arm_order, parse_arms
from tests.k8s.burst_webhook import reviews_in
from tests.k8s.cluster import MiniCluster
from tests.k8s.host_quiet import busy_share, cpu_times, settle


def _real_node_config() -> PreApplied:
    data = default_config().model_dump(mode="json", by_alias=True)
    for profile in data["profiles"]:
        for volume in profile["volumes"]:
            if volume["hostPath"] == "/usr/local/corex":
                volume["hostPath"] = real_nodes.DRIVER_ROOT
    return PreApplied(parse_config(data), namespace_facts)


@pytest.mark.parametrize("namespace", ["scale-00001", "scale-00002", "scale-00003"])
@pytest.mark.parametrize("affinity", [False, True])
def test_a_pre_applied_pod_is_one_the_webhook_leaves_unchanged(namespace: str, affinity: bool) -> None:
    prepare = _real_node_config()
    pod = prepare(namespace, gpu_pod("gpu-000001", affinity))
    assert labels.INJECTED in pod["metadata"]["annotations"]
    assert any(v["hostPath"]["path"] == real_nodes.DRIVER_ROOT for v in pod["spec"]["volumes"])
    assert ("affinity" in pod["spec"]) is affinity
    again = mutate(pod, "CREATE", namespace_facts(namespace), prepare.compiled)
    assert again.decision is Decision.UNCHANGED and again.ops == [], again.reason
    assert not prepare.lacking({**pod, "metadata": {**pod["metadata"], "namespace": namespace}})


def test_an_opted_out_namespace_pod_is_left_bare_and_not_counted_lacking() -> None:
    prepare = _real_node_config()
    bare = gpu_pod("gpu-000000", False)
    assert prepare("scale-00020", bare) == bare


def test_a_bare_pod_is_counted_lacking() -> None:
    pod = gpu_pod("gpu-000001", False)
    assert _real_node_config().lacking({**pod, "metadata": {**pod["metadata"], "namespace": "scale-00001"}})


def test_arms_are_a_comma_list_of_distinct_known_arms() -> None:
    assert parse_arms("none,go,ix-gpu") == ["none", "go", "ix-gpu"]
    for bad in ("", "none,none", "python"):
        with pytest.raises(ValueError):
            parse_arms(bad)


def test_the_arm_order_turns_so_each_arm_runs_once_in_each_place() -> None:
    arms = ["none", "go", "ix-gpu"]
    orders = [arm_order(arms, r) for r in (1, 2, 3, 4)]
    assert orders[0] == arms
    assert orders[1] == ["go", "ix-gpu", "none"]
    assert orders[3] == orders[0]
    for place in range(3):
        assert sorted(order[place] for order in orders[:3]) == sorted(arms)


def _windows(*shares: float) -> Callable[[float], float]:
    it = iter(shares)
    return lambda _window: next(it)


def test_settling_stops_at_the_first_quiet_window() -> None:
    settled = settle(quiet=0.35, window_s=0, sample=_windows(0.9, 0.6, 0.3, 0.1))
    assert (settled.reason, settled.shares, settled.busy_at_start) == ("quiet", [0.9, 0.6, 0.3], 0.3)


def test_settling_stops_once_the_busy_share_stops_falling() -> None:
    settled = settle(
        quiet=0.35,
        window_s=0,
        flat_windows=3,
        flat_by=0.03,
        sample=_windows(0.9, 0.7, 0.6, 0.61, 0.59, 0.6, 0.1),
    )
    assert settled.reason == "steady"
    assert settled.shares == [0.9, 0.7, 0.6, 0.61, 0.59, 0.6]


def test_settling_gives_up_at_its_limit() -> None:
    settled = settle(quiet=0.35, window_s=0, max_s=0, sample=_windows(0.9, 0.5))
    assert (settled.reason, settled.shares) == ("max_s", [0.9])


def test_the_busy_share_is_read_from_the_cpu_counters() -> None:
    counters = iter([(100, 1000), (160, 1100)])
    assert busy_share(0, times=lambda: next(counters)) == 0.6
    busy, total = cpu_times()
    assert 0 <= busy <= total


def test_each_replicas_reviews_are_read_from_ix_gpus_histogram_or_the_go_counter() -> None:
    metrics = ServiceMetrics()
    for seconds in (0.001, 0.002, 0.5):
        metrics.observe_duration(seconds)
    assert reviews_in(metrics.render().decode()) == 3
    # What bench/go-webhook's /metrics serves (its handler writes exactly these lines).
    go = (
        "# HELP ix_gpu_go_reference_reviews_total Reviews POSTed to /mutate.\n"
        "# TYPE ix_gpu_go_reference_reviews_total counter\n"
        "ix_gpu_go_reference_reviews_total 6418\n"
    )
    assert reviews_in(go) == 6418
    assert reviews_in("") == 0


def test_the_webhook_routing_defaults_to_what_each_runtime_has_and_refuses_service_without_kube_proxy(
    tmp_path: Path,
) -> None:
    assert MiniCluster(tmp_path, runtime="fake-cri").webhook_routing == "endpoints"
    assert MiniCluster(tmp_path, runtime="containerd", plugin_config=None).webhook_routing == "service"
    routed = MiniCluster(tmp_path, runtime="containerd", plugin_config=None, webhook_routing="endpoints")
    assert routed.webhook_routing == "endpoints"
    for runtime, routing in (("fake-cri", "service"), ("containerd", "round-robin")):
        with pytest.raises(ValueError, match="webhook_routing"):
            MiniCluster(tmp_path, runtime=runtime, plugin_config=None, webhook_routing=routing)
