"""An operator's webhook config either works on the cluster or is refused with the reason: a
property test against a real kube-apiserver.

Hypothesis generates webhook configs whose every field is drawn mostly from valid values and now and
then from an edge of the rule the apiserver applies to that field (a label key of 253 + 63
characters, ``a/gpu``, an env name with ``=``, ``Gt 1.5``, a namespace glob...). For each one:

- refused by the models (``ix-gpu config validate``): the message names the field;
- accepted: (a) the chart rendered with it as ``config`` passes its values schema, and every object
  passes the apiserver's server-side dry-run (the MutatingWebhookConfiguration's CEL included);
  (b) a GPU pod mutated with it passes a dry-run create.

The apiserver's rejections of accepted configs must be zero. A bounded slice runs in CI, a
different one per commit: the seed is ``IX_GPU_ADVERSARIAL_SEED`` or the git HEAD, as in the
adversarial suite; ``IX_GPU_CONFIG_PROPERTY_EXAMPLES`` sets the count. The figures are printed
(``pytest -s``).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from ix_gpu.config.input_files import ConfigError
from ix_gpu.config.webhook_config import parse_config
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import Decision, NamespaceFacts
from ix_gpu.webhook.core.mutation import mutate
from tests.chart.rendering import NAMESPACE, HelmError, render
from tests.k8s.k8s_tier import KubeAPI
from tests.support.adversarial import adversarial_seed

EXAMPLES = int(os.environ.get("IX_GPU_CONFIG_PROPERTY_EXAMPLES", "250"))
SEED, SEED_SOURCE = adversarial_seed()
TEAM = "gpu-team"
"""Where the GPU pods are dry-run; it is also what namespace globs may (or may not) match."""


def _field(ok: list[Any], edge: list[Any]) -> st.SearchStrategy[Any]:
    """Mostly a valid value, one draw in about 25 an edge (valid or not) of the field's rule: a
    config has some 20 such fields, so about half the configs are accepted."""
    # One sampled_from over a weighted list: hypothesis's one_of does not pick its branches evenly.
    return st.sampled_from(ok * -(-len(edge) * 24 // len(ok)) + edge)


LONG_PREFIX = "a" * 253
RESOURCES = _field(
    ["iluvatar.com/gpu", "nvidia.com/gpu", "nvidia.com/mig-*", "example.com/gpu-?g", "vendor.example/x_1"],
    ["*", "cpu", "memory", "a/gpu", "kubernetes.io/gpu", "x.kubernetes.io/gpu", "requests.a.com/gpu", "*/gpu",
     "a.com/-*", "nvidia.com*", "A.com/gpu", "a.com/[ab]", "a.com/" + "x" * 63, "a.com/" + "x" * 64,
     "a.com/*x*"],
)  # fmt: skip
DNS_LABELS = _field(["v", "driver-1", "corex"], ["a" * 63, "a" * 64, "V", "a_b", "-a", "a.b"])
PATHS = _field(
    ["/usr/local/corex", "/dev/iluvatar0", "/opt/x y"], ["/", "/a/..b", "rel", "/a/../b", "/a/..", "./a"]
)
ENV_NAMES = _field(
    ["LD_LIBRARY_PATH", "IX_MODE", "PATH"],
    ["my.env-name", "-x", "_X", "A=B", "1X", "..x", ".", "a b", "X\u00e9"],
)
LABEL_KEYS = _field(
    ["gpu", "ix-gpu.io/gpu.product", "a.b/c_d"],
    [
        "x" * 63,
        f"{LONG_PREFIX}/n",
        "x" * 64,
        f"{LONG_PREFIX}a/n",
        "a/b/c",
        "-a",
        "a b",
        "/n",
        "A.com/x",
        "a/",
    ],
)
LABEL_VALUES = _field(["", "BI-V150", "a.b_c", "1"], ["x" * 63, "x" * 64, "-a", "a b", "team-*", "a\u00e9"])
NAMESPACES = _field(
    ["team-a", "ml", "team-*", "t?am", "gpu-*"], ["*", "Team", "a_b", "team-[ab]", "-*", "x" * 64]
)
ANY_OPERATOR_VALUES = st.tuples(
    st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]),
    st.sampled_from([[], ["1"], ["a"], ["1.5"], ["1", "2"], ["-1"], ["+1"], ["9223372036854775808"], ["0"]]),
)
OPERATOR_VALUES = st.sampled_from(range(25)).flatmap(
    lambda n: (
        ANY_OPERATOR_VALUES
        if n == 0
        else st.one_of(
            st.tuples(st.sampled_from(["In", "NotIn"]), st.lists(LABEL_VALUES, min_size=1, max_size=2)),
            st.tuples(st.sampled_from(["Exists", "DoesNotExist"]), st.just([])),
            st.tuples(st.sampled_from(["Gt", "Lt"]), st.sampled_from([["0"], ["40000"]])),
        )
    )
)
"""Mostly the combinations the operator rules allow, sometimes any."""
RUNTIME_CLASSES = _field([None, "nvidia", "a.b"], ["a" * 253, "a" * 254, "Nvidia_RT", "-a", ""])


@st.composite
def _any_toleration(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {}
    key = draw(st.one_of(st.none(), st.just(""), LABEL_KEYS))
    if key is not None:
        out["key"] = key
    out["operator"] = draw(st.sampled_from(["Equal", "Exists"]))
    value = draw(st.one_of(st.none(), LABEL_VALUES))
    if value is not None:
        out["value"] = value
    effect = draw(st.sampled_from([None, "NoSchedule", "PreferNoSchedule", "NoExecute"]))
    if effect is not None:
        out["effect"] = effect
    if draw(st.integers(0, 3)) == 0:
        out["tolerationSeconds"] = draw(st.sampled_from([0, 60, -1]))
    return out


EFFECTS = st.sampled_from(["NoSchedule", "PreferNoSchedule"])
TOLERATIONS = st.sampled_from(range(25)).flatmap(
    lambda n: (
        _any_toleration()
        if n == 0
        else st.one_of(
            st.builds(lambda k, e: {"key": k, "operator": "Exists", "effect": e}, LABEL_KEYS, EFFECTS),
            st.builds(lambda k, v: {"key": k, "operator": "Equal", "value": v}, LABEL_KEYS, LABEL_VALUES),
            st.just({"operator": "Exists"}),
            st.builds(lambda k: {"key": k, "effect": "NoExecute", "tolerationSeconds": 60}, LABEL_KEYS),
        )
    )
)
"""Mostly the forms the operator rules allow, sometimes any combination."""


@st.composite
def _profiles(draw: st.DrawFn, name: str) -> dict[str, Any]:
    profile: dict[str, Any] = {"name": name, "resources": draw(st.lists(RESOURCES, min_size=1, max_size=2))}
    mount = draw(st.integers(0, 2))
    profile["volumes"] = [
        {
            "name": draw(DNS_LABELS) + ("" if i == 0 else f"-{i}"),
            "hostPath": draw(PATHS),
            "mountPath": f"/mnt/{name}/{i}" if draw(st.booleans()) else draw(PATHS) + f"/{i}",
            "readOnly": draw(st.booleans()),
        }
        for i in range(mount)
    ]
    names = draw(st.lists(ENV_NAMES, max_size=2, unique=True))
    modes = st.sampled_from(["set-if-absent", "prepend-path", "append-path", "override"])
    profile["env"] = [
        {"name": n, "value": draw(st.sampled_from(["", "/x/lib", "a=b"])), "mode": draw(modes)} for n in names
    ]
    profile["privileged"] = draw(st.sampled_from(["never", "never", "allowed", "required"]))
    profile["nodeSelector"] = draw(st.dictionaries(LABEL_KEYS, LABEL_VALUES, max_size=2))
    profile["affinity"] = {
        "requiredNodeExpressions": [
            {"key": draw(LABEL_KEYS), "operator": op, "values": values}
            for op, values in draw(st.lists(OPERATOR_VALUES, max_size=2))
        ]
    }
    profile["tolerations"] = draw(st.lists(TOLERATIONS, max_size=2))
    if (runtime_class := draw(RUNTIME_CLASSES)) is not None:
        profile["runtimeClassName"] = runtime_class
    return profile


TEMPLATE_PATHS = _field(
    [["spec.tfReplicaSpecs.*.template"]],
    [["spec.tfReplicaSpecs.*.template", "spec.tfReplicaSpecs.Worker.template"], [".", "."],
     ["spec.tfReplicaSpecs.*.template", "spec.tfReplicaSpecs.*.spec.template"]],
)  # fmt: skip


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(
        st.lists(st.sampled_from(["iluvatar", "nvidia", "mig"]), min_size=1, max_size=2, unique=True)
    )
    return {
        "profiles": [draw(_profiles(name)) for name in names],
        "workloads": [
            {"apiVersion": "v1", "kind": "Pod", "templatePaths": ["."]},
            {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "templatePaths": draw(TEMPLATE_PATHS)},
        ],
        "policy": {
            "excludedNamespaces": draw(st.lists(NAMESPACES, max_size=3, unique=True)),
            "privilegedNamespaces": draw(st.lists(st.sampled_from([TEAM, "gpu-*", "other"]), max_size=1)),
            "conflictPolicy": draw(st.sampled_from(["keep-user", "deny"])),
        },
    }


# ------------------------------------------------------------------------------ the apiserver side

CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "Namespace",
    "RuntimeClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def _collection(obj: dict[str, Any]) -> str:
    """The REST collection an object is created in (for the kinds used here, the plural is the
    lower-case kind plus s, es after an s, ies for a final y)."""
    version = obj["apiVersion"]
    base = "/api/v1" if version == "v1" else f"/apis/{version}"
    kind = obj["kind"].lower()
    plurals = {"y": kind[:-1] + "ies", "s": kind + "es"}
    plural = plurals.get(kind[-1], kind + "s")
    if obj["kind"] in CLUSTER_SCOPED:
        return f"{base}/{plural}"
    namespace = obj["metadata"].get("namespace", NAMESPACE)
    return f"{base}/namespaces/{namespace}/{plural}"


def _create(kube_api: KubeAPI, obj: dict[str, Any], *, dry_run: bool) -> tuple[int, Any]:
    return kube_api.request("POST", _collection(obj) + ("?dryRun=All" if dry_run else ""), obj)


def _ensure(kube_api: KubeAPI, obj: dict[str, Any]) -> None:
    status, reply = _create(kube_api, obj, dry_run=False)
    assert status in (201, 409), reply


def _gpu_pod(config: dict[str, Any], gpu_type: str | None) -> dict[str, Any]:
    """A pod asking for one of each profile's first resource (a glob made a name that it matches)."""
    limits = {p["resources"][0].replace("*", "x").replace("?", "a"): "1" for p in config["profiles"]}
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu", "namespace": TEAM, "annotations": {}},
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": "registry.example/train:1",
                    "resources": {"limits": limits},
                    "env": [
                        {"name": "LD_LIBRARY_PATH", "value": "/usr/lib"},
                        {"name": "IX_MODE", "value": "user"},
                    ],
                },
                {"name": "sidecar", "image": "registry.example/sidecar:1"},
            ]
        },
    }
    if gpu_type is not None:
        pod["metadata"]["annotations"]["ix-gpu.io/gpu-type"] = gpu_type
    return pod


