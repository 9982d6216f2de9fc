"""Acceptance cases from the seed documents and the kubeflow.org/v1 TFJob."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch

from ix_gpu.devicemodel import labels
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import Decision, NamespaceFacts
from ix_gpu.webhook.core.mutation import mutate
from ix_gpu.webhook.core.record_items import item_ref
from tests.support.k8s_schema import validate, validate_pod_template
from tests.support.paths import EXAMPLES, WEBHOOK_FIXTURES, load_yaml


def _apply(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = jsonpatch.apply_patch(obj, ops)
    return result


def test_seed_tfjob_becomes_the_handwritten_one(seed_compiled: CompiledConfig) -> None:
    user_job = load_yaml(EXAMPLES / "seed-tfjob.yaml")
    handwritten = load_yaml(WEBHOOK_FIXTURES / "seed-tfjob-handwritten.yaml")

    result = mutate(user_job, "CREATE", NamespaceFacts("ml-team"), seed_compiled)

    assert result.decision is Decision.MUTATED, result
    assert result.warnings == []
    mutated = _apply(user_job, result.ops)
    got = mutated["spec"]["replica_specs"][0]["template"]
    want = handwritten["spec"]["replica_specs"][0]["template"]
    got_container, want_container = got["spec"]["containers"][0], want["spec"]["containers"][0]
    for key in ("env", "securityContext", "volumeMounts", "args", "image", "name"):
        assert got_container[key] == want_container[key], key
    assert got["spec"]["volumes"] == want["spec"]["volumes"]
    assert got["spec"]["restartPolicy"] == want["spec"]["restartPolicy"]
    # Everything else the user wrote is kept; our only additions beyond the seed are the status
    # marks: which config applied, and the record of what it added (for a later config change).
    record = got["metadata"]["annotations"].pop(labels.INJECTED_ITEMS)
    assert got["metadata"] == {
        "creationTimestamp": None,
        "annotations": {labels.INJECTED: f"nvidia@{seed_compiled.digest}"},
    }
    captured = json.loads(record)
    assert captured["vol"] == [item_ref(v["name"], v) for v in want["spec"]["volumes"]]
    validate_pod_template(got)


def test_seed_tfjob_outside_privileged_namespace_gets_no_privileged(seed_compiled: CompiledConfig) -> None:
    user_job = load_yaml(EXAMPLES / "seed-tfjob.yaml")
    result = mutate(user_job, "CREATE", NamespaceFacts("other"), seed_compiled)
    assert result.decision is Decision.MUTATED
    container = _apply(user_job, result.ops)["spec"]["replica_specs"][0]["template"]["spec"]["containers"][0]
    assert "securityContext" not in container
    assert any("privileged not set" in w and "privilegedNamespaces" in w for w in result.warnings)


def _tfjob() -> dict[str, Any]:
    def template(gpus: int | None) -> dict[str, Any]:
        container: dict[str, Any] = {
            "name": "tensorflow",
            "image": "tf:2.16",
            "ports": [{"containerPort": 2222}],
        }
        if gpus is not None:
            container["resources"] = {"limits": {"iluvatar.com/gpu": gpus}}
        return {"spec": {"containers": [container], "restartPolicy": "OnFailure"}}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "mnist", "namespace": "ml"},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "None"},
            "tfReplicaSpecs": {
                "Chief": {"replicas": 1, "template": template(None)},
                "PS": {"replicas": 2, "template": template(None)},
                "Worker": {"replicas": 4, "template": template(2)},
            },
        },
    }


def test_kubeflow_tfjob_only_gpu_templates_change(default_compiled: CompiledConfig) -> None:
    job = _tfjob()
    original = copy.deepcopy(job)
    result = mutate(job, "CREATE", NamespaceFacts("ml"), default_compiled)
    assert result.decision is Decision.MUTATED
    assert all(op["path"].startswith("/spec/tfReplicaSpecs/Worker/template/") for op in result.ops)
    assert job == original, "the core must not modify its input"
    mutated = _apply(job, result.ops)
    specs = mutated["spec"]["tfReplicaSpecs"]
    assert specs["Chief"] == original["spec"]["tfReplicaSpecs"]["Chief"]
    assert specs["PS"] == original["spec"]["tfReplicaSpecs"]["PS"]
    worker = specs["Worker"]["template"]
    assert worker["metadata"]["annotations"][labels.INJECTED] == f"iluvatar@{default_compiled.digest}"
    env = {e["name"]: e["value"] for e in worker["spec"]["containers"][0]["env"]}
    assert env["LD_LIBRARY_PATH"] == "/usr/local/corex/lib64"
    for replica in specs.values():
        validate_pod_template(replica["template"])
    # The operator then creates Pods from the mutated template: the Pod webhook sees them done.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mnist-worker-0", **worker["metadata"]}}
    pod["spec"] = worker["spec"]
    validate(pod)
    again = mutate(pod, "CREATE", NamespaceFacts("ml"), default_compiled)
    assert again.decision is Decision.UNCHANGED and again.ops == []


def test_tfjob_replica_keys_are_opaque(default_compiled: CompiledConfig) -> None:
    job = _tfjob()
    specs = job["spec"]["tfReplicaSpecs"]
    specs["worker"] = specs.pop("Worker")  # users write any casing; the controller normalises later
    result = mutate(job, "CREATE", NamespaceFacts("ml"), default_compiled)
    assert result.decision is Decision.MUTATED
    assert {op["path"].split("/")[3] for op in result.ops} == {"worker"}


def test_tfjob_template_annotation_opts_out_one_replica(default_compiled: CompiledConfig) -> None:
    job = _tfjob()
    job["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"iluvatar.com/gpu": 1}
    }
    job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["metadata"] = {
        "annotations": {labels.INJECT: labels.INJECT_DISABLED}
    }
    result = mutate(job, "CREATE", NamespaceFacts("ml"), default_compiled)
    assert result.decision is Decision.MUTATED
    assert {op["path"].split("/")[3] for op in result.ops} == {"Chief"}
