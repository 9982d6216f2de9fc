"""charts/ix-gpu: helm lint and render for the default values and each certificate mode; every
object checked against the Kubernetes 1.30 and 1.35 schemas; the values schema rejects typos; the
rendered webhook and plugin configs load with the project's own config schemas."""

from __future__ import annotations

import base64
import copy
from typing import Any

import cel
import pytest
import yaml

from ix_gpu.devicemodel.plugin_config import DEFAULT_PATH as PLUGIN_CONFIG_PATH
from ix_gpu.devicemodel.plugin_config import parse_plugin_config
from ix_gpu.devicemodel.webhook_config import parse_config
from tests.chart.rendering import (
    CERT_MODES,
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
from tests.support.objects import container, pod, replica, tfjob

WEBHOOK = "ixg-ix-gpu-webhook"
PLUGIN = "ixg-ix-gpu-plugin"
MWC = "ixg-ix-gpu"
CERT_MANAGER_KINDS = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}


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
        if (obj["apiVersion"], obj["kind"]) in CERT_MANAGER_KINDS:
            continue  # a CRD: not in the Kubernetes schemas; its fields are asserted below
        validate(obj, version=kube_version)
    common = [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "ConfigMap",
        "DaemonSet",
        "Deployment",
        "MutatingWebhookConfiguration",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
        "ServiceAccount",
    ]
    extra = {"self": ["Role", "RoleBinding"], "certManager": ["Certificate", "Issuer"], "provided": []}[mode]
    assert kinds(objects) == sorted(common + extra)


def test_every_option_turned_on_still_validates() -> None:
    values = {
        "webhook": {
            "matchConditions": False,
            "tfjobs": False,
            "excludedNamespaces": ["batch"],
            "privilegedNamespaces": ["ml"],
            "podDisruptionBudget": {"enabled": False},
            "nodeSelector": {"role": "infra"},
            "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "system-cluster-critical",
            "podAnnotations": {"a": "b"},
        },
        "plugin": {
            "nodeLabels": True,
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
        "image": {"digest": "sha256:" + "a" * 64},
        "imagePullSecrets": [{"name": "regcred"}],
        "commonLabels": {"team": "gpu"},
    }
    assert not lint(values)["errors"]
    for obj in render(values):
        for version in KUBE_VERSIONS:
            validate(obj, version=version)


@pytest.mark.parametrize(
    "values",
    [
        {"webhok": {}},
        {"webhook": {"replcas": 3}},
        {"plugin": {"config": {"flags": {"splitBoard": True}}}},
        {"plugin": {"config": {"sharing": {"timeslicing": {"replicas": 2}}}}},
        {"certs": {"mode": "Self"}},
        {"certs": {"self": {"secret": "x"}}},
        {"profiles": {"iluvatar": {"resource": ["iluvatar.com/gpu"]}}},
        {"webhook": {"timeoutSeconds": 31}},
        {"plugin": {"config": {"sharing": {"timeSlicing": {"replicas": 0}}}}},
    ],
    ids=lambda v: str(v)[:60],
)
def test_values_schema_rejects_typos_and_bad_values(values: dict[str, Any]) -> None:
    with pytest.raises(HelmError, match=r"schema|additional properties|minimum|maximum"):
        chart().render(values, name="ixg", namespace=NAMESPACE)


def test_values_schema_accepts_the_defaults_and_documented_examples() -> None:
    chart().validate_schema(chart().values)
    chart().validate_schema({"profiles": {"iluvatar": {"resources": ["iluvatar.com/*"]}}})


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


def test_two_webhooks_with_the_safe_registration_settings() -> None:
    hooks = _webhooks()
    assert sorted(hooks) == ["pods.ix-gpu.io", "tfjobs.ix-gpu.io"]
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
        assert [r["operations"] for r in hook["rules"]] == [["CREATE"]]
    assert hooks["pods.ix-gpu.io"]["rules"][0]["resources"] == ["pods"]
    tfjob_rule = hooks["tfjobs.ix-gpu.io"]["rules"][0]
    assert (tfjob_rule["apiGroups"], tfjob_rule["apiVersions"], tfjob_rule["resources"]) == (
        ["kubeflow.org"],
        ["v1"],
        ["tfjobs"],
    )


def test_namespace_selector_excludes_system_release_and_opted_out_namespaces() -> None:
    for hook in _webhooks({"webhook": {"excludedNamespaces": ["batch"]}}).values():
        expressions = hook["namespaceSelector"]["matchExpressions"]
        assert expressions == [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", "kube-public", "kube-node-lease", NAMESPACE, "batch"],
            },
            {"key": "ix-gpu.io/inject", "operator": "NotIn", "values": ["disabled"]},
        ]