_REFUSAL = re.compile(r"^config: (profiles|workloads|policy)(\[\d+\])?[.:]")


def test_accepted_configs_work_on_the_apiserver_and_refused_ones_name_the_field(kube_api: KubeAPI) -> None:
    """The figures (tried, accepted, refused, apiserver rejections) are printed at the end."""
    _ensure(kube_api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    _ensure(kube_api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TEAM}})
    figures: Counter[str] = Counter()
    rejections: list[str] = []

    @seed(SEED)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(config=configs(), gpu_type=st.sampled_from([None, "BI-V150", "Iluvatar BI-V150, ###", "x" * 80]))
    def check(config: dict[str, Any], gpu_type: str | None) -> None:
        figures["tried"] += 1
        try:
            model = parse_config(config, "config")
        except ConfigError as exc:
            figures["refused"] += 1
            assert _REFUSAL.match(str(exc)), f"seed {SEED}: the refusal names no field: {exc}"
            return
        figures["accepted"] += 1
        failures = _chart_rejections(kube_api, config, figures)
        failures += _pod_rejections(kube_api, model, config, gpu_type, figures)
        if failures:
            rejections.extend(failures)
            raise AssertionError(f"seed {SEED} ({SEED_SOURCE}): {json.dumps(config)}\n" + "\n".join(failures))

    try:
        check()
    finally:
        print(
            f"\nconfig properties, seed {SEED} ({SEED_SOURCE}): {figures['tried']} configs tried, "
            f"{figures['accepted']} accepted, {figures['refused']} refused, "
            f"{len(rejections)} apiserver rejections; {figures['objects']} chart objects and "
            f"{figures['pods']} mutated pods dry-run ({figures['denied']} pods denied by the webhook)"
        )
    assert figures["accepted"] and figures["refused"], figures


