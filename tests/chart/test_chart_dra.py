"""The chart's dra.enabled: the DRA plugin's own DaemonSet, the DeviceClass, RBAC, the slice policy,
and the device plugin told to yield (--dra-driver, the rights that check needs)."""

from __future__ import annotations

import json
from typing import Any

import cel
import pytest

from ix_gpu.cli import build_parser
from ix_gpu.dra.slices import MAX_COUNTER_SLICES, counter_slice_name
from tests.chart.rendering import KUBE_VERSIONS, HelmError, find, lint, render
from tests.support.k8s_schema import validate

DRA = "ixg-ix-gpu-dra"
PLUGIN = "ixg-ix-gpu-plugin"
NAMESPACE = "ix-gpu-system"
ON = {"dra": {"enabled": True}}
DRA_KINDS = {"DeviceClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def _dra_objects(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted(
        (o["kind"], o["metadata"]["name"])
        for o in objects
        if (o["kind"] in DRA_KINDS and not o["metadata"]["name"].startswith(PLUGIN))
        or o["metadata"]["name"].startswith(DRA)
    )


def test_off_by_default_and_on_adds_exactly_the_dra_objects() -> None:
    assert _dra_objects(render()) == []
    assert "--dra-driver=gpu.iluvatar.com" not in str(find(render(), "DaemonSet", PLUGIN))
    assert _dra_objects(render(ON)) == [
        ("ClusterRole", DRA),
        ("ClusterRoleBinding", DRA),
        ("DaemonSet", DRA),
        ("DeviceClass", "any.gpu.iluvatar.com"),
        ("DeviceClass", "gpu.iluvatar.com"),
        ("ServiceAccount", DRA),
        ("ValidatingAdmissionPolicy", f"{DRA}-resourceslices"),
        ("ValidatingAdmissionPolicyBinding", f"{DRA}-resourceslices"),
    ]
    without_policy = render({"dra": {"enabled": True, "restrictSlicesToOwnNode": False}})
    assert not [o for o in without_policy if o["metadata"]["name"].startswith(f"{DRA}-resourceslices")]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS[-1:])
def test_dra_objects_are_valid_kubernetes_and_lint(kube_version: str) -> None:
    for obj in render(ON):
        if obj["kind"] in DRA_KINDS or obj["metadata"]["name"].startswith((DRA, PLUGIN)):
            validate(obj, version=kube_version)
    assert lint(ON)["errors"] == []


def _device(driver: str, **attributes: bool) -> dict[str, Any]:
    return {"device": {"driver": driver, "attributes": {driver: attributes}}}


def test_device_classes_select_the_default_form_or_any_form_of_our_driver_by_cel() -> None:
    objects = render(ON)
    device_class = find(objects, "DeviceClass", "gpu.iluvatar.com")
    assert device_class["apiVersion"] == "resource.k8s.io/v1"
    (selector,) = device_class["spec"]["selectors"]
    expression = selector["cel"]["expression"]
    ours, other = "gpu.iluvatar.com", "gpu.nvidia.com"
    # The form the node's splitboard picks; a device from before the attribute counts as it.
    assert cel.evaluate(expression, _device(ours, defaultForm=True)) is True
    assert cel.evaluate(expression, _device(ours, defaultForm=False)) is False
    assert cel.evaluate(expression, _device(ours)) is True
    assert cel.evaluate(expression, _device(other, defaultForm=True)) is False
    (selector,) = find(objects, "DeviceClass", "any.gpu.iluvatar.com")["spec"]["selectors"]
    expression = selector["cel"]["expression"]
    assert cel.evaluate(expression, _device(ours, defaultForm=False)) is True
    assert cel.evaluate(expression, _device(other)) is False
    renamed = render({"dra": {"enabled": True, "driverName": "gpu.example.com"}})
    names = sorted(o["metadata"]["name"] for o in renamed if o["kind"] == "DeviceClass")
    assert names == ["any.gpu.example.com", "gpu.example.com"]
    expression = find(renamed, "DeviceClass", "gpu.example.com")["spec"]["selectors"][0]["cel"]["expression"]
    assert cel.evaluate(expression, _device("gpu.example.com", defaultForm=True)) is True


