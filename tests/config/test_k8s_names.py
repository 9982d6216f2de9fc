"""The apiserver's validation rules, written once (ix_gpu.config.k8s_names), and the webhook
config refusing, with the field named, every value Kubernetes would refuse in an injected pod."""

from __future__ import annotations

from typing import Any

import pytest

from ix_gpu.config import k8s_names
from ix_gpu.config.input_files import ConfigError
from ix_gpu.config.webhook_config import parse_config


def profile(**extra: Any) -> dict[str, Any]:
    return {"name": "p", "resources": ["a.com/gpu"], **extra}


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("a", True),
        ("app.kubernetes.io/name", True),
        ("ix-gpu.io/gpu.product", True),
        ("A_b.c-D", True),
        ("x" * 63, True),
        ("x" * 64, False),
        ("a" * 253 + "/n", True),
        ("a" * 254 + "/n", False),
        ("", False),
        ("/name", False),
        ("a/b/c", False),
        ("Upper.com/name", False),
        ("-a", False),
        ("a-", False),
        ("has space", False),
        ("a/", False),
    ],
)
def test_qualified_name(value: str, ok: bool) -> None:
    assert (k8s_names.qualified_name(value) == []) is ok, k8s_names.qualified_name(value)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("", True),
        ("BI-V150", True),
        ("a.b_c", True),
        ("x" * 63, True),
        ("x" * 64, False),
        ("-a", False),
        ("a b", False),
        ("a*", False),
        ("team-*", False),
    ],
)
def test_label_value(value: str, ok: bool) -> None:
    assert (k8s_names.label_value(value) == []) is ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("LD_LIBRARY_PATH", True),
        ("my.env-name", True),
        ("_x", True),
        ("-x", True),
        ("1X", False),
        ("A=B", False),
        ("", False),
        (".", False),
        ("..", False),
        ("..x", False),
        ("a b", False),
    ],
)
def test_env_var_name(value: str, ok: bool) -> None:
    assert (k8s_names.env_var_name(value) == []) is ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("nvidia.com/gpu", True),
        ("iluvatar.com/gpu", True),
        ("gpu", False),
        ("cpu", False),
        ("kubernetes.io/gpu", False),
        ("x.kubernetes.io/gpu", False),
        ("requests.a.com/gpu", False),
        ("a/gpu", True),
        ("a.com/", False),
        ("a.com/-x", False),
        ("A.com/gpu", False),
    ],
)
def test_extended_resource_name(value: str, ok: bool) -> None:
    assert (k8s_names.extended_resource_name(value) == []) is ok, k8s_names.extended_resource_name(value)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("nvidia.com/mig-*", True),
        ("nvidia.com/*", True),
        ("a.com/gpu-?g", True),
        ("a.com/gpu", True),
        ("*", False),
        ("*/gpu", False),
        ("*.com/gpu", False),
        ("kubernetes.io/*", False),
        ("a.com/-*", False),
        ("a.com/[ab]", False),
        ("c*", False),
        ("nvidia.com*", False),
    ],
)
def test_extended_resource_pattern(value: str, ok: bool) -> None:
    assert (k8s_names.extended_resource_pattern(value) == []) is ok, k8s_names.extended_resource_pattern(
        value
    )


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("ml-team", True),
        ("team-*", True),
        ("t?am", True),
        ("*", True),
        ("Team", False),
        ("team_a", False),
        ("team-[ab]", False),
        ("-*", False),
        ("x" * 64, False),
    ],
)
def test_namespace_name_or_pattern(value: str, ok: bool) -> None:
    assert (k8s_names.namespace_name_or_pattern(value) == []) is ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("/usr/local/corex", True),
        ("/", True),
        ("rel/dir", False),
        ("", False),
        ("/a/../b", False),
        ("/a/..", False),
        ("/a/..b", True),
    ],
)
def test_absolute_path(value: str, ok: bool) -> None:
    assert (k8s_names.absolute_path(value) == []) is ok


