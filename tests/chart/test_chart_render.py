"""charts/ix-gpu: helm lint and render for the default values and each certificate mode; every
object checked against the Kubernetes 1.30 and 1.35 schemas; the values schema rejects typos and
embeds the core's config schema; the rendered webhook and plugin configs load with the project's
own config schemas; the webhook registration follows the configured workloads."""

from __future__ import annotations

import base64
import copy
import fnmatch
import json
import subprocess
import sys
from typing import Any

import cel
import pytest
import yaml

from ix_gpu.config.plugin_config import DEFAULT_PATH as PLUGIN_CONFIG_PATH
from ix_gpu.config.plugin_config import parse_plugin_config
from ix_gpu.config.webhook_config import Workload, default_config, json_schema, parse_config
from tests.chart.rendering import (
    CERT_MODES,
    CHART,
    KUBE_VERSIONS,
    NAMESPACE,
    HelmError,
    chart,
    find,
    kinds,
    lint,
    merge,
    notes,
    render,
    render_files,
)
from tests.support.k8s_schema import validate
from tests.support.objects import container, pod, pod_claim, replica, tfjob
from tests.support.paths import EXAMPLES, ROOT, load_yaml

WEBHOOK = "ixg-ix-gpu-webhook"
PLUGIN = "ixg-ix-gpu-plugin"
METRICS = "ixg-ix-gpu-metrics"
MWC = "ixg-ix-gpu"
POD_HOOK = "pods.v1.ix-gpu.io"
TFJOB_HOOK = "tfjobs.v1.kubeflow.org.ix-gpu.io"
LEGACY_HOOK = "tfjobs.v1beta1.mlkube.io.ix-gpu.io"
# CRDs: not in the Kubernetes schemas; their fields are asserted below.
CRD_KINDS = {
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
}
LINUX = {"kubernetes.io/os": "linux"}


# --------------------------------------------------------------------------- lint and schemas


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("mode", CERT_MODES)
def test_helm_lint_strict_is_clean(mode: str, kube_version: str) -> None:
    report = lint(CERT_MODES[mode], kube_version)
    assert report["errors"] == []
    # severity 2 = warning, 3 = error; only the "icon is recommended" info (1) is allowed.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_lint_checks_values_against_the_schema() -> None:
    report = lint({"webhook": {"replcas": 3}})
    assert any("replcas" in error for error in report["errors"]), report


def test_chart_declares_its_kubernetes_range() -> None:
    assert chart().metadata["kubeVersion"] == ">=1.30.0-0"
    assert chart().metadata["apiVersion"] == "v2"


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("mode", CERT_MODES)
def test_every_rendered_object_is_valid_kubernetes(mode: str, kube_version: str) -> None:
    objects = render(CERT_MODES[mode])
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue
        validate(obj, version=kube_version)
    common = [
        "ClusterRole",  # webhook: namespaces
        "ClusterRole",  # plugin: node labels, on by default
        "ClusterRoleBinding",
        "ClusterRoleBinding",
        "ConfigMap",
        "ConfigMap",
        "DaemonSet",
        "Deployment",
        "MutatingWebhookConfiguration",
        "PodDisruptionBudget",
        "Service",  # the webhook's
        "Service",  # metrics
        "ServiceAccount",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",  # plugin: only its own node's published labels
        "ValidatingAdmissionPolicyBinding",
    ]
    extra = {"self": ["Role", "RoleBinding"], "certManager": ["Certificate", "Issuer"], "provided": []}[mode]
    assert kinds(objects) == sorted(common + extra)


CRD_WORKLOAD = {
    "apiVersion": "example.com/v1alpha1",
    "kind": "TrainingJob",
    "templatePaths": ["spec.roles.*.pods[*].template"],
}


def _seed_values() -> dict[str, Any]:
    """The seed's config (device nodes, privileged in ml-team) as chart values."""
    return {"config": load_yaml(EXAMPLES / "seed-config.yaml")}


def test_every_option_turned_on_still_validates() -> None:
    values = {
        "config": {
            "profiles": [
                {
                    "name": "nvidia",
                    "resources": ["nvidia.com/gpu", "nvidia.com/mig-?g.*"],
                    "volumes": [{"name": "cuda", "hostPath": "/usr/local/cuda", "mountPath": "/cuda"}],
                    "deviceNodes": {
                        "inject": True,
                        "volumes": [
                            {"name": "dev-nvidia0", "hostPath": "/dev/nvidia0", "mountPath": "/dev/nvidia0"}
                        ],
                    },
                    "env": [{"name": "LD_LIBRARY_PATH", "value": "/cuda/lib64", "mode": "prepend-path"}],
                    "privileged": "allowed",
                    "nodeSelector": {"gpu": "nvidia"},
                    "affinity": {
                        "requiredNodeExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]
                    },
                    "tolerations": [{"operator": "Exists"}],
                    "runtimeClassName": "nvidia",
                }
            ],
            "workloads": [
                {"apiVersion": "v1", "kind": "Pod", "templatePaths": ["."]},
                {**CRD_WORKLOAD, "resource": "trainingjobs"},
                {"apiVersion": "batch.example.com/*", "kind": "Job", "templatePaths": ["spec.template"]},
            ],
            "policy": {
                "excludedNamespaces": ["batch"],
                "privilegedNamespaces": ["ml"],
                "conflictPolicy": "deny",
                "namespaceLookupFailure": "deny",
            },
        },
        "webhook": {
            "matchConditions": False,
            "hostNetwork": True,
            "podDisruptionBudget": {"enabled": False},
            "nodeSelector": {"role": "infra"},
            "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "system-cluster-critical",
            "podAnnotations": {"a": "b"},
        },
        "plugin": {
            "nodeLabels": False,
            "driver": {
                "root": "/run/nvidia/driver",
                "libraryDirs": ["usr/lib/x86_64-linux-gnu", "usr/lib64"],
            },
            "nodeSelector": {"ix-gpu.io/gpu.present": "true"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "feature.node.kubernetes.io/pci-1e3e.present",
                                        "operator": "In",
                                        "values": ["true"],
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
        },
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}, "interval": "15s"}},
        "image": {"digest": "sha256:" + "a" * 64},
        "imagePullSecrets": [{"name": "regcred"}],
        "commonLabels": {"team": "gpu"},
    }
    assert not lint(values)["errors"]
    objects = render(values)
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue
        for version in KUBE_VERSIONS:
            validate(obj, version=version)
    assert "ServiceMonitor" in kinds(objects)
    assert _webhook_config(values) == parse_config(
        merge(values["config"], {"policy": {"excludedNamespaces": [*SYSTEM, NAMESPACE, "batch"]}})
    )


@pytest.mark.parametrize(
    "values",
    [
        {"webhok": {}},
        {"webhook": {"replcas": 3}},
        {"plugin": {"config": {"flags": {"splitBoard": True}}}},
        {"plugin": {"config": {"sharing": {"timeslicing": {"replicas": 2}}}}},
        {"certs": {"mode": "Self"}},
        {"certs": {"self": {"secret": "x"}}},
        {"webhook": {"timeoutSeconds": 31}},
        {"plugin": {"config": {"sharing": {"timeSlicing": {"replicas": 0}}}}},
        {"plugin": {"driver": {"root": "/"}}},
        {"plugin": {"driver": {"libraryDirs": ["/usr/lib"]}}},
        {"metrics": {"serviceMonitor": {"enabeld": True}}},
        # Inside `config`, the core's own schema: a typo anywhere is an install error.
        {"config": {"profiles": [{"name": "p", "resource": ["iluvatar.com/gpu"]}]}},
        {"config": {"profiles": [{"name": "p", "resources": ["a/b"], "privileged": "yes"}]}},
        {"config": {"policy": {"excludedNamespace": ["x"]}}},
        {"config": {"policy": {"conflictPolicy": "overwrite"}}},
        {"config": {"workloads": [{"apiVersion": "v1", "kind": "Pod", "templatePath": ["."]}]}},
        {"config": {"workloads": [{**CRD_WORKLOAD, "resource": "TrainingJobs"}]}},
        {"config": {"apiVersion": "ix-gpu.io/v2"}},
        # Values the `config` value replaced: rejected by name rather than silently ignored.
        {"profiles": {"iluvatar": {"resources": ["iluvatar.com/gpu"]}}},
        {"webhook": {"tfjobs": False}},
        {"webhook": {"excludedNamespaces": ["batch"]}},
        {"webhook": {"privilegedNamespaces": ["ml"]}},
        {"webhook": {"conflictPolicy": "deny"}},
        {"webhook": {"namespaceLookupFailure": "deny"}},
    ],
    ids=lambda v: str(v)[:60],
)
def test_values_schema_rejects_typos_and_bad_values(values: dict[str, Any]) -> None:
    with pytest.raises(HelmError, match=r"schema"):
        chart().render(values, name="ixg", namespace=NAMESPACE)