def test_without_match_conditions_the_webhooks_fall_back_to_ignore() -> None:
    for hook in _webhooks({"webhook": {"matchConditions": False}}).values():
        assert hook["failurePolicy"] == "Ignore"
        assert "matchConditions" not in hook


def test_tfjob_webhook_can_be_turned_off() -> None:
    assert sorted(_webhooks({"webhook": {"tfjobs": False}})) == ["pods.ix-gpu.io"]
    config = _webhook_config({"webhook": {"tfjobs": False}})
    assert [w.kind for w in config.workloads] == ["Pod"]


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


def _matches(hook: dict[str, Any], obj: dict[str, Any]) -> bool:
    # The apiserver sends the object when every condition is true; an evaluation error would apply
    # failurePolicy, so evaluation must not raise for any shape below.
    return all(bool(cel.evaluate(c["expression"], {"object": obj})) for c in hook["matchConditions"])


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
]


@pytest.mark.parametrize(("case", "pod", "expected"), POD_CASES, ids=[c[0] for c in POD_CASES])
def test_pod_match_condition(case: str, pod: dict[str, Any], expected: bool) -> None:
    assert _matches(_webhooks()["pods.ix-gpu.io"], pod) is expected


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
    assert _matches(_webhooks()["tfjobs.ix-gpu.io"], job) is expected


def test_match_condition_follows_the_configured_profiles() -> None:
    values = {"profiles": {"nvidia": {"enabled": False}, "iluvatar": {"resources": ["iluvatar.com/*"]}}}
    hook = _webhooks(values)["pods.ix-gpu.io"]
    assert _matches(hook, pod("p", [container("c", limits={"iluvatar.com/gpu-bi150": "1"})]))
    assert not _matches(hook, pod("p", [container("c", limits={"nvidia.com/gpu": "1"})]))
    config = _webhook_config(values)
    assert [p.name for p in config.profiles] == ["iluvatar"]
    assert config.profiles[0].matches("iluvatar.com/gpu-bi150")


def test_no_enabled_profile_is_an_error() -> None:
    values = {"profiles": {"nvidia": {"enabled": False}, "iluvatar": {"enabled": False}}}
    with pytest.raises(HelmError, match="at least one profile"):
        chart().render(values, name="ixg", namespace=NAMESPACE)


# --------------------------------------------------------------------------- webhook workload


def _webhook_config(values: dict[str, Any] | None = None) -> Any:
    configmap = find(render(values), "ConfigMap", WEBHOOK)
    return parse_config(yaml.safe_load(configmap["data"]["config.yaml"]), "chart ConfigMap")


def test_webhook_configmap_is_a_valid_config_with_both_profiles() -> None:
    config = _webhook_config()
    assert [(p.name, p.resources) for p in config.profiles] == [
        ("iluvatar", ("iluvatar.com/gpu",)),
        ("nvidia", ("nvidia.com/gpu",)),
    ]
    assert [v.host_path for v in config.profiles[0].volumes] == ["/usr/local/corex"]
    assert config.profiles[1].env[0].value == "/usr/local/cuda/lib64"
    assert NAMESPACE in config.policy.excluded_namespaces
    assert [(w.api_version, w.kind) for w in config.workloads] == [
        ("v1", "Pod"),
        ("kubeflow.org/v1", "TFJob"),
    ]


def test_webhook_configmap_carries_policy_values() -> None:
    config = _webhook_config(
        {
            "webhook": {
                "privilegedNamespaces": ["ml"],
                "conflictPolicy": "deny",
                "namespaceLookupFailure": "deny",
            },
            "profiles": {"nvidia": {"privileged": "allowed"}},
        }
    )
    assert config.policy.privileged_namespaces == ("ml",)
    assert (config.policy.conflict_policy, config.policy.namespace_lookup_failure) == ("deny", "deny")
    assert config.profiles[1].privileged == "allowed"


