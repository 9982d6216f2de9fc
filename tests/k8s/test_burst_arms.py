"""The scale bench's ``none`` arm (``burst_arms.py``) creates pods carrying what the ix-gpu webhook
would have added, so the scheduler and kubelets work on the same pods as under the webhook: each
such pod is one the webhook itself would leave unchanged (its reinvocation check finds nothing to
add), and a pod of an opted-out namespace stays as the client wrote it. No cluster: the mutation
core alone, with the config the real-node chart values give (the nodes' driver root)."""

from __future__ import annotations

import pytest

from ix_gpu.config.webhook_config import default_config, parse_config
from ix_gpu.devicemodel import labels
from ix_gpu.webhook.core.decision import Decision
from ix_gpu.webhook.core.mutation import mutate
from tests.k8s import real_nodes
from tests.k8s.burst import gpu_pod, namespace_facts
from tests.k8s.burst_arms import PreApplied
from tests.k8s.burst_compare import parse_arms


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