def test_values_schema_accepts_the_defaults_and_documented_examples() -> None:
    chart().validate_schema(chart().values)
    glob = {"name": "iluvatar", "resources": ["iluvatar.com/*"]}
    chart().validate_schema({"config": {"profiles": [glob]}})
    for example in ("seed-config.yaml", "nvidia-hostpath-driver.yaml"):
        chart().validate_schema({"config": load_yaml(EXAMPLES / example)})


# --------------------------------------------------------------------------- one config schema


def test_values_schema_embeds_the_config_schema_the_cli_prints() -> None:
    """No second, hand-written schema: `config` in values.schema.json is `ix-gpu config schema`.
    On drift: .venv/bin/python scripts/sync_chart.py."""
    embedded = json.loads((CHART / "values.schema.json").read_text())["properties"]["config"]
    assert embedded == json_schema()
    printed = subprocess.run(
        [sys.executable, "-m", "ix_gpu", "config", "schema"], capture_output=True, text=True, check=True
    )
    assert json.loads(printed.stdout) == embedded


def test_values_config_is_the_built_in_default() -> None:
    """The chart's default `config` is `ix-gpu config default`, so installing the chart and running
    the webhook without --config inject the same. On drift: .venv/bin/python scripts/sync_chart.py."""
    assert parse_config(chart().values["config"]) == default_config()
    assert chart().values["config"] == default_config().model_dump(
        mode="json", by_alias=True, exclude_none=True
    )


def test_sync_script_finds_nothing_to_regenerate() -> None:
    check = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sync_chart.py"), "--check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr


def test_provided_mode_without_its_secret_is_an_error() -> None:
    with pytest.raises(HelmError, match=r"secretName|caBundle"):
        chart().render({"certs": {"mode": "provided"}}, name="ixg", namespace=NAMESPACE)


@pytest.mark.parametrize("mode", CERT_MODES)
def test_rendering_is_reproducible(mode: str) -> None:
    """No genCA, no random names: GitOps tools re-render constantly and must see no drift."""
    first = chart().render(CERT_MODES[mode], name="ixg", namespace=NAMESPACE)
    second = chart().render(CERT_MODES[mode], name="ixg", namespace=NAMESPACE)
    assert first == second
    assert "BEGIN CERTIFICATE" not in "".join(first.values())


# --------------------------------------------------------------------------- webhook registration


def _webhooks(values: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    mwc = find(render(values), "MutatingWebhookConfiguration", MWC)
    return {w["name"]: w for w in mwc["webhooks"]}


def test_one_webhook_per_configured_workload_with_the_safe_registration_settings() -> None:
    hooks = _webhooks()
    assert list(hooks) == [POD_HOOK, TFJOB_HOOK, LEGACY_HOOK]  # config.workloads, in order
    for hook in hooks.values():
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["sideEffects"] == "None"
        assert hook["timeoutSeconds"] == 5
        assert hook["matchPolicy"] == "Equivalent"
        assert hook["reinvocationPolicy"] == "IfNeeded"
        assert hook["failurePolicy"] == "Fail"
        assert [c["name"] for c in hook["matchConditions"]] == ["requests-gpu"]
        assert hook["clientConfig"]["service"] == {
            "name": WEBHOOK,
            "namespace": NAMESPACE,
            "path": "/mutate",
            "port": 443,
        }
        assert "caBundle" not in hook["clientConfig"]  # self mode: the webhook patches it
        assert [(r["operations"], r["scope"]) for r in hook["rules"]] == [(["CREATE"], "Namespaced")]
    assert _rule(hooks[POD_HOOK]) == ([""], ["v1"], ["pods"])
    assert _rule(hooks[TFJOB_HOOK]) == (["kubeflow.org"], ["v1"], ["tfjobs"])
    assert _rule(hooks[LEGACY_HOOK]) == (["mlkube.io"], ["v1beta1"], ["tfjobs"])


def _rule(hook: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    (rule,) = hook["rules"]
    return rule["apiGroups"], rule["apiVersions"], rule["resources"]


def test_a_configured_crd_is_registered_with_its_group_version_and_resource() -> None:
    workloads = [
        {"apiVersion": "v1", "kind": "Pod", "templatePaths": ["."]},
        CRD_WORKLOAD,
        {"apiVersion": "ray.io/v1", "kind": "RayCluster", "templatePaths": ["spec.headGroupSpec.template"]},
        {"apiVersion": "example.com/v1", "kind": "Policy", "templatePaths": ["spec.template"]},
        {
            "apiVersion": "example.com/v2",
            "kind": "Policy",
            "templatePaths": ["spec.template"],
            "resource": "pols",
        },
        {"apiVersion": "batch.example.com/*", "kind": "*Job", "templatePaths": ["spec.template"]},
    ]
    hooks = _webhooks({"config": {"workloads": workloads}})
    assert {name: _rule(hook) for name, hook in hooks.items()} == {
        POD_HOOK: ([""], ["v1"], ["pods"]),
        "trainingjobs.v1alpha1.example.com.ix-gpu.io": (["example.com"], ["v1alpha1"], ["trainingjobs"]),
        "rayclusters.v1.ray.io.ix-gpu.io": (["ray.io"], ["v1"], ["rayclusters"]),
        "policies.v1.example.com.ix-gpu.io": (["example.com"], ["v1"], ["policies"]),
        "pols.v2.example.com.ix-gpu.io": (["example.com"], ["v2"], ["pols"]),
        "all.all.batch.example.com.ix-gpu.io": (["batch.example.com"], ["*"], ["*"]),
    }
    # The chart's guess of the plural is the core's (Workload.resource_name).
    for workload, hook in zip(workloads, hooks.values(), strict=True):
        assert _rule(hook)[2] == [Workload.model_validate(workload).resource_name()]
    assert [
        (w.api_version, w.kind) for w in _webhook_config({"config": {"workloads": workloads}}).workloads
    ] == [(w["apiVersion"], w["kind"]) for w in workloads]


def test_workloads_sharing_a_webhook_name_are_an_error() -> None:
    twice = [CRD_WORKLOAD, {**CRD_WORKLOAD, "kind": "Other", "resource": "trainingjobs"}]
    with pytest.raises(HelmError, match="set a distinct `resource`"):
        chart().render({"config": {"workloads": twice}}, name="ixg", namespace=NAMESPACE)
    with pytest.raises(HelmError, match=r"config\.workloads lists no workload"):
        chart().render({"config": {"workloads": []}}, name="ixg", namespace=NAMESPACE)


SYSTEM = ["kube-system", "kube-public", "kube-node-lease"]


def test_namespace_selector_excludes_system_release_and_opted_out_namespaces() -> None:
    values = {"config": {"policy": {"excludedNamespaces": ["batch"]}}}
    for hook in _webhooks(values).values():
        expressions = hook["namespaceSelector"]["matchExpressions"]
        assert expressions == [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": [*SYSTEM, NAMESPACE, "batch"],
            },
            {"key": "ix-gpu.io/inject", "operator": "NotIn", "values": ["disabled"]},
        ]
    # The webhook's own config excludes the same namespaces.
    assert list(_webhook_config(values).policy.excluded_namespaces) == [*SYSTEM, NAMESPACE, "batch"]


@pytest.mark.parametrize(
    ("namespace", "sent"),
    [
        ("team-a", False),
        ("team-", False),
        ("ml-1", False),
        ("ml-10", True),
        ("batch", False),
        ("teams", True),
    ],
)
def test_namespace_globs_become_cel_never_a_selector_value(namespace: str, sent: bool) -> None:
    # A label value cannot hold "*": the apiserver refuses a namespaceSelector value "team-*", so
    # globs go to a matchCondition on request.namespace, exact names stay in the selector.
    values = {"config": {"policy": {"excludedNamespaces": ["batch", "team-*", "ml-?"]}}}
    gpu_pod = pod("p", [container("c", limits={"iluvatar.com/gpu": "1"})])
    for hook in _webhooks(values).values():
        (names,) = [
            e for e in hook["namespaceSelector"]["matchExpressions"] if e["key"].startswith("kubernetes.io")
        ]
        assert names["values"] == [*SYSTEM, NAMESPACE, "batch"]
        if hook["name"] == POD_HOOK:
            assert _selects(hook["namespaceSelector"], {"kubernetes.io/metadata.name": namespace}) is (
                namespace != "batch"
            )
            assert (
                _selects(hook["namespaceSelector"], {"kubernetes.io/metadata.name": namespace})
                and _matches(hook, gpu_pod, namespace)
            ) is sent
    # The webhook itself still honours the globs (also where matchConditions are off).
    assert list(_webhook_config(values).policy.excluded_namespaces) == [
        *SYSTEM,
        NAMESPACE,
        "batch",
        "team-*",
        "ml-?",
    ]
    for hook in _webhooks(merge(values, {"webhook": {"matchConditions": False}})).values():
        assert "*" not in json.dumps(hook["namespaceSelector"])


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector as the apiserver evaluates it (matchLabels and the four operators)."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels[key] not in values,  # absent keys match NotIn
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]
        if not ok:
            return False
    return True