def _volume(workload: dict[str, Any], name: str) -> dict[str, Any]:
    volumes = workload["spec"]["template"]["spec"]["volumes"]
    return next(v for v in volumes if v["name"] == name)


def test_webhook_deployment_is_hardened_and_probed_over_https() -> None:
    objects = render()
    deployment = find(objects, "Deployment", WEBHOOK)
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert spec["replicas"] == 2
    assert pod["serviceAccountName"] == WEBHOOK
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


def test_webhook_rbac_is_least_privilege_in_self_mode() -> None:
    objects = render()
    assert _rules(objects, "ClusterRole", WEBHOOK) == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
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
def test_webhook_rbac_without_self_certs_only_reads_namespaces(mode: str) -> None:
    objects = render(CERT_MODES[mode])
    assert _rules(objects, "ClusterRole", WEBHOOK) == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
    ]
    assert not [o for o in objects if o["kind"] in ("Role", "RoleBinding")]


def test_plugin_gets_node_rights_only_with_node_labels() -> None:
    objects = render()
    assert not [
        o
        for o in objects
        if o["kind"] in ("ClusterRole", "ClusterRoleBinding") and o["metadata"]["name"] == PLUGIN
    ]
    assert find(objects, "ServiceAccount", PLUGIN)["automountServiceAccountToken"] is False
    labelled = render({"plugin": {"nodeLabels": True}})
    assert _rules(labelled, "ClusterRole", PLUGIN) == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
    ]
    assert find(labelled, "ServiceAccount", PLUGIN)["automountServiceAccountToken"] is True
    configmap = find(labelled, "ConfigMap", "ix-config")
    assert parse_plugin_config(yaml.safe_load(configmap["data"]["ix-config"])).labels.enabled


# --------------------------------------------------------------------------- device plugin


SEED_IX_CONFIG = "flags:\n  splitboard: false\nsharing:\n  timeSlicing:\n    replicas: 4"


def test_ix_config_is_the_vendor_format_verbatim() -> None:
    objects = render({"plugin": {"config": {"sharing": {"timeSlicing": {"replicas": 4}}}}})
    configmap = find(objects, "ConfigMap", "ix-config")
    assert configmap["metadata"]["namespace"] == NAMESPACE
    assert configmap["data"] == {"ix-config": SEED_IX_CONFIG}
    config = parse_plugin_config(yaml.safe_load(configmap["data"]["ix-config"]))
    assert (config.flags.splitboard, config.replicas) == (False, 4)
    split = find(render({"plugin": {"config": {"flags": {"splitboard": True}}}}), "ConfigMap", "ix-config")
    assert yaml.safe_load(split["data"]["ix-config"]) == {
        "flags": {"splitboard": True},
        "sharing": {"timeSlicing": {"replicas": 1}},
    }


def test_plugin_daemonset_has_the_seeds_mounts_and_real_probes() -> None:
    values = {"plugin": {"nodeSelector": {"ix-gpu.io/gpu": "true"}}}
    daemonset = find(render(values), "DaemonSet", PLUGIN)
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {"ix-gpu.io/gpu": "true"}
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
    }
    assert mounts["/sys"][1] and mounts["/run/udev"][1] and not mounts["/dev"][1]
    assert mounts["/ixconfig"][0] == "ix-config"
    assert _volume(daemonset, "ix-config")["configMap"] == {"name": "ix-config"}
    assert f"--config={PLUGIN_CONFIG_PATH}" in container["args"]
    for probe in ("startupProbe", "livenessProbe"):
        assert "exec" not in container[probe]
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    (port,) = container["ports"]
    assert f"--metrics-port={port['containerPort']}" in container["args"]
    assert container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_components_can_be_disabled() -> None:
    assert {
        o["metadata"].get("labels", {}).get("app.kubernetes.io/component")
        for o in render({"webhook": {"enabled": False}})
    } == {"device-plugin"}
    only_webhook = render({"plugin": {"enabled": False}})
    assert "DaemonSet" not in kinds(only_webhook)
    assert not [o for o in only_webhook if o["metadata"]["name"] == "ix-config"]


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


def test_readme_values_table_covers_every_value() -> None:
    from tests.chart.rendering import CHART

    readme = (CHART / "README.md").read_text()
    leaves: list[str] = []

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict) and node and not prefix.endswith(".resources"):
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