def _chart_rejections(kube_api: KubeAPI, config: dict[str, Any], figures: Counter[str]) -> list[str]:
    """(a): the chart renders with the config (its values schema agrees with the models), and the
    apiserver's dry-run accepts every object it renders."""
    try:
        objects = render({"config": config})
    except HelmError as exc:
        return [f"the chart refused a config the models accept: {exc}"]
    failures = []
    for obj in objects:
        status, reply = _create(kube_api, obj, dry_run=True)
        figures["objects"] += 1
        if status not in (200, 201):
            failures.append(f"{obj['kind']} {obj['metadata']['name']}: {status} {_message(reply)}")
    return failures


def _pod_rejections(
    kube_api: KubeAPI, model: Any, config: dict[str, Any], gpu_type: str | None, figures: Counter[str]
) -> list[str]:
    """(b): the GPU pod, mutated with the config, passes a dry-run create."""
    pod = _gpu_pod(config, gpu_type)
    result = mutate(pod, "CREATE", NamespaceFacts(TEAM), CompiledConfig(model))
    if result.decision is Decision.DENIED:  # privileged: required outside privilegedNamespaces
        figures["denied"] += 1
        return []
    mutated = jsonpatch.apply_patch(pod, result.ops)
    if runtime_class := mutated["spec"].get("runtimeClassName"):
        # The RuntimeClass admission plugin refuses a pod whose class does not exist.
        node_handler = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "handler": "runc"}
        _ensure(kube_api, {**node_handler, "metadata": {"name": runtime_class}})
    figures["pods"] += 1
    status, reply = _create(kube_api, mutated, dry_run=True)
    return [] if status in (200, 201) else [f"mutated pod: {status} {_message(reply)}"]


def _message(reply: Any) -> str:
    return str(reply.get("message") if isinstance(reply, dict) else reply)[:2000]