@pytest.mark.parametrize(
    ("labels", "sent"),
    [
        ({}, True),  # unlabelled objects still reach the webhook
        ({"app": "train"}, True),
        ({"ix-gpu.io/inject": "enabled"}, True),
        ({"ix-gpu.io/inject": "disabled"}, False),
    ],
)
def test_object_selector_skips_only_objects_labelled_inject_disabled(
    labels: dict[str, str], sent: bool
) -> None:
    for hook in _webhooks().values():
        assert hook["objectSelector"] == {
            "matchExpressions": [{"key": "ix-gpu.io/inject", "operator": "NotIn", "values": ["disabled"]}]
        }
        assert _selects(hook["objectSelector"], labels) is sent


def test_without_match_conditions_the_webhooks_fall_back_to_ignore() -> None:
    for hook in _webhooks({"webhook": {"matchConditions": False}}).values():
        assert hook["failurePolicy"] == "Ignore"
        assert "matchConditions" not in hook


def test_only_configured_workloads_are_registered() -> None:
    values = {"config": {"workloads": [{"apiVersion": "v1", "kind": "Pod", "templatePaths": ["."]}]}}
    assert list(_webhooks(values)) == [POD_HOOK]
    assert [w.kind for w in _webhook_config(values).workloads] == ["Pod"]