def test_extended_resource_name_goes_on_the_device_class_only_when_set() -> None:
    assert "extendedResourceName" not in find(render(ON), "DeviceClass", "gpu.iluvatar.com")["spec"]
    values = {"dra": {"enabled": True, "extendedResourceName": "iluvatar.com/gpu"}}
    device_class = find(render(values), "DeviceClass", "gpu.iluvatar.com")
    assert device_class["spec"]["extendedResourceName"] == "iluvatar.com/gpu"
    validate(device_class, version=KUBE_VERSIONS[-1])


@pytest.mark.parametrize(
    "name", ["gpu", "kubernetes.io/gpu", "node.kubernetes.io/gpu", "Iluvatar.com/gpu", "a/b/c"]
)
def test_an_extended_resource_name_the_apiserver_would_refuse_is_refused(name: str) -> None:
    with pytest.raises(HelmError, match="extendedResourceName"):
        render({"dra": {"enabled": True, "extendedResourceName": name}})


def test_rbac_is_exactly_what_each_plugin_calls() -> None:
    objects = render(ON)
    assert find(objects, "ClusterRole", DRA)["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices"],
            "verbs": ["get", "create", "update", "delete"],
        },
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    ]
    binding = find(objects, "ClusterRoleBinding", DRA)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": DRA, "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == DRA
    # The device plugin watches its node's allocation label and the driver's slices of its node.
    assert find(objects, "ClusterRole", PLUGIN)["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch", "list", "watch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list", "watch"]},
    ]
    # ... also with node labels off: then it still needs the token and those rights.
    quiet = render({"dra": {"enabled": True}, "plugin": {"nodeLabels": False}})
    assert find(quiet, "ClusterRole", PLUGIN)["rules"][0]["verbs"] == ["list", "watch"]
    assert (
        find(quiet, "DaemonSet", PLUGIN)["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    )


def test_slice_policy_binds_the_dra_service_account_and_checks_node_and_driver() -> None:
    objects = render(ON)
    policy = find(objects, "ValidatingAdmissionPolicy", f"{DRA}-resourceslices")["spec"]
    assert policy["failurePolicy"] == "Fail"
    (rule,) = policy["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceslices"] and set(rule["operations"]) == {
        "CREATE",
        "UPDATE",
        "DELETE",
    }
    (condition,) = policy["matchConditions"]
    assert (
        condition["expression"] == f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{DRA}"'
    )
    expressions = " ".join(v["expression"] for v in policy["validations"])
    assert "authentication.kubernetes.io/node-name" in " ".join(v["expression"] for v in policy["variables"])
    assert "variables.userNodeName" in expressions and 'spec.driver == "gpu.iluvatar.com"' in expressions
    binding = find(objects, "ValidatingAdmissionPolicyBinding", f"{DRA}-resourceslices")["spec"]
    assert binding == {"policyName": f"{DRA}-resourceslices", "validationActions": ["Deny"]}


def test_slice_policy_bounds_the_counter_slices_as_the_plugin_looks_for_them() -> None:
    """Counter slices ``-counters-0`` to ``-counters-15``, spelled as the plugin spells them, the
    ones it looks for when it cleans up (``MAX_COUNTER_SLICES``): a bound a stolen token cannot
    pass, and no name the plugin would leave behind. A counter slice lists no devices. The
    apiserver's verdicts: tests/chart/test_chart_install.py."""
    policy = find(render(ON), "ValidatingAdmissionPolicy", f"{DRA}-resourceslices")["spec"]
    variables = {v["name"]: v["expression"] for v in policy["variables"]}
    indexes = json.loads(variables["counterIndexes"])
    assert indexes == [str(k) for k in range(MAX_COUNTER_SLICES)]
    assert counter_slice_name("n1", "gpu.iluvatar.com", 0) == f"n1-gpu.iluvatar.com-counters-{indexes[0]}"
    expressions = [v["expression"] for v in policy["validations"]]
    assert any("in variables.counterIndexes" in e for e in expressions)
    (devices,) = [e for e in expressions if "spec.?devices" in e]
    assert devices.startswith('request.operation == "DELETE" || !variables.isCounters ||')


def test_dra_daemonset_runs_only_on_dra_nodes_with_same_path_mounts() -> None:
    daemonset = find(render(ON), "DaemonSet", DRA)
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == DRA
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {"key": "ix-gpu.io/gpu.allocation", "operator": "In", "values": ["dra"]}
    ]
    assert daemonset["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "dra-plugin"
    (container,) = pod["containers"]
    assert container["args"][0] == "dra"
    assert "--driver-name=gpu.iluvatar.com" in container["args"]
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["mountPath"]: (m["name"], m.get("readOnly", False)) for m in container["volumeMounts"]}
    # Every host directory is mounted at its own path: GetInfo names the absolute dra.sock path.
    assert {path: host[name] for path, (name, _) in mounts.items() if name in host} == {
        "/var/lib/kubelet/plugins_registry": "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins/gpu.iluvatar.com": "/var/lib/kubelet/plugins/gpu.iluvatar.com",
        "/var/run/cdi": "/var/run/cdi",
        "/dev": "/dev",
        "/sys": "/sys",
        "/usr/local/corex": "/usr/local/corex",
    }
    assert not mounts["/var/run/cdi"][1] and not mounts["/var/lib/kubelet/plugins/gpu.iluvatar.com"][1]
    assert mounts["/usr/local/corex"][1] and mounts["/ixconfig"] == ("ix-config", True)
    assert "--plugins-dir=/var/lib/kubelet/plugins" in container["args"]
    assert "--registry-dir=/var/lib/kubelet/plugins_registry" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "IX_GPU_PLUGIN_CONFIG" not in env
    assert "--config=/ixconfig/ix-config" in container["args"]
    # Claims' CDI specs mount the node's driver from where plugin.driver.root says it is.
    assert "--driver-root=/usr/local/corex" in container["args"]
    assert env["LD_LIBRARY_PATH"]["value"] == "/usr/local/corex/lib64"
    # /healthz on its own metrics port, named apart from the device plugin's "metrics" (the
    # metrics Service's plugin-metrics port resolves that name in every pod it selects).
    assert "--metrics-port=9402" in container["args"]
    assert container["ports"] == [{"name": "dra-metrics", "containerPort": 9402, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "dra-metrics"}
    # Ready once registered: a rolling update (maxSurge 1) stops the old pod only then, and each
    # pod's sockets are its own (its UID) so that both serve meanwhile.
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "dra-metrics"}
    assert "startupProbe" not in container
    assert env["IX_GPU_SOCKET_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert daemonset["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert container["securityContext"]["privileged"] is True


def test_device_plugin_keeps_running_everywhere_and_is_told_the_driver() -> None:
    daemonset = find(render(ON), "DaemonSet", PLUGIN)
    pod = daemonset["spec"]["template"]["spec"]
    assert "affinity" not in pod  # it yields by itself on dra nodes, and keeps labelling them
    (container,) = pod["containers"]
    assert "--dra-driver=gpu.iluvatar.com" in container["args"]
    assert pod["automountServiceAccountToken"] is True


def test_dra_without_the_device_plugin_still_has_its_ix_config() -> None:
    objects = render({"dra": {"enabled": True}, "plugin": {"enabled": False}})
    assert find(objects, "ConfigMap", "ix-config")["data"]["ix-config"].startswith("flags:")
    assert not [o for o in objects if o["metadata"]["name"] == PLUGIN]


@pytest.mark.parametrize(
    "values",
    [
        {"dra": {"enabled": True, "driverName": "Gpu_Iluvatar"}},
        {"dra": {"enabled": True, "pluginsDir": "relative/plugins"}},
        {"dra": {"enabled": True, "unhealthy": "evict"}},
        {"dra": {"enabeld": True}},
    ],
)
def test_schema_refuses_bad_dra_values(values: dict[str, Any]) -> None:
    with pytest.raises(HelmError, match="dra"):
        render(values)


def test_dra_reads_the_device_plugins_per_node_configs_and_its_driver_root() -> None:
    """With plugin.nodeConfigs both plugins get the directory and pick by the same node label, so
    splitboard (what one device is) agrees between them on every node."""
    shared = {"flags": {"splitboard": True}}
    values = {**ON, "plugin": {"nodeConfigs": {"split": shared}, "driver": {"root": "/opt/corex"}}}
    objects = render(values)
    for name in (DRA, PLUGIN):
        args = find(objects, "DaemonSet", name)["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--config=/ixconfig" in args and "--default-config=ix-config" in args, name
    dra_args = find(objects, "DaemonSet", DRA)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--driver-root=/opt/corex" in dra_args
    # No driver root: the CDI specs mount the config's or the vendor's default.
    bare = render({**ON, "plugin": {"driver": {"root": ""}}})
    bare_args = find(bare, "DaemonSet", DRA)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in bare_args if a.startswith("--driver-root")]


def test_the_metrics_service_and_monitor_reach_the_dra_plugin_on_its_own_port_name() -> None:
    """The headless metrics Service gains dra-metrics; the DRA pods name no port "metrics", so
    plugin-metrics (targetPort "metrics") lists only device-plugin pods, and each port one agent."""
    objects = render({**ON, "metrics": {"serviceMonitor": {"enabled": True}}})
    service = find(objects, "Service", "ixg-ix-gpu-metrics")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["dra-metrics"] == {
        "name": "dra-metrics",
        "port": 9402,
        "targetPort": "dra-metrics",
        "protocol": "TCP",
    }
    pods = {name: find(objects, "DaemonSet", name)["spec"]["template"] for name in (DRA, PLUGIN)}
    named = {name: {p["name"] for p in t["spec"]["containers"][0]["ports"]} for name, t in pods.items()}
    assert named == {DRA: {"dra-metrics"}, PLUGIN: {"metrics"}}
    for template in pods.values():  # the Service selects both agents' pods
        selector = service["spec"]["selector"]
        assert all(template["metadata"]["labels"].get(k) == v for k, v in selector.items())
    endpoints = find(objects, "ServiceMonitor", "ixg-ix-gpu-metrics")["spec"]["endpoints"]
    assert [(e["port"], e["scheme"]) for e in endpoints] == [
        ("webhook-metrics", "https"),
        ("plugin-metrics", "http"),
        ("dra-metrics", "http"),
    ]
    port = find(render({"dra": {"enabled": True, "metricsPort": 9500}}), "DaemonSet", DRA)
    assert "--metrics-port=9500" in port["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize(
    ("dra", "flag", "partitionable", "shares"),
    [
        ({}, "auto", True, False),
        ({"partitionableShares": True}, "with-shares", True, True),
        ({"partitionable": False}, "off", False, False),
        ({"partitionable": False, "partitionableShares": True}, "off", False, False),
    ],
)
def test_partitionable_values_become_the_plugins_flag_as_its_cli_reads_it(
    dra: dict[str, Any], flag: str, partitionable: bool, shares: bool
) -> None:
    """dra.partitionableShares (boards beside chips on shared nodes too) is off by default: only a
    1.37+ kube-scheduler keeps a board's share and its chip's share apart."""
    objects = render({"dra": {"enabled": True, **dra}})
    args = find(objects, "DaemonSet", DRA)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--partitionable={flag}" in args
    parsed = build_parser().parse_args(args)
    assert (parsed.partitionable != "off", parsed.partitionable == "with-shares") == (partitionable, shares)