# Values that Kubernetes refuses on every injected pod, and one per rule.
@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"profiles": [profile(tolerations=[{"key": "", "operator": "Equal"}])]},
            "profiles[0].tolerations[0]",
        ),
        (
            {"profiles": [profile(tolerations=[{"key": "a b", "operator": "Exists"}])]},
            "profiles[0].tolerations[0].key",
        ),
        (
            {"profiles": [profile(tolerations=[{"key": "k", "value": "team-*"}])]},
            "profiles[0].tolerations[0].value",
        ),
        ({"profiles": [profile(nodeSelector={"bad key!": "x"})]}, "profiles[0].nodeSelector"),
        ({"profiles": [profile(nodeSelector={"gpu": "a b"})]}, "profiles[0].nodeSelector.gpu"),
        (
            {
                "profiles": [
                    profile(affinity={"requiredNodeExpressions": [{"key": "a/b/c", "operator": "Exists"}]})
                ]
            },
            "profiles[0].affinity.requiredNodeExpressions[0].key",
        ),
        (
            {
                "profiles": [
                    profile(
                        affinity={
                            "requiredNodeExpressions": [{"key": "k", "operator": "Gt", "values": ["1.5"]}]
                        }
                    )
                ]
            },
            "requiredNodeExpressions[0]: Value error, values: operator Gt needs one integer value",
        ),
        (
            {
                "profiles": [
                    profile(
                        affinity={
                            "requiredNodeExpressions": [{"key": "k", "operator": "In", "values": ["a b"]}]
                        }
                    )
                ]
            },
            "requiredNodeExpressions[0].values[0]",
        ),
        ({"profiles": [profile(runtimeClassName="Nvidia_RT")]}, "profiles[0].runtimeClassName"),
        ({"profiles": [profile(env=[{"name": "A=B", "value": "1"}])]}, "profiles[0].env[0].name"),
        ({"profiles": [profile(env=[{"name": "1A", "value": "1"}])]}, "profiles[0].env[0].name"),
        ({"profiles": [profile(resources=["*"])]}, "profiles[0].resources[0]"),
        ({"profiles": [profile(resources=["gpu"])]}, "profiles[0].resources[0]"),
        ({"profiles": [profile(resources=["kubernetes.io/gpu"])]}, "profiles[0].resources[0]"),
        (
            {"profiles": [profile(volumes=[{"name": "v", "hostPath": "/a/../etc", "mountPath": "/b"}])]},
            "profiles[0].volumes[0].hostPath",
        ),
        (
            {"profiles": [profile(volumes=[{"name": "v", "hostPath": "/a", "mountPath": "b"}])]},
            "profiles[0].volumes[0].mountPath",
        ),
        ({"policy": {"excludedNamespaces": ["Team_A"]}}, "policy.excludedNamespaces[0]"),
        ({"policy": {"privilegedNamespaces": ["team-[ab]"]}}, "policy.privilegedNamespaces[0]"),
    ],
)
def test_values_kubernetes_refuses_are_refused_naming_the_field(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, "cfg.yaml")
    assert message in str(caught.value), str(caught.value)


def test_values_kubernetes_accepts_are_accepted() -> None:
    config = parse_config(
        {
            "profiles": [
                profile(
                    resources=["nvidia.com/gpu", "nvidia.com/mig-*"],
                    nodeSelector={"ix-gpu.io/gpu.vendor": "nvidia", "feature": ""},
                    tolerations=[{"operator": "Exists"}, {"key": "k", "value": "", "effect": "NoSchedule"}],
                    affinity={
                        "requiredNodeExpressions": [
                            {"key": "ix-gpu.io/gpu.memory", "operator": "Gt", "values": ["40000"]}
                        ]
                    },
                    runtimeClassName="nvidia",
                    env=[{"name": "my.env-name", "value": "1"}],
                )
            ],
            "policy": {"excludedNamespaces": ["kube-system", "team-*"], "privilegedNamespaces": ["ml-?"]},
        }
    )
    assert config.policy.excluded_namespaces == ("kube-system", "team-*")


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        ([".", "."], "templatePaths[0] '.' and templatePaths[1] '.'"),
        (
            ["spec.tfReplicaSpecs.*.template", "spec.tfReplicaSpecs.Worker.template"],
            "templatePaths[0] 'spec.tfReplicaSpecs.*.template' and templatePaths[1] "
            "'spec.tfReplicaSpecs.Worker.template'",
        ),
        (["spec.a[*].template", "spec.*.*.template", "spec.a.*.template"], "templatePaths[1]"),
        (["spec.*.template", "spec.x.template"], "templatePaths[0]"),
    ],
)
def test_overlapping_template_paths_are_refused_naming_both(paths: list[str], message: str) -> None:
    data = {"workloads": [{"apiVersion": "x.io/v1", "kind": "X", "templatePaths": paths}]}
    with pytest.raises(ConfigError) as caught:
        parse_config(data, "cfg.yaml")
    assert "workloads[0].templatePaths" in str(caught.value)
    assert message in str(caught.value), str(caught.value)


def test_disjoint_template_paths_are_accepted() -> None:
    # A map key and a list item can never be the same node; "." and a nested path are different nodes.
    paths = ["spec.a[*].template", "spec.*.*.template", ".", "spec.b.template", "spec.template"]
    parse_config({"workloads": [{"apiVersion": "x.io/v1", "kind": "X", "templatePaths": paths}]})