def test_cert_modes_wire_the_ca_bundle() -> None:
    provided = _webhooks(CERT_MODES["provided"])
    assert {h["clientConfig"]["caBundle"] for h in provided.values()} == {"Q0EgUEVN"}

    objects = render(CERT_MODES["certManager"])
    mwc = find(objects, "MutatingWebhookConfiguration", MWC)
    certificate = find(objects, "Certificate", WEBHOOK)
    issuer = find(objects, "Issuer", WEBHOOK)
    assert mwc["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/{WEBHOOK}"}
    assert certificate["metadata"]["namespace"] == NAMESPACE
    assert certificate["spec"]["dnsNames"][0] == f"{WEBHOOK}.{NAMESPACE}.svc"
    assert certificate["spec"]["issuerRef"] == {"name": WEBHOOK, "kind": "Issuer", "group": "cert-manager.io"}
    assert issuer["spec"] == {"selfSigned": {}}
    assert all("caBundle" not in h["clientConfig"] for h in mwc["webhooks"])
    deployment = find(objects, "Deployment", WEBHOOK)
    secret_volume = _volume(deployment, "certs")["secret"]
    assert secret_volume["secretName"] == certificate["spec"]["secretName"]

    external = render(
        merge(
            CERT_MODES["certManager"],
            {"certs": {"certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}},
        )
    )
    assert not [o for o in external if o["kind"] == "Issuer"]
    assert find(external, "Certificate")["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}


def test_self_mode_renders_no_secret_and_no_ca() -> None:
    objects = render()
    assert not [o for o in objects if o["kind"] == "Secret"]
    deployment = find(objects, "Deployment", WEBHOOK)
    assert "emptyDir" in _volume(deployment, "certs")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--self-certs-secret={NAMESPACE}/{WEBHOOK}-tls" in args
    assert f"--webhook-configuration={MWC}" in args
    assert f"--service-dns={WEBHOOK}.{NAMESPACE}.svc" in args


# --------------------------------------------------------------------------- CEL matchConditions


def _matches(hook: dict[str, Any], obj: dict[str, Any], namespace: str = "default") -> bool:
    # The apiserver sends the object when every condition is true; an evaluation error would apply
    # failurePolicy, so evaluation must not raise for any shape below.
    context = {"object": obj, "request": {"namespace": namespace}}
    return all(bool(cel.evaluate(c["expression"], context)) for c in hook["matchConditions"])


POD_CASES = [
    ("limits", pod("p", [container("c", limits={"iluvatar.com/gpu": "1"})]), True),
    ("requests only", pod("p", [container("c", requests={"nvidia.com/gpu": "2"})]), True),
    (
        "second container",
        pod("p", [container("c"), container("c", limits={"cpu": "1", "nvidia.com/gpu": "1"})]),
        True,
    ),
    (
        "initContainer",
        pod("p", [container("c")], init_containers=[container("c", limits={"iluvatar.com/gpu": "1"})]),
        True,
    ),
    ("no resources", pod("p", [container("c")]), False),
    (
        "cpu and memory",
        pod("p", [container("c", limits={"cpu": "1", "memory": "1Gi"}, requests={"cpu": "1"})]),
        False,
    ),
    ("empty resources", pod("p", [{"name": "c", "image": "x", "resources": {}}]), False),
    ("other vendor", pod("p", [container("c", limits={"amd.com/gpu": "1"})]), False),
    ("look-alike name", pod("p", [container("c", limits={"iluvatar.com/gpu-mem": "1"})]), False),
    (
        "init without gpu",
        pod("p", [container("c")], init_containers=[container("c", limits={"cpu": "1"})]),
        False,
    ),
    # DRA: a container that uses a claim is sent (the webhook learns the claim's device class).
    ("dra claim", pod("p", [container("c", claims=["gpu"])], resource_claims=[pod_claim("gpu")]), True),
    (
        "dra claim in an initContainer",
        pod(
            "p",
            [container("c")],
            init_containers=[container("i", claims=["g"])],
            resource_claims=[pod_claim("g")],
        ),
        True,
    ),
    ("claims used by no container", pod("p", [container("c")], resource_claims=[pod_claim("gpu")]), False),
    ("empty claims", pod("p", [container("c", claims=[])], resource_claims=[]), False),
    ("claims a map", pod("p", [{"name": "c", "resources": {"claims": {"name": "gpu"}}}]), False),
    ("claims a string", pod("p", [{"name": "c", "resources": {"claims": "gpu"}}]), False),
]


@pytest.mark.parametrize(("case", "pod", "expected"), POD_CASES, ids=[c[0] for c in POD_CASES])
def test_pod_match_condition(case: str, pod: dict[str, Any], expected: bool) -> None:
    assert _matches(_webhooks()[POD_HOOK], pod) is expected


TFJOB_CASES = [
    (
        "worker gpu",
        tfjob({"Worker": replica(container("c", limits={"nvidia.com/gpu": "1"}))}, name="t"),
        True,
    ),
    (
        "ps cpu, worker gpu",
        tfjob(
            {
                "PS": replica(container("c")),
                "worker": replica(container("c", limits={"iluvatar.com/gpu": "1"})),
            },
            name="t",
        ),
        True,
    ),
    (
        "cpu only",
        tfjob(
            {"PS": replica(container("c")), "Worker": replica(container("c", limits={"cpu": "1"}))}, name="t"
        ),
        False,
    ),
    ("no template", tfjob({"Worker": {"replicas": 1}}, name="t"), False),
    ("no spec", {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "t"}}, False),
    (
        "no replica specs",
        {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "spec": {"runPolicy": {}}},
        False,
    ),
]


@pytest.mark.parametrize(("case", "job", "expected"), TFJOB_CASES, ids=[c[0] for c in TFJOB_CASES])
def test_tfjob_match_condition(case: str, job: dict[str, Any], expected: bool) -> None:
    assert _matches(_webhooks()[TFJOB_HOOK], job) is expected


def _legacy(replica_specs: Any) -> dict[str, Any]:
    return {"apiVersion": "mlkube.io/v1beta1", "kind": "TfJob", "spec": {"replica_specs": replica_specs}}


GPU_TEMPLATE = {"spec": {"containers": [container("c", limits={"nvidia.com/gpu": "1"})]}}
CPU_TEMPLATE = {"spec": {"containers": [container("c", limits={"cpu": "1"})]}}
LEGACY_CASES = [
    ("seed tfjob", load_yaml(EXAMPLES / "seed-tfjob.yaml"), True),
    ("second replica", _legacy([{"template": CPU_TEMPLATE}, {"template": GPU_TEMPLATE}]), True),
    ("cpu only", _legacy([{"template": CPU_TEMPLATE}]), False),
    ("empty list", _legacy([]), False),
    # Shapes a CRD without a schema lets through: never an evaluation error (failurePolicy Fail).
    ("replica specs a map", _legacy({"MASTER": {"template": GPU_TEMPLATE}}), False),
    ("replica specs a string", _legacy("x"), False),
    ("replica not a map", _legacy(["x", 1, None]), False),
    ("template a list", _legacy([{"template": [GPU_TEMPLATE]}]), False),
    ("spec a string", _legacy([{"template": {"spec": "x"}}]), False),
    ("containers a map", _legacy([{"template": {"spec": {"containers": {"c": {}}}}}]), False),
    ("container a string", _legacy([{"template": {"spec": {"containers": ["c"]}}}]), False),
    (
        "limits a list",
        _legacy([{"template": {"spec": {"containers": [{"resources": {"limits": ["nvidia.com/gpu"]}}]}}}]),
        False,
    ),
    ("no spec", {"apiVersion": "mlkube.io/v1beta1", "kind": "TfJob"}, False),
]


@pytest.mark.parametrize(("case", "job", "expected"), LEGACY_CASES, ids=[c[0] for c in LEGACY_CASES])
def test_list_template_path_match_condition(case: str, job: dict[str, Any], expected: bool) -> None:
    """spec.replica_specs[*].template: the seed's legacy TfJob, a list of replicas."""
    assert _matches(_webhooks()[LEGACY_HOOK], job) is expected


def test_crd_match_condition_follows_nested_template_paths() -> None:
    values = {"config": {"workloads": [CRD_WORKLOAD]}}
    hook = _webhooks(values)["trainingjobs.v1alpha1.example.com.ix-gpu.io"]

    def job(roles: Any) -> dict[str, Any]:
        return {"apiVersion": "example.com/v1alpha1", "kind": "TrainingJob", "spec": {"roles": roles}}

    assert _matches(
        hook, job({"a": {"pods": [{"template": CPU_TEMPLATE}]}, "b": {"pods": [{"template": GPU_TEMPLATE}]}})
    )
    assert not _matches(hook, job({"a": {"pods": [{"template": CPU_TEMPLATE}]}}))
    assert not _matches(hook, job({"a": {"pods": {"template": GPU_TEMPLATE}}}))  # not a list
    assert not _matches(hook, job([{"pods": [{"template": GPU_TEMPLATE}]}]))  # not a map
    assert not _matches(hook, job({"a": "x"}))


def test_match_condition_follows_the_configured_profiles() -> None:
    profiles = [
        {"name": "iluvatar", "resources": ["iluvatar.com/*"]},
        {"name": "mig", "resources": ["nvidia.com/mig-?g.*gb"]},
    ]
    values = {"config": {"profiles": profiles}}
    hook = _webhooks(values)[POD_HOOK]
    config = _webhook_config(values)
    assert [p.name for p in config.profiles] == ["iluvatar", "mig"]
    for resource in [
        "iluvatar.com/gpu-bi150",
        "iluvatar.com/",
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-7g.80gb",
        "nvidia.com/mig-1gx10gb",
        "nvidia.com/mig-12g.10gb",
        "nvidiaxcom/mig-1g.10gb",
        "amd.com/gpu",
    ]:
        # The CEL pre-filter and the core agree on what a profile's globs match.
        expected = any(fnmatch.fnmatchcase(resource, g) for p in profiles for g in p["resources"])
        assert any(p.matches(resource) for p in config.profiles) is expected
        assert _matches(hook, pod("p", [container("c", limits={resource: "1"})])) is expected, resource


def test_dra_pods_are_sent_only_while_a_profile_maps_a_device_class() -> None:
    dra = pod("p", [container("c", claims=["gpu"])], resource_claims=[pod_claim("gpu")])
    without = {"config": {"profiles": [{"name": "iluvatar", "resources": ["iluvatar.com/gpu"]}]}}
    assert not _matches(_webhooks(without)[POD_HOOK], dra)
    assert _matches(_webhooks(without)[POD_HOOK], pod("p", [container("c", 1)]))
    worker = replica(container("tf", claims=["gpu"]))
    worker["template"]["spec"]["resourceClaims"] = [pod_claim("gpu")]
    assert _matches(
        _webhooks()[TFJOB_HOOK], tfjob({"Worker": worker, "PS": replica(container("c"))}, name="t")
    )


def test_no_profile_is_an_error() -> None:
    with pytest.raises(HelmError, match=r"config\.profiles lists no profile"):
        chart().render({"config": {"profiles": []}}, name="ixg", namespace=NAMESPACE)


# --------------------------------------------------------------------------- webhook workload


def _webhook_config(values: dict[str, Any] | None = None) -> Any:
    configmap = find(render(values), "ConfigMap", WEBHOOK)
    return parse_config(yaml.safe_load(configmap["data"]["config.yaml"]), "chart ConfigMap")


def test_webhook_configmap_is_the_built_in_default_plus_the_release_namespace() -> None:
    config = _webhook_config()
    default = default_config()
    assert config.profiles == default.profiles
    assert config.workloads == default.workloads
    assert config.policy == default.policy.model_copy(update={"excluded_namespaces": (*SYSTEM, NAMESPACE)})
    assert [(p.name, p.resources) for p in config.profiles] == [
        ("iluvatar", ("iluvatar.com/gpu",)),
        ("nvidia", ("nvidia.com/gpu",)),
    ]
    assert [v.host_path for v in config.profiles[0].volumes] == ["/usr/local/corex"]
    # NVIDIA: the container toolkit provides the driver; nothing from /usr/local/cuda.
    assert (config.profiles[1].volumes, config.profiles[1].env) == ((), ())


def test_webhook_configmap_carries_the_whole_config_value() -> None:
    """The seed's config, given as the `config` value, is what the webhook loads (plus the
    namespaces the chart always excludes): device nodes, env and privileged in its namespace."""
    values = _seed_values()
    config = _webhook_config(values)
    seed = parse_config(load_yaml(EXAMPLES / "seed-config.yaml"))
    assert config.profiles == seed.profiles
    assert config.profiles[0].device_nodes.inject is True
    assert config.policy.privileged_namespaces == ("ml-team",)
    assert config.policy.excluded_namespaces == (*SYSTEM, NAMESPACE)
    # Helm merged the seed's config over the default: the default workloads stay.
    assert config.workloads == default_config().workloads
    assert list(_webhooks(values)) == [POD_HOOK, TFJOB_HOOK, LEGACY_HOOK]
    hook = _webhooks(values)[LEGACY_HOOK]
    assert _matches(hook, load_yaml(EXAMPLES / "seed-tfjob.yaml"))
    assert not _matches(_webhooks(values)[POD_HOOK], pod("p", limits={"iluvatar.com/gpu": "1"}))


def test_rendering_does_not_change_the_values() -> None:
    values = {"config": {"policy": {"excludedNamespaces": ["batch"]}}}
    before = copy.deepcopy(values)
    render(values)
    assert values == before
    assert chart().values["config"]["policy"]["excludedNamespaces"] == SYSTEM


def _volume(workload: dict[str, Any], name: str) -> dict[str, Any]:
    volumes = workload["spec"]["template"]["spec"]["volumes"]
    return next(v for v in volumes if v["name"] == name)


def test_webhook_deployment_probes_its_plain_http_probe_port() -> None:
    """By default the kubelet probes ``--probe-port`` (8081) over HTTP, apart from the HTTPS port's
    connections; ``webhook.probePort: 0`` probes the HTTPS port as before (the next test)."""
    (container,) = find(render(), "Deployment", WEBHOOK)["spec"]["template"]["spec"]["containers"]
    assert "--probe-port=8081" in container["args"]
    assert {"name": "probes", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes", "scheme": "HTTP"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probes", "scheme": "HTTP"}


def test_webhook_deployment_is_hardened_and_probed_over_https() -> None:
    objects = render({"webhook": {"probePort": 0}})
    deployment = find(objects, "Deployment", WEBHOOK)
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert spec["replicas"] == 2
    assert pod["serviceAccountName"] == WEBHOOK
    # SIGTERM drains for 5 s; the grace period covers that and the reviews then in flight.
    assert "--shutdown-delay=5" in container["args"]
    assert pod["terminationGracePeriodSeconds"] == 25
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert set(container["resources"]) == {"requests", "limits"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["podAffinityTerm"]["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    pdb = find(objects, "PodDisruptionBudget", WEBHOOK)
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": spec["selector"]["matchLabels"]}}
    service = find(objects, "Service", WEBHOOK)
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "https"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["config"] + "/config.yaml" in [
        a.split("=", 1)[1] for a in container["args"] if a.startswith("--config=")
    ]
    assert _volume(deployment, "config")["configMap"]["name"] == WEBHOOK
    assert pod["nodeSelector"] == LINUX
    assert "hostNetwork" not in pod and "dnsPolicy" not in pod


def test_webhook_disruption_budget_never_blocks_a_drain() -> None:
    """A budget that keeps every replica up makes ``kubectl drain`` retry the eviction forever: with
    one replica no budget is rendered, and an integer minAvailable must be below replicas."""
    single = render({"webhook": {"replicas": 1}})
    assert [o for o in single if o["kind"] == "PodDisruptionBudget"] == []
    assert find(single, "Deployment", WEBHOOK)["spec"]["replicas"] == 1
    three = render({"webhook": {"replicas": 3, "podDisruptionBudget": {"minAvailable": 2}}})
    assert find(three, "PodDisruptionBudget", WEBHOOK)["spec"]["minAvailable"] == 2
    percent = render({"webhook": {"podDisruptionBudget": {"minAvailable": "50%"}}})
    assert find(percent, "PodDisruptionBudget", WEBHOOK)["spec"]["minAvailable"] == "50%"
    with pytest.raises(HelmError, match=r"minAvailable \(2\) must be less than webhook\.replicas \(2\)"):
        render({"webhook": {"podDisruptionBudget": {"minAvailable": 2}}})


def test_webhook_host_network_option() -> None:
    values = {"webhook": {"hostNetwork": True, "nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}}
    pod = find(render(values), "Deployment", WEBHOOK)["spec"]["template"]["spec"]
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert pod["nodeSelector"] == {**LINUX, "node-role.kubernetes.io/control-plane": ""}
    # Listening on all of the node's addresses (both IP families), on the port the Service targets.
    (container,) = pod["containers"]
    assert "--host=::" in container["args"]
    assert container["ports"][0]["containerPort"] == 8443
    # A surge pod needs the host port on a node of its own; with replicas >= eligible nodes it stays
    # Pending forever and the rollout never ends. So a host-network rollout replaces pods in place.
    assert find(render(values), "Deployment", WEBHOOK)["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    assert find(render(), "Deployment", WEBHOOK)["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 1,
        "maxUnavailable": 0,
    }


def test_external_name_service_for_local_tests() -> None:
    values = {
        "webhook": {"serviceType": "ExternalName", "serviceExternalName": "localhost", "servicePort": 18443}
    }
    objects = render(values)
    service = find(objects, "Service", WEBHOOK)
    assert service["spec"]["type"] == "ExternalName"
    assert service["spec"]["externalName"] == "localhost"
    assert "selector" not in service["spec"]
    assert service["spec"]["ports"][0]["port"] == 18443
    assert {h["clientConfig"]["service"]["port"] for h in _webhooks(values).values()} == {18443}


# --------------------------------------------------------------------------- RBAC


def _rules(objects: list[dict[str, Any]], kind: str, name: str) -> list[dict[str, Any]]:
    hits = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return hits[0]["rules"] if hits else []


DRA_CLAIMS_RULE = {
    "apiGroups": ["resource.k8s.io"],
    "resources": ["resourceclaims", "resourceclaimtemplates"],
    "verbs": ["list", "watch"],
}
"""The webhook learns DRA claims' device classes from a watch (no get: it never reads one by name)."""


def test_webhook_rbac_is_least_privilege_in_self_mode() -> None:
    objects = render()
    assert _rules(objects, "ClusterRole", WEBHOOK) == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
        DRA_CLAIMS_RULE,
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["mutatingwebhookconfigurations"],
            "resourceNames": [MWC],
            "verbs": ["get", "patch"],
        },
    ]
    assert _rules(objects, "Role", WEBHOOK) == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [f"{WEBHOOK}-tls"],
            "verbs": ["get", "update"],
        },
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]
    role = find(objects, "Role", WEBHOOK)
    assert role["metadata"]["namespace"] == NAMESPACE
    binding = find(objects, "RoleBinding", WEBHOOK)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": WEBHOOK, "namespace": NAMESPACE}]


@pytest.mark.parametrize("mode", ["certManager", "provided"])
def test_webhook_rbac_without_self_certs_only_reads_namespaces_and_claims(mode: str) -> None:
    objects = render(CERT_MODES[mode])
    assert _rules(objects, "ClusterRole", WEBHOOK) == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
        DRA_CLAIMS_RULE,
    ]
    assert not [o for o in objects if o["kind"] in ("Role", "RoleBinding")]


def test_plugin_labels_nodes_by_default_with_patch_on_nodes_only() -> None:
    labelled = render()
    assert _rules(labelled, "ClusterRole", PLUGIN) == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]},  # a merge patch reads nothing
    ]
    binding = find(labelled, "ClusterRoleBinding", PLUGIN)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": PLUGIN, "namespace": NAMESPACE}]
    assert find(labelled, "ServiceAccount", PLUGIN)["automountServiceAccountToken"] is True
    daemonset = find(labelled, "DaemonSet", PLUGIN)
    assert daemonset["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    configmap = find(labelled, "ConfigMap", "ix-config")
    assert parse_plugin_config(yaml.safe_load(configmap["data"]["ix-config"])).labels.enabled

    objects = render({"plugin": {"nodeLabels": False}})
    assert not [
        o
        for o in objects
        if o["kind"] in ("ClusterRole", "ClusterRoleBinding") and o["metadata"]["name"] == PLUGIN
    ]
    assert find(objects, "ServiceAccount", PLUGIN)["automountServiceAccountToken"] is False
    configmap = find(objects, "ConfigMap", "ix-config")
    assert not parse_plugin_config(yaml.safe_load(configmap["data"]["ix-config"])).labels.enabled


def test_the_node_policy_lets_only_the_plugins_own_managed_fields_entry_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node policy keeps every other manager's managedFields entry as it was, and lets the one
    of the manager the plugin writes as change: the name the apiserver gives a request without a
    fieldManager, its User-Agent up to the first ``/`` (the real apiserver enforces it in
    tests/chart/test_chart_install.py)."""
    from ix_gpu.kube import apiserver

    monkeypatch.setattr(apiserver, "USER_AGENT", apiserver.USER_AGENT)
    apiserver.identify("plugin")  # what `ix-gpu plugin` calls first
    policy = find(render(), "ValidatingAdmissionPolicy", f"{PLUGIN}-nodes")["spec"]
    variables = {v["name"]: v["expression"] for v in policy["variables"]}
    assert json.loads(variables["manager"]) == apiserver.USER_AGENT.split("/")[0] == "ix-gpu-plugin"
    expressions = [v["expression"] for v in policy["validations"]]
    others = [e for e in expressions if "!= variables.manager" in e]
    assert len(others) == 1 and "variables.oldManaged" in others[0]
    (own,) = [e for e in expressions if e.startswith("variables.own ==")]
    assert "size(variables.own) <= 1" in own and "in variables.published" in own


# --------------------------------------------------------------------------- device plugin


SEED_IX_CONFIG = "flags:\n  splitboard: false\nsharing:\n  timeSlicing:\n    replicas: 4"


def test_ix_config_is_the_vendor_format_verbatim() -> None:
    values = {"plugin": {"nodeLabels": False, "config": {"sharing": {"timeSlicing": {"replicas": 4}}}}}
    configmap = find(render(values), "ConfigMap", "ix-config")
    assert configmap["metadata"]["namespace"] == NAMESPACE
    assert configmap["data"] == {"ix-config": SEED_IX_CONFIG}
    config = parse_plugin_config(yaml.safe_load(configmap["data"]["ix-config"]))
    assert (config.flags.splitboard, config.replicas) == (False, 4)
    # Node labels (on by default) add our own section after the vendor's keys.
    labelled = find(render(merge(values, {"plugin": {"nodeLabels": True}})), "ConfigMap", "ix-config")
    assert labelled["data"] == {"ix-config": SEED_IX_CONFIG + "\nlabels:\n  enabled: true"}
    split = find(render({"plugin": {"config": {"flags": {"splitboard": True}}}}), "ConfigMap", "ix-config")
    assert yaml.safe_load(split["data"]["ix-config"]) == {
        "flags": {"splitboard": True},
        "sharing": {"timeSlicing": {"replicas": 1}},
        "labels": {"enabled": True},
    }


def test_the_cdi_strategy_writes_the_spec_where_the_daemonset_mounts_the_runtimes_directory() -> None:
    """``plugin.deviceListStrategy: cdi`` puts the strategy, the spec directory and the driver root
    into ix-config, and that directory is the hostPath the DaemonSet mounts read-write."""
    values = {"plugin": {"deviceListStrategy": "cdi", "cdiDir": "/etc/cdi", "driver": {"root": "/opt/corex"}}}
    rendered = render(values)
    configmap = find(rendered, "ConfigMap", "ix-config")
    config = parse_plugin_config(yaml.safe_load(configmap["data"]["ix-config"]))
    assert config.device_list_strategy.value == "cdi"
    assert (config.cdi.spec_dir, config.cdi.driver_root) == ("/etc/cdi", "/opt/corex")
    pod = find(rendered, "DaemonSet", PLUGIN)["spec"]["template"]["spec"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "cdi"]
    assert mount["mountPath"] == "/etc/cdi" and not mount.get("readOnly")
    assert _volume(find(rendered, "DaemonSet", PLUGIN), "cdi")["hostPath"]["path"] == "/etc/cdi"
    # The default stays envvar, and says nothing of CDI in ix-config.
    plain = yaml.safe_load(find(render({}), "ConfigMap", "ix-config")["data"]["ix-config"])
    assert "deviceListStrategy" not in plain and "cdi" not in plain
    with pytest.raises(HelmError, match="deviceListStrategy"):
        render({"plugin": {"deviceListStrategy": "cdi-cri"}})


def test_plugin_daemonset_has_the_seeds_mounts_and_real_probes() -> None:
    values = {"plugin": {"nodeSelector": {"ix-gpu.io/gpu": "true"}}}
    daemonset = find(render(values), "DaemonSet", PLUGIN)
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {**LINUX, "ix-gpu.io/gpu": "true"}
    assert {"key": "iluvatar.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert container["securityContext"]["privileged"] is True
    assert container["securityContext"]["runAsUser"] == 0  # the image's default user is 10001
    mounts = {m["mountPath"]: (m["name"], m.get("readOnly", False)) for m in container["volumeMounts"]}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert {path: host_paths[name] for path, (name, _) in mounts.items() if name in host_paths} == {
        "/var/lib/kubelet/device-plugins": "/var/lib/kubelet/device-plugins",
        "/dev": "/dev",
        "/sys": "/sys",
        "/run/udev": "/run/udev",
        "/usr/local/corex": "/usr/local/corex",
        "/var/run/cdi": "/var/run/cdi",  # where deviceListStrategy: cdi writes the spec
        "/var/lib/kubelet/pod-resources": "/var/lib/kubelet/pod-resources",  # chips' holders
    }
    assert mounts["/sys"][1] and mounts["/run/udev"][1] and not mounts["/dev"][1]
    assert not mounts["/var/run/cdi"][1] and mounts["/var/lib/kubelet/pod-resources"][1]
    assert "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock" in container["args"]
    assert "--telemetry-interval=10" in container["args"]
    assert mounts["/ixconfig"][0] == "ix-config"
    assert _volume(daemonset, "ix-config")["configMap"] == {"name": "ix-config"}
    assert f"--config={PLUGIN_CONFIG_PATH}" in container["args"]
    for probe in ("startupProbe", "livenessProbe"):
        assert "exec" not in container[probe]
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    (port,) = container["ports"]
    assert f"--metrics-port={port['containerPort']}" in container["args"]
    assert container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_plugin_mounts_the_driver_root_read_only_and_puts_its_libraries_on_the_loader_path() -> None:
    """The ixml backend loads libixml.so (nvml: libnvidia-ml.so.1) from the node's driver; the
    image has neither. The default root is the built-in Iluvatar profile's driver root."""
    iluvatar = next(p for p in default_config().profiles if p.name == "iluvatar")
    (driver_volume,) = iluvatar.volumes

    def plugin(values: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        daemonset = find(render(values), "DaemonSet", PLUGIN)
        (container,) = daemonset["spec"]["template"]["spec"]["containers"]
        return daemonset, container

    daemonset, container = plugin()
    assert _volume(daemonset, "driver")["hostPath"] == {
        "path": driver_volume.host_path,
        "type": "DirectoryOrCreate",  # nodes without this driver still run the plugin
    }
    assert {"name": "driver", "mountPath": driver_volume.host_path, "readOnly": True} in container[
        "volumeMounts"
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LD_LIBRARY_PATH"] == "/usr/local/corex/lib64"
    assert env["LD_LIBRARY_PATH"] == iluvatar.env[0].value  # the lib dir the webhook injects too

    daemonset, container = plugin(
        {
            "plugin": {
                "driver": {
                    "root": "/run/nvidia/driver",
                    "libraryDirs": ["usr/lib64", "usr/lib/x86_64-linux-gnu/"],
                }
            }
        }
    )
    assert _volume(daemonset, "driver")["hostPath"]["path"] == "/run/nvidia/driver"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (
        env["LD_LIBRARY_PATH"] == "/run/nvidia/driver/usr/lib64:/run/nvidia/driver/usr/lib/x86_64-linux-gnu"
    )

    daemonset, container = plugin({"plugin": {"driver": {"root": ""}}})
    assert "driver" not in {v["name"] for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert "driver" not in {m["name"] for m in container["volumeMounts"]}
    assert "LD_LIBRARY_PATH" not in {e["name"] for e in container["env"]}


def test_components_can_be_disabled() -> None:
    only_plugin = render({"webhook": {"enabled": False}})
    assert {o["metadata"].get("labels", {}).get("app.kubernetes.io/component") for o in only_plugin} == {
        "device-plugin",
        "metrics",
    }
    assert [p["name"] for p in find(only_plugin, "Service", METRICS)["spec"]["ports"]] == ["plugin-metrics"]
    only_webhook = render({"plugin": {"enabled": False}})
    assert "DaemonSet" not in kinds(only_webhook)
    assert not [o for o in only_webhook if o["metadata"]["name"] == "ix-config"]
    assert [p["name"] for p in find(only_webhook, "Service", METRICS)["spec"]["ports"]] == ["webhook-metrics"]
    assert not [
        o
        for o in render({"webhook": {"enabled": False}, "plugin": {"enabled": False}})
        if o["kind"] == "Service"
    ]


def test_both_workloads_run_on_linux_nodes_by_default() -> None:
    objects = render()
    for kind, name in (("Deployment", WEBHOOK), ("DaemonSet", PLUGIN)):
        assert find(objects, kind, name)["spec"]["template"]["spec"]["nodeSelector"] == LINUX


# --------------------------------------------------------------------------- metrics


def test_metrics_service_reaches_both_components_metrics_ports() -> None:
    objects = render()
    service = find(objects, "Service", METRICS)
    assert service["spec"]["clusterIP"] == "None"  # one target per pod, not a balanced address
    assert service["metadata"]["labels"]["app.kubernetes.io/component"] == "metrics"
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert set(ports) == {"webhook-metrics", "plugin-metrics"}
    for kind, name, port in (
        ("Deployment", WEBHOOK, "webhook-metrics"),
        ("DaemonSet", PLUGIN, "plugin-metrics"),
    ):
        template = find(objects, kind, name)["spec"]["template"]
        # The Service selects this workload's pods, and its target port is a port they name.
        assert _selects({"matchLabels": service["spec"]["selector"]}, template["metadata"]["labels"])
        (container,) = template["spec"]["containers"]
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert named[ports[port]["targetPort"]] == ports[port]["port"]
    assert ports["plugin-metrics"]["port"] == 9401
    assert ports["webhook-metrics"]["port"] == 8443
    assert "ServiceMonitor" not in kinds(objects)  # off by default
    assert "Service" not in [
        o["kind"]
        for o in render({"metrics": {"service": {"enabled": False}}})
        if o["metadata"]["name"] == METRICS
    ]


@pytest.mark.parametrize(
    ("mode", "ca_key"), [("self", "ca-bundle.crt"), ("certManager", "ca.crt"), ("provided", "ca.crt")]
)
def test_service_monitor_scrapes_the_webhook_over_verified_tls_and_the_plugin(mode: str, ca_key: str) -> None:
    values = merge(
        CERT_MODES[mode], {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}}
    )
    objects = render(values)
    monitor = find(objects, "ServiceMonitor", METRICS)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    service = find(objects, "Service", METRICS)
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert _selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    assert not _selects(monitor["spec"]["selector"], find(objects, "Service", WEBHOOK)["metadata"]["labels"])
    webhook, plugin = monitor["spec"]["endpoints"]
    assert (webhook["port"], webhook["scheme"], webhook["path"]) == ("webhook-metrics", "https", "/metrics")
    secret = find(objects, "Deployment", WEBHOOK)["spec"]["template"]["spec"]
    assert webhook["tlsConfig"] == {
        "serverName": f"{WEBHOOK}.{NAMESPACE}.svc",
        "ca": {
            "secret": {
                "name": {"self": f"{WEBHOOK}-tls", "certManager": f"{WEBHOOK}-tls", "provided": "my-tls"}[
                    mode
                ],
                "key": ca_key,
            }
        },
    }
    assert secret  # the Deployment exists in every mode
    assert (plugin["port"], plugin["scheme"], plugin["path"]) == ("plugin-metrics", "http", "/metrics")
    # Each holder's pod/namespace/container are the plugin's series' own, not the scraped pod's.
    assert plugin["honorLabels"] is True and "honorLabels" not in webhook
    node = {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
    assert plugin["relabelings"] == [{"action": "labeldrop", "regex": "pod|container"}, node]
    custom = render(
        merge(values, {"metrics": {"serviceMonitor": {"webhookTlsConfig": {"insecureSkipVerify": True}}}})
    )
    assert find(custom, "ServiceMonitor", METRICS)["spec"]["endpoints"][0]["tlsConfig"] == {
        "insecureSkipVerify": True
    }
    with pytest.raises(HelmError, match=r"needs metrics\.service\.enabled"):
        chart().render(
            merge(values, {"metrics": {"service": {"enabled": False}}}), name="ixg", namespace=NAMESPACE
        )


# --------------------------------------------------------------------------- names and NOTES


def test_object_names_are_release_scoped_and_labelled() -> None:
    other = render(release="second")
    names = {(o["kind"], o["metadata"]["name"]) for o in other}
    assert ("MutatingWebhookConfiguration", "second-ix-gpu") in names
    assert ("Deployment", "second-ix-gpu-webhook") in names
    for obj in other:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "second"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def test_notes_explain_how_to_check_the_install() -> None:
    text = notes()
    assert "ix-gpu mutate" in text
    assert "ix-gpu.io/inject=disabled" in text
    assert f"deployment/{WEBHOOK}" in text
    assert "Registered for: Pod (v1), TFJob (kubeflow.org/v1), TfJob (mlkube.io/v1beta1)." in text
    assert "ix-gpu.io/gpu-type" in text and "gpu\\.product" in text


def test_readme_values_table_covers_every_value() -> None:
    readme = (CHART / "README.md").read_text()
    leaves: list[str] = []

    def walk(prefix: str, node: Any) -> None:
        # Maps of the user's own keys (resources, node selectors) are one value each.
        if isinstance(node, dict) and node and not prefix.endswith((".resources", ".nodeSelector")):
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else key, value)
        else:
            leaves.append(prefix)

    walk("", copy.deepcopy(chart().values))
    missing = [leaf for leaf in leaves if f"`{leaf}`" not in readme]
    assert not missing, f"README.md values table lacks {missing}"


def test_files_render_without_leftover_template_markers() -> None:
    for path, text in render_files().items():
        assert "{{" not in text and "<no value>" not in text, path
    assert base64.b64decode("Q0EgUEVN") == b"CA PEM"


def test_service_links_are_off_so_no_ix_gpu_env_is_injected() -> None:
    """Flags may come from IX_GPU_* env vars; a Service named ix-gpu or ix-gpu-metrics would
    otherwise inject IX_GPU_PORT / IX_GPU_METRICS_PORT (tcp:// URLs) and the processes would
    refuse them as ports."""
    objects = render()
    for kind, name in (("Deployment", WEBHOOK), ("DaemonSet", PLUGIN)):
        assert find(objects, kind, name)["spec"]["template"]["spec"]["enableServiceLinks"] is False


def test_helm_test_hook_dry_runs_a_gpu_pod_with_only_the_right_to_create_pods() -> None:
    objects = render({"tests": {"namespace": "gpu-team", "resource": "nvidia.com/gpu"}}, hooks=True)
    assert "Pod" not in kinds(render())  # helm install creates none of them; helm test does
    check = find(objects, "Pod", "ixg-ix-gpu-check")
    assert check["metadata"]["annotations"]["helm.sh/hook"] == "test"
    container = check["spec"]["containers"][0]
    assert container["args"] == ["check-injection", "--namespace=gpu-team", "--resource=nvidia.com/gpu"]
    assert check["spec"]["serviceAccountName"] == "ixg-ix-gpu-check"
    role = find(objects, "Role", "ixg-ix-gpu-check")
    assert role["metadata"]["namespace"] == "gpu-team"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]
    binding = find(objects, "RoleBinding", "ixg-ix-gpu-check")
    assert binding["metadata"]["namespace"] == "gpu-team"
    assert binding["subjects"][0]["name"] == "ixg-ix-gpu-check"
    assert "Pod" not in kinds(render({"tests": {"enabled": False}}, hooks=True))


def test_per_node_configs_mount_a_directory_and_may_watch_the_node() -> None:
    shared = {"sharing": {"timeSlicing": {"replicas": 4}}}
    objects = render({"plugin": {"nodeConfigs": {"shared4": shared}, "nodeLabels": False}})
    configmap = find(objects, "ConfigMap", "ix-config")
    assert set(configmap["data"]) == {"ix-config", "shared4"}
    assert yaml.safe_load(configmap["data"]["shared4"]) == shared
    args = find(objects, "DaemonSet", PLUGIN)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--config=/ixconfig" in args and "--default-config=ix-config" in args
    role = find(objects, "ClusterRole", PLUGIN)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]
    assert find(objects, "ServiceAccount", PLUGIN)["automountServiceAccountToken"] is True
    # The pod's own setting wins over the ServiceAccount's: without a token the plugin cannot read
    # its node's config label, and every node silently gets the default config.
    pod_spec = find(objects, "DaemonSet", PLUGIN)["spec"]["template"]["spec"]
    assert pod_spec["automountServiceAccountToken"] is True
    # Without named configs: the one file, and no right to read nodes.
    plain = render()
    assert (
        "--config=/ixconfig/ix-config"
        in find(plain, "DaemonSet", PLUGIN)["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert find(plain, "ClusterRole", PLUGIN)["rules"][0]["verbs"] == ["patch"]
    # Neither labels nor per-node configs: no token anywhere.
    bare = render({"plugin": {"nodeLabels": False}})
    assert (
        find(bare, "DaemonSet", PLUGIN)["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    )
    assert find(bare, "ServiceAccount", PLUGIN)["automountServiceAccountToken"] is False
    with pytest.raises(HelmError):
        render({"plugin": {"nodeConfigs": {"ix-config": shared}}})


def test_named_configs_keep_the_node_labels_on_unless_they_say_otherwise() -> None:
    """A node labelled for a named config must go on maintaining its count and replica labels, as
    on ix-config; a named config that sets ``labels`` itself keeps its choice."""
    shared = {"sharing": {"timeSlicing": {"replicas": 4}}}
    quiet = {"flags": {"splitboard": True}, "labels": {"enabled": False}}
    data = find(
        render({"plugin": {"nodeConfigs": {"shared4": shared, "quiet": quiet}}}), "ConfigMap", "ix-config"
    )["data"]
    assert yaml.safe_load(data["ix-config"])["labels"] == {"enabled": True}
    assert yaml.safe_load(data["shared4"]) == {**shared, "labels": {"enabled": True}}
    assert yaml.safe_load(data["quiet"]) == quiet
    assert parse_plugin_config(yaml.safe_load(data["shared4"])).labels.enabled
    assert not parse_plugin_config(yaml.safe_load(data["quiet"])).labels.enabled
    off = find(
        render({"plugin": {"nodeConfigs": {"shared4": shared}, "nodeLabels": False}}),
        "ConfigMap",
        "ix-config",
    )
    assert "labels" not in yaml.safe_load(off["data"]["shared4"])


def test_privileged_node_agents_claim_no_dropped_capabilities() -> None:
    """``capabilities.drop`` beside ``privileged: true`` does nothing and reads as a hardening that
    is not there."""
    objects = render({"dra": {"enabled": True}})
    daemonsets = [o for o in objects if o["kind"] == "DaemonSet"]
    assert len(daemonsets) == 2
    for daemonset in daemonsets:
        name = daemonset["metadata"]["name"]
        for agent in daemonset["spec"]["template"]["spec"]["containers"]:
            context = agent["securityContext"]
            assert context["privileged"] is True and "capabilities" not in context, (name, context)


def test_extra_env_reaches_every_container_after_its_own_env() -> None:
    extra = [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "10.1.2.3"},
        {"name": "IX_GPU_LOG_LEVEL", "valueFrom": {"configMapKeyRef": {"name": "levels", "key": "plugin"}}},
    ]
    objects = render({"webhook": {"extraEnv": extra[:1]}, "plugin": {"extraEnv": extra[1:]}})
    webhook = find(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert webhook["env"] == extra[:1]
    plugin = find(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert plugin["env"][0]["name"] == "NODE_NAME" and plugin["env"][-1] == extra[1]
    assert "env" not in find(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    test_pod = find(render({"tests": {"extraEnv": extra[:1]}}, hooks=True), "Pod")
    assert test_pod["spec"]["containers"][0]["env"] == extra[:1]
    with pytest.raises(HelmError, match="name"):
        render({"webhook": {"extraEnv": [{"value": "no name"}]}})


def test_uninstall_hook_prunes_the_plugins_node_labels_with_only_list_and_patch_on_nodes() -> None:
    objects = render(hooks=True)
    name = "ixg-ix-gpu-plugin-prune"
    assert "Job" not in kinds(render())  # not part of the install
    job = find(objects, "Job", name)
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-delete"
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"):
        obj = find(objects, kind, name)
        assert (
            obj["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
            == "before-hook-creation,hook-succeeded"
        )
        validate(obj, version=KUBE_VERSIONS[-1])
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"] == ["labels", "prune"]
    assert pod["serviceAccountName"] == name and pod["restartPolicy"] == "Never"
    assert find(objects, "ClusterRole", name)["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]}
    ]
    # No labels published, nothing to prune: no hook.
    for values in ({"plugin": {"nodeLabels": False}}, {"plugin": {"pruneLabelsOnUninstall": False}}):
        assert "Job" not in kinds(render(values, hooks=True))


def _library_path_modes(values: dict[str, Any]) -> list[str]:
    config = yaml.safe_load(find(render(values), "ConfigMap", WEBHOOK)["data"]["config.yaml"])
    return [v["mode"] for p in config["profiles"] for v in p["env"] if v["name"] == "LD_LIBRARY_PATH"]


@pytest.mark.parametrize(
    ("values", "kept", "in_claims"),
    [
        # The device plugin's envvar strategy: the variable is the only way for its pods; a
        # container served only through DRA claims still keeps its image's (the core's default).
        ({}, False, True),
        ({"dra": {"enabled": True}}, False, True),
        ({"plugin": {"deviceListStrategy": "cdi"}}, True, True),
        ({"plugin": {"enabled": False}, "dra": {"enabled": True}}, True, True),
        ({"plugin": {"deviceListStrategy": "cdi"}, "webhook": {"keepImageLibraryPath": False}}, False, False),
        ({"dra": {"enabled": True}, "webhook": {"keepImageLibraryPath": False}}, False, False),
        ({"webhook": {"keepImageLibraryPath": True}}, True, True),
    ],
)
def test_keep_image_library_path_turns_the_path_modes_into_their_if_set_forms(
    values: dict[str, Any], kept: bool, in_claims: bool
) -> None:
    modes = _library_path_modes(values)
    assert modes == (["prepend-path-if-set"] if kept else ["prepend-path"]), modes
    # Per container, for those served only through claims: left to the core's default (true, not
    # written, so the config's digest is the one a release without it had), false only with false.
    rendered = yaml.safe_load(find(render(values), "ConfigMap", WEBHOOK)["data"]["config.yaml"])
    assert rendered["policy"].get("keepImageLibraryPathInClaims", True) is in_claims
    assert ("keepImageLibraryPathInClaims" in rendered["policy"]) is not in_claims
    # The webhook loads what the chart renders (the core's own schema accepts the if-set modes).
    config = find(render(values), "ConfigMap", WEBHOOK)["data"]["config.yaml"]
    parse_config(yaml.safe_load(config), "rendered")


def test_the_webhook_turns_not_ready_past_cache_max_staleness() -> None:
    args = find(render({"webhook": {"cacheMaxStalenessSeconds": 90}}), "Deployment", WEBHOOK)["spec"][
        "template"
    ]["spec"]["containers"][0]["args"]
    assert "--cache-max-staleness=90" in args
    default = find(render(), "Deployment", WEBHOOK)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--cache-max-staleness=300" in default


@pytest.mark.parametrize(
    ("values", "budget"), [({}, "3"), ({"timeoutSeconds": 7}, "3"), ({"timeoutSeconds": 2}, "1")]
)
def test_the_namespace_lookup_budget_stays_below_the_apiservers_wait(
    values: dict[str, Any], budget: str
) -> None:
    """A change of timeoutSeconds alone leaves the Deployment as it was (no rollout), unless the
    budget would reach it."""
    args = find(render({"webhook": values}), "Deployment", WEBHOOK)["spec"]["template"]["spec"]["containers"][
        0
    ]["args"]
    assert f"--namespace-lookup-budget={budget}" in args


def test_reset_gpu_renders_into_the_ix_config_with_its_bound() -> None:
    def ix_config(values: dict[str, Any]) -> Any:
        configmap = find(render(values), "ConfigMap", "ix-config")
        return parse_plugin_config(yaml.safe_load(configmap["data"]["ix-config"])).runtime()

    assert ix_config({}).reset_gpu is False
    on = ix_config({"plugin": {"config": {"flags": {"reset_gpu": True}, "gpuReset": {"timeoutSeconds": 30}}}})
    assert (on.reset_gpu, on.reset_timeout_seconds) == (True, 30)
    # The reset's tool is in the driver's bin: both agents are told where the driver root is.
    objects = render({"plugin": {"driver": {"root": "/opt/corex"}}, "dra": {"enabled": True}})
    daemonsets = [o for o in objects if o["kind"] == "DaemonSet"]
    assert len(daemonsets) == 2  # the device plugin's and the DRA plugin's
    for daemonset in daemonsets:
        container = daemonset["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["COREX_HOME"] == "/opt/corex", daemonset["metadata"]["name"]
