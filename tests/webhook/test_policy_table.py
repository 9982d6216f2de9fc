"""Table-driven tests: opt-outs, privileged gating, conflicts and invalid GPU quantities."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from ix_gpu.config.webhook_config import parse_config
from ix_gpu.devicemodel import labels
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import Decision, NamespaceFacts
from ix_gpu.webhook.core.mutation import mutate
from tests.support.k8s_schema import validate
from tests.support.objects import pod

PSA = labels.PSA_ENFORCE


GPU = {"iluvatar.com/gpu": 1}
DISABLED = {labels.INJECT: labels.INJECT_DISABLED}


@pytest.mark.parametrize(
    ("name", "obj", "namespace", "decision", "reason_part"),
    [
        ("gpu pod", pod(limits=GPU), NamespaceFacts("team"), Decision.MUTATED, "injected iluvatar@"),
        (
            "no gpu",
            pod(limits={"cpu": "1"}),
            NamespaceFacts("team"),
            Decision.SKIPPED,
            "no container requests",
        ),
        (
            "zero gpus",
            pod(limits={"iluvatar.com/gpu": 0}),
            NamespaceFacts("team"),
            Decision.SKIPPED,
            "no container",
        ),
        (
            "ns annotation",
            pod(limits=GPU),
            NamespaceFacts("team", annotations=DISABLED),
            Decision.SKIPPED,
            "opted out",
        ),
        ("ns label", pod(limits=GPU), NamespaceFacts("team", labels=DISABLED), Decision.SKIPPED, "opted out"),
        (
            "unknown ns cannot opt out",
            pod(limits=GPU),
            NamespaceFacts.unknown("team"),
            Decision.MUTATED,
            "injected",
        ),
        (
            "pod annotation",
            pod(limits=GPU, annotations=DISABLED),
            NamespaceFacts("team"),
            Decision.SKIPPED,
            "object opted",
        ),
        (
            "pod label",
            pod(limits=GPU, labels=DISABLED),
            NamespaceFacts("team"),
            Decision.SKIPPED,
            "object opted",
        ),
        ("kube-system", pod(limits=GPU), NamespaceFacts("kube-system"), Decision.SKIPPED, "excluded"),
        ("kube-node-lease", pod(limits=GPU), NamespaceFacts("kube-node-lease"), Decision.SKIPPED, "excluded"),
        (
            "mirror pod",
            pod(limits=GPU, annotations={labels.MIRROR_POD: "abc"}),
            NamespaceFacts("team"),
            Decision.SKIPPED,
            "mirror",
        ),
        (
            "unknown kind",
            {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {}},
            NamespaceFacts("team"),
            Decision.SKIPPED,
            "not a configured workload",
        ),
        ("not an object", ["a"], NamespaceFacts("team"), Decision.SKIPPED, "no object"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_skip_and_opt_out(
    default_compiled: CompiledConfig,
    name: str,
    obj: Any,
    namespace: NamespaceFacts,
    decision: Decision,
    reason_part: str,
) -> None:
    result = mutate(obj, "CREATE", namespace, default_compiled)
    assert result.decision is decision, result
    assert reason_part in result.reason
    if decision is not Decision.MUTATED:
        assert result.ops == []


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_only_create_is_mutated(default_compiled: CompiledConfig, operation: str) -> None:
    result = mutate(pod(limits=GPU), operation, NamespaceFacts("team"), default_compiled)
    assert result.decision is Decision.SKIPPED and result.ops == []


@pytest.mark.parametrize(
    ("limits", "requests", "message"),
    [
        (
            {"iluvatar.com/gpu": "1.5"},
            None,
            "container \"main\": limit of iluvatar.com/gpu: '1.5' is not a whole",
        ),
        ({"iluvatar.com/gpu": 1.5}, None, "limit of iluvatar.com/gpu: 1.5 is not a whole number"),
        ({"iluvatar.com/gpu": "-1"}, None, "limit of iluvatar.com/gpu: '-1' is negative"),
        ({"iluvatar.com/gpu": -1}, None, "limit of iluvatar.com/gpu: -1 is negative"),
        ({"iluvatar.com/gpu": "abc"}, None, "limit of iluvatar.com/gpu: 'abc' is not a valid quantity"),
        ({"iluvatar.com/gpu": "500m"}, None, "'500m' is not a whole number"),
        ({"nvidia.com/gpu": True}, None, "limit of nvidia.com/gpu: True is not a quantity"),
        (
            {"iluvatar.com/gpu": 1},
            {"iluvatar.com/gpu": 2},
            "iluvatar.com/gpu request (2) must equal its limit (1)",
        ),
        (None, {"iluvatar.com/gpu": 1}, "iluvatar.com/gpu is requested but has no limit"),
        ({"cpu": "1"}, {"nvidia.com/gpu": "x"}, "request of nvidia.com/gpu: 'x' is not a valid quantity"),
    ],
)
def test_invalid_quantities_are_denied_naming_container_and_resource(
    default_compiled: CompiledConfig, limits: Any, requests: Any, message: str
) -> None:
    result = mutate(pod(limits=limits, requests=requests), "CREATE", NamespaceFacts("team"), default_compiled)
    assert result.decision is Decision.DENIED
    assert not result.allowed
    assert 'container "main"' in result.reason
    assert message in result.reason


@pytest.mark.parametrize("quantity", [1, "1", "2", "1e0", "+3", 4.0])
def test_valid_quantities(default_compiled: CompiledConfig, quantity: Any) -> None:
    obj = pod(limits={"iluvatar.com/gpu": quantity}, requests={"iluvatar.com/gpu": quantity})
    assert mutate(obj, "CREATE", NamespaceFacts("team"), default_compiled).decision is Decision.MUTATED


def test_invalid_quantity_of_other_resources_is_not_our_business(default_compiled: CompiledConfig) -> None:
    obj = pod(limits={"iluvatar.com/gpu": 1, "example.com/fpga": "1.5"})
    assert mutate(obj, "CREATE", NamespaceFacts("team"), default_compiled).decision is Decision.MUTATED


def _privileged_config(mode: str, conflict_policy: str = "keep-user") -> CompiledConfig:
    return CompiledConfig(
        parse_config(
            {
                "profiles": [{"name": "ix", "resources": ["iluvatar.com/gpu"], "privileged": mode}],
                "policy": {"privilegedNamespaces": ["gpu-*"], "conflictPolicy": conflict_policy},
            }
        )
    )


@pytest.mark.parametrize(
    ("mode", "namespace", "psa", "known", "outcome"),
    [
        ("never", "gpu-a", None, True, "unset"),
        ("allowed", "gpu-a", None, True, "set"),
        ("allowed", "gpu-a", "privileged", True, "set"),
        ("allowed", "gpu-a", "baseline", True, "warn"),
        ("allowed", "gpu-a", "restricted", True, "warn"),
        ("allowed", "other", None, True, "warn"),
        ("allowed", "gpu-a", None, False, "warn"),
        ("required", "gpu-a", None, True, "set"),
        ("required", "gpu-a", "baseline", True, "deny"),
        ("required", "gpu-a", "restricted", True, "deny"),
        ("required", "other", None, True, "deny"),
        ("required", "gpu-a", None, False, "deny"),
    ],
)
def test_privileged_gating(mode: str, namespace: str, psa: str | None, known: bool, outcome: str) -> None:
    facts = NamespaceFacts(namespace, labels={PSA: psa} if psa else {}, known=known)
    obj = pod(limits=GPU)
    result = mutate(obj, "CREATE", facts, _privileged_config(mode))
    if outcome == "deny":
        assert result.decision is Decision.DENIED
        assert "requires privileged" in result.reason and "containers[name=main]" in result.reason
        return
    assert result.decision is Decision.MUTATED
    container = jsonpatch.apply_patch(obj, result.ops)["spec"]["containers"][0]
    privileged = container.get("securityContext", {}).get("privileged")
    assert privileged is (True if outcome == "set" else None)
    assert any("privileged not set" in w for w in result.warnings) is (outcome == "warn")


@pytest.mark.parametrize(
    ("context", "outcome"),
    [
        ({"privileged": False}, "warn"),
        ({"allowPrivilegeEscalation": False}, "warn"),
        ({"runAsUser": 1000}, "set"),
        ({"privileged": True}, "kept"),
    ],
)
def test_privileged_respects_the_users_security_context(context: dict[str, Any], outcome: str) -> None:
    obj = pod(limits=GPU, securityContext=context)
    result = mutate(obj, "CREATE", NamespaceFacts("gpu-a"), _privileged_config("allowed"))
    mutated = jsonpatch.apply_patch(obj, result.ops)
    got = mutated["spec"]["containers"][0]["securityContext"]
    if outcome == "set":
        assert got == {**context, "privileged": True}
    else:
        assert got == context
    assert any("privileged not set" in w for w in result.warnings) is (outcome == "warn")
    validate(mutated)


def test_psa_baseline_namespace_gets_no_host_path_volumes(default_compiled: CompiledConfig) -> None:
    obj = pod(limits=GPU)
    facts = NamespaceFacts("team", labels={PSA: "baseline"})
    result = mutate(obj, "CREATE", facts, default_compiled)
    mutated = jsonpatch.apply_patch(obj, result.ops)
    assert "volumes" not in mutated["spec"]
    assert "volumeMounts" not in mutated["spec"]["containers"][0]
    assert mutated["spec"]["containers"][0]["env"][0]["name"] == "LD_LIBRARY_PATH"
    assert any("hostPath volumes not injected" in w and "baseline" in w for w in result.warnings)


CONFLICTS: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    (
        "volume name clash",
        {"volumes": [{"name": "ix-gpu-iluvatar-driver", "emptyDir": {}}]},
        {},
        "spec.volumes[name=ix-gpu-iluvatar-driver]",
    ),
    (
        "mountPath clash",
        {"volumes": [{"name": "mine", "emptyDir": {}}]},
        {"volumeMounts": [{"name": "mine", "mountPath": "/usr/local/corex"}]},
        "containers[name=main].volumeMounts[mountPath=/usr/local/corex]",
    ),
    (
        "env from valueFrom",
        {},
        {"env": [{"name": "LD_LIBRARY_PATH", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
        "containers[name=main].env[name=LD_LIBRARY_PATH]",
    ),
]


@pytest.mark.parametrize(
    ("name", "spec_extra", "container_extra", "field"), CONFLICTS, ids=[c[0] for c in CONFLICTS]
)
def test_conflicts_keep_the_users_value_and_warn(
    default_compiled: CompiledConfig,
    name: str,
    spec_extra: dict[str, Any],
    container_extra: dict[str, Any],
    field: str,
) -> None:
    obj = pod(limits=GPU, **container_extra)
    obj["spec"].update(spec_extra)
    result = mutate(obj, "CREATE", NamespaceFacts("team"), default_compiled)
    assert result.decision is Decision.MUTATED
    assert any(field in w for w in result.warnings), result.warnings
    mutated = jsonpatch.apply_patch(obj, result.ops)
    validate(mutated)
    for key, value in spec_extra.items():
        assert all(item in mutated["spec"][key] for item in value)
    container = mutated["spec"]["containers"][0]
    for key, value in container_extra.items():
        assert all(item in container[key] for item in value)
    # A second pass adds nothing, and says the same.
    again = mutate(mutated, "CREATE", NamespaceFacts("team"), default_compiled)
    assert again.ops == [] and again.warnings == result.warnings


def test_conflict_policy_deny() -> None:
    config = CompiledConfig(
        parse_config(
            {
                "profiles": [
                    {"name": "ix", "resources": ["iluvatar.com/gpu"], "nodeSelector": {"gpu": "ix"}}
                ],
                "policy": {"conflictPolicy": "deny"},
            }
        )
    )
    obj = pod(limits=GPU)
    obj["spec"]["nodeSelector"] = {"gpu": "other"}
    result = mutate(obj, "CREATE", NamespaceFacts("team"), config)
    assert result.decision is Decision.DENIED
    assert "spec.nodeSelector[gpu]" in result.reason


def test_env_merge_modes() -> None:
    config = CompiledConfig(
        parse_config(
            {
                "profiles": [
                    {
                        "name": "ix",
                        "resources": ["iluvatar.com/gpu"],
                        "env": [
                            {"name": "LD_LIBRARY_PATH", "value": "/corex/lib64", "mode": "prepend-path"},
                            {"name": "PATH", "value": "/corex/bin", "mode": "append-path"},
                            {"name": "IX_MODE", "value": "fast", "mode": "override"},
                            {"name": "KEEP", "value": "ours"},
                            {"name": "NEW", "value": "x"},
                        ],
                    }
                ]
            }
        )
    )
    obj = pod(
        limits=GPU,
        env=[
            {"name": "LD_LIBRARY_PATH", "value": "/usr/lib"},
            {"name": "PATH", "value": "/bin:/usr/bin"},
            {"name": "IX_MODE", "value": "slow"},
            {"name": "KEEP", "value": "user"},
        ],
    )
    result = mutate(obj, "CREATE", NamespaceFacts("team"), config)
    env = {
        e["name"]: e["value"] for e in jsonpatch.apply_patch(obj, result.ops)["spec"]["containers"][0]["env"]
    }
    assert env == {
        "LD_LIBRARY_PATH": "/corex/lib64:/usr/lib",
        "PATH": "/bin:/usr/bin:/corex/bin",
        "IX_MODE": "fast",
        "KEEP": "user",
        "NEW": "x",
    }
    assert any("env[name=KEEP]" in w for w in result.warnings)
    # Replacing the user's value is said as loudly as keeping it.
    (replaced,) = [w for w in result.warnings if "env[name=IX_MODE]" in w]
    assert "'slow'" in replaced and "'fast'" in replaced and "override" in replaced


def test_env_override_warns_but_is_no_conflict_to_deny() -> None:
    # mode: override is the operator saying "ours wins": conflictPolicy deny does not undo that.
    config = CompiledConfig(
        parse_config(
            {
                "profiles": [
                    {
                        "name": "ix",
                        "resources": ["iluvatar.com/gpu"],
                        "env": [{"name": "IX_MODE", "value": "fast", "mode": "override"}],
                    }
                ],
                "policy": {"conflictPolicy": "deny"},
            }
        )
    )
    result = mutate(
        pod(limits=GPU, env=[{"name": "IX_MODE", "value": "slow"}]), "CREATE", NamespaceFacts("t"), config
    )
    assert result.decision is Decision.MUTATED
    assert [w for w in result.warnings if "env[name=IX_MODE]" in w]
    same = mutate(
        pod(limits=GPU, env=[{"name": "IX_MODE", "value": "fast"}]), "CREATE", NamespaceFacts("t"), config
    )
    assert not [w for w in same.warnings if "env[name=IX_MODE]" in w]


def test_gpu_type_annotation_becomes_required_node_affinity(default_compiled: CompiledConfig) -> None:
    obj = pod(limits=GPU, annotations={labels.GPU_TYPE: "Iluvatar BI-V150, MR-V100"})
    obj["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
                ]
            }
        }
    }
    result = mutate(obj, "CREATE", NamespaceFacts("team"), default_compiled)
    mutated = jsonpatch.apply_patch(obj, result.ops)
    validate(mutated)
    terms = mutated["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    # The bare model, as the plugin publishes it: the vendor prefix is dropped, as in the node label.
    ours = {"key": labels.GPU_PRODUCT, "operator": "In", "values": ["BI-V150", "MR-V100"]}
    assert terms[0]["matchExpressions"] == [{"key": "zone", "operator": "In", "values": ["a"]}, ours]
    assert terms[1]["matchExpressions"] == [ours]
    assert mutate(mutated, "CREATE", NamespaceFacts("team"), default_compiled).ops == []


def test_keys_with_slash_and_tilde_are_escaped() -> None:
    # "~" is no label-key character, so a config with it is refused; the escaping is checked with
    # the validation bypassed (model_copy does not validate).
    valid = parse_config({"profiles": [{"name": "ix", "resources": ["iluvatar.com/gpu"]}]})
    profile = valid.profiles[0].model_copy(update={"node_selector": {"ix-gpu.io/a~b": "1"}})
    config = CompiledConfig(valid.model_copy(update={"profiles": (profile,)}))
    obj = pod(limits=GPU)
    obj["spec"]["nodeSelector"] = {"kubernetes.io/os": "linux"}
    result = mutate(obj, "CREATE", NamespaceFacts("team"), config)
    assert {"op": "add", "path": "/spec/nodeSelector/ix-gpu.io~1a~0b", "value": "1"} in result.ops
    assert jsonpatch.apply_patch(obj, result.ops)["spec"]["nodeSelector"] == {
        "kubernetes.io/os": "linux",
        "ix-gpu.io/a~b": "1",
    }


def test_init_containers_and_glob_profiles() -> None:
    config = CompiledConfig(
        parse_config(
            {
                "profiles": [
                    {
                        "name": "mig",
                        "resources": ["nvidia.com/mig-*"],
                        "env": [{"name": "MIG", "value": "1"}],
                        "runtimeClassName": "nvidia",
                    }
                ]
            }
        )
    )
    obj = pod(limits={"cpu": "1"})
    obj["spec"]["initContainers"] = [
        {"name": "warm", "image": "i", "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}
    ]
    result = mutate(obj, "CREATE", NamespaceFacts("team"), config)
    mutated = jsonpatch.apply_patch(obj, result.ops)
    validate(mutated)
    assert mutated["spec"]["initContainers"][0]["env"] == [{"name": "MIG", "value": "1"}]
    assert "env" not in mutated["spec"]["containers"][0]
    assert mutated["spec"]["runtimeClassName"] == "nvidia"
