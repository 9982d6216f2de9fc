"""Property tests over generated pods: patches apply, outputs are valid, mutation is idempotent,
and containers that ask for no GPU are never touched.

GPUs are asked for through limits and through DRA claims (``spec.resourceClaims`` of templates and
claims for GPUs, for another device class, for both, and one the facts do not know).

Pods are generated valid (unique names, mounts that reference volumes, consistent resources) and
deliberately collide with what the profiles inject: same volume names with other content, mounts
at the driver's path, LD_LIBRARY_PATH set by value or valueFrom, tolerations and affinity already
present, ``allowPrivilegeEscalation: false``.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ix_gpu.config.webhook_config import default_config, parse_config
from ix_gpu.devicemodel import labels
from ix_gpu.webhook.core.claims import KnownClaims
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import Decision, NamespaceFacts
from ix_gpu.webhook.core.mutation import mutate
from tests.support.k8s_schema import validate, validate_pod_template
from tests.support.objects import DRA_CLASS, claim_template, device_request, pod_claim, resource_claim

EXAMPLES = int(os.environ.get("IX_GPU_PROPERTY_EXAMPLES", "2000"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

RICH = CompiledConfig(
    parse_config(
        {
            "profiles": [
                {
                    "name": "iluvatar",
                    "resources": ["iluvatar.com/gpu"],
                    "volumes": [
                        {
                            "name": "ix-driver",
                            "hostPath": "/usr/local/corex",
                            "type": "Directory",
                            "mountPath": "/usr/local/corex",
                            "readOnly": True,
                        },
                    ],
                    "deviceNodes": {
                        "inject": True,
                        "volumes": [
                            {
                                "name": "ix-itrctl",
                                "hostPath": "/dev/itrctl",
                                "type": "CharDevice",
                                "mountPath": "/dev/itrctl",
                            },
                        ],
                    },
                    "env": [
                        {
                            "name": "LD_LIBRARY_PATH",
                            "value": "/usr/local/corex/lib64",
                            "mode": "prepend-path",
                        },
                        {"name": "PATH", "value": "/usr/local/corex/bin", "mode": "append-path"},
                        {"name": "IX_MODE", "value": "train", "mode": "override"},
                    ],
                    "privileged": "allowed",
                    "nodeSelector": {"ix-gpu.io/gpu.present": "true"},
                    "affinity": {
                        "requiredNodeExpressions": [{"key": labels.GPU_COUNT, "operator": "Exists"}]
                    },
                    "tolerations": [
                        {"key": "iluvatar.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "runtimeClassName": "corex",
                    "deviceClasses": [DRA_CLASS],
                },
                {
                    "name": "nvidia",
                    "resources": ["nvidia.com/*"],
                    "volumes": [
                        {"name": "cuda", "hostPath": "/usr/local/cuda", "mountPath": "/usr/local/cuda"}
                    ],
                    "env": [
                        {"name": "LD_LIBRARY_PATH", "value": "/usr/local/cuda/lib64", "mode": "prepend-path"}
                    ],
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                },
            ],
            "policy": {"privilegedNamespaces": ["gpu"]},
        }
    )
)
LIBRARY_PATH_EVERYWHERE = CompiledConfig(parse_config({"policy": {"keepImageLibraryPathInClaims": False}}))
"""The built-in config with the profile's LD_LIBRARY_PATH mode in claim containers too."""
CONFIGS = [CompiledConfig(default_config()), RICH, LIBRARY_PATH_EVERYWHERE]

NIC = "nic.example.com"
CLAIM_REQUESTS: dict[str, dict[str, str] | None] = {
    "gpu": {"gpu": DRA_CLASS},
    "nic": {"nic": NIC},
    "shared": {"gpu": DRA_CLASS},
    "mixed": {"gpu": DRA_CLASS, "nic": NIC},
    "fresh": None,
}
"""Pod claim name → its requests' device classes (None: the facts do not know it). The oracle the
generated pods are checked against; CLAIMS says the same as manifests."""
POD_CLAIMS = [
    pod_claim("gpu"),
    pod_claim("nic"),
    pod_claim("shared", claim="shared"),
    pod_claim("mixed"),
    pod_claim("fresh"),
]
CLAIMS = KnownClaims.of(
    [
        claim_template("gpu"),
        claim_template("nic", [device_request("nic", NIC)]),
        resource_claim("shared"),
        claim_template("mixed", [device_request("gpu"), device_request("nic", NIC)]),
    ]
)

dns_label = st.from_regex(r"\A[a-z][a-z0-9]{0,6}\Z")
env_name = st.sampled_from(["LD_LIBRARY_PATH", "PATH", "IX_MODE", "HOME", "A", "B_2"])
path_value = st.lists(
    st.sampled_from(["/usr/lib", "/usr/local/corex/lib64", "/opt/x", "/bin"]), max_size=3
).map(":".join)
resource_names = st.sampled_from(
    ["iluvatar.com/gpu", "nvidia.com/gpu", "nvidia.com/mig-1g", "cpu", "example.com/x"]
)
gpu_quantity = st.one_of(st.integers(0, 8), st.integers(0, 8).map(str))


@st.composite
def env_entries(draw: st.DrawFn) -> list[dict[str, Any]]:
    names = draw(st.lists(env_name, unique=True, max_size=4))
    out = []
    for name in names:
        if draw(st.integers(0, 5)) == 0:
            out.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
        else:
            out.append({"name": name, "value": draw(path_value)})
    return out


@st.composite
def resources(draw: st.DrawFn) -> dict[str, Any]:
    chosen = draw(st.dictionaries(resource_names, gpu_quantity, max_size=3))
    limits = {k: (v if k != "cpu" else "500m") for k, v in chosen.items()}
    out: dict[str, Any] = {}
    if limits:
        out["limits"] = limits
        if draw(st.booleans()):
            out["requests"] = dict(limits)
    return out


VOLUME_NAMES = ["ix-gpu-iluvatar-driver", "ix-driver", "cuda", "data", "cache"]
MOUNT_PATHS = ["/usr/local/corex", "/usr/local/cuda", "/data", "/dev/itrctl", "/cache"]


@st.composite
def volumes(draw: st.DrawFn) -> list[dict[str, Any]]:
    names = draw(st.lists(st.sampled_from(VOLUME_NAMES), unique=True, max_size=3))
    out = []
    for name in names:
        kind = draw(st.integers(0, 2))
        if kind == 0:
            out.append({"name": name, "emptyDir": {}})
        elif kind == 1:
            out.append({"name": name, "hostPath": {"path": "/usr/local/corex", "type": "Directory"}})
        else:
            out.append({"name": name, "hostPath": {"path": "/usr/local/cuda", "type": ""}})
    return out


@st.composite
def containers(draw: st.DrawFn, volume_names: list[str], prefix: str) -> list[dict[str, Any]]:
    count = draw(st.integers(0 if prefix == "init" else 1, 4))
    out = []
    for i in range(count):
        container: dict[str, Any] = {"name": f"{prefix}{i}", "image": "registry.local/img:1"}
        res = draw(resources())
        if res:
            container["resources"] = res
        env = draw(env_entries())
        if env:
            container["env"] = env
        if volume_names:
            mounts = draw(
                st.lists(
                    st.tuples(st.sampled_from(volume_names), st.sampled_from(MOUNT_PATHS)),
                    unique_by=lambda t: t[1],
                    max_size=2,
                )
            )
            if mounts:
                container["volumeMounts"] = [{"name": n, "mountPath": p} for n, p in mounts]
        context = draw(
            st.sampled_from(
                [None, {}, {"allowPrivilegeEscalation": False}, {"privileged": False}, {"runAsUser": 1000}]
            )
        )
        if context is not None:
            container["securityContext"] = context
        out.append(container)
    return out


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    vols = draw(volumes())
    names = [v["name"] for v in vols]
    spec: dict[str, Any] = {"containers": draw(containers(names, "c"))}
    init = draw(containers(names, "init"))
    if init:
        spec["initContainers"] = init
    if vols or draw(st.booleans()):
        spec["volumes"] = vols
    if draw(st.booleans()):
        spec["tolerations"] = draw(
            st.sampled_from(
                [
                    [],
                    [{"key": "iluvatar.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    [{"key": "other", "operator": "Equal", "value": "x", "effect": "NoExecute"}],
                ]
            )
        )
    if draw(st.booleans()):
        spec["nodeSelector"] = draw(st.sampled_from([{}, {"ix-gpu.io/gpu.present": "false"}, {"zone": "a"}]))
    if draw(st.booleans()):
        terms = draw(
            st.sampled_from(
                [
                    [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}],
                    [
                        {"matchExpressions": [{"key": labels.GPU_COUNT, "operator": "Exists"}]},
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]},
                    ],
                ]
            )
        )
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    metadata: dict[str, Any] = {"name": draw(dns_label)}
    if draw(st.integers(0, 4)) == 0:
        metadata["annotations"] = {labels.GPU_TYPE: draw(st.sampled_from(["BI-V150", "A100, H100"]))}
    if draw(st.booleans()):
        spec["runtimeClassName"] = draw(st.sampled_from(["corex", "runc"]))
    if draw(st.integers(0, 2)) == 0:
        declared = draw(
            st.lists(st.sampled_from(POD_CLAIMS), unique_by=lambda c: c["name"], min_size=1, max_size=3)
        )
        spec["resourceClaims"] = declared
        refs = [{"name": c["name"]} for c in declared] + [
            {"name": c["name"], "request": r} for c in declared for r in CLAIM_REQUESTS[c["name"]] or {}
        ]
        for container in spec["containers"] + spec.get("initContainers", []):
            chosen = draw(st.lists(st.sampled_from(refs), unique_by=lambda r: r["name"], max_size=2))
            if chosen:
                container.setdefault("resources", {})["claims"] = chosen
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


namespaces = st.sampled_from(
    [
        NamespaceFacts("gpu"),
        NamespaceFacts("gpu", labels={labels.PSA_ENFORCE: "baseline"}),
        NamespaceFacts("team"),
        NamespaceFacts.unknown("gpu"),
    ]
)


def _gpu_container_names(pod: dict[str, Any], config: CompiledConfig) -> set[str]:
    names = set()
    for key in ("containers", "initContainers"):
        for container in pod["spec"].get(key, []):
            limits = container.get("resources", {}).get("limits", {})
            if any(config.profiles_for(r) and int(q) > 0 for r, q in limits.items()):
                names.add(container["name"])
            for ref in container.get("resources", {}).get("claims", []):
                requests = CLAIM_REQUESTS[ref["name"]] or {}
                classes = [c for r, c in requests.items() if ref.get("request", r) == r]
                if any(config.profiles_for_class(c) for c in classes):
                    names.add(container["name"])
    return names


def _claims_only_names(pod: dict[str, Any], config: CompiledConfig) -> set[str]:
    """The GPU containers of ``pod`` that ask for no configured GPU in their limits: served only
    through claims."""
    gpu = _gpu_container_names(pod, config)
    names = set()
    for key in ("containers", "initContainers"):
        for container in pod["spec"].get(key, []):
            limits = container.get("resources", {}).get("limits", {})
            if not any(config.profiles_for(r) and int(q) > 0 for r, q in limits.items()):
                names.add(container["name"])
    return gpu & names


def _library_path_set(container: dict[str, Any]) -> bool:
    return any(e.get("name") == "LD_LIBRARY_PATH" for e in container.get("env", []))


def _check_semantics(pod: dict[str, Any]) -> None:
    """Rules the apiserver enforces beyond the JSON schema, which a bad merge would break."""
    spec = pod["spec"]
    volume_names = [v["name"] for v in spec.get("volumes", [])]
    assert len(volume_names) == len(set(volume_names)), volume_names
    for key in ("containers", "initContainers"):
        for container in spec.get(key, []):
            paths = [m["mountPath"] for m in container.get("volumeMounts", [])]
            assert len(paths) == len(set(paths)), paths
            assert all(m["name"] in volume_names for m in container.get("volumeMounts", []))
            context = container.get("securityContext", {})
            assert not (context.get("privileged") and context.get("allowPrivilegeEscalation") is False)


def _apiserver_defaults(pod: dict[str, Any]) -> dict[str, Any]:
    """What the apiserver's defaulting adds before a webhook sees an object (the parts we touch)."""
    out = copy.deepcopy(pod)
    for volume in out["spec"].get("volumes", []):
        if "hostPath" in volume:
            volume["hostPath"].setdefault("type", "")
    for key in ("containers", "initContainers"):
        for container in out["spec"].get(key, []):
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("imagePullPolicy", "IfNotPresent")
    return out


def _uses_unknown_claim(pod: dict[str, Any]) -> bool:
    """A container of ``pod`` refers to a pod claim whose facts the webhook does not know."""
    unknown = {
        c.get("name")
        for c in pod["spec"].get("resourceClaims", [])
        if isinstance(c, dict) and CLAIM_REQUESTS.get(str(c.get("name"))) is None
    }
    return any(
        isinstance(ref, dict) and ref.get("name") in unknown
        for key in ("containers", "initContainers")
        for container in pod["spec"].get(key, [])
        for ref in ((container.get("resources") or {}).get("claims") or [])
    )


@SETTINGS
@given(pod=pods(), namespace=namespaces, config_index=st.integers(0, len(CONFIGS) - 1))
def test_pod_mutation_properties(pod: dict[str, Any], namespace: NamespaceFacts, config_index: int) -> None:
    config = CONFIGS[config_index]
    validate(pod)
    original = copy.deepcopy(pod)
    result = mutate(pod, "CREATE", namespace, config, CLAIMS)
    assert pod == original, "mutate() must not modify its input"
    if result.decision is Decision.DENIED:
        # Neither config requires privileged, so only an unknown claim can deny: claimLookupFailure
        # is deny by default, and a GPU pod is never admitted without its injection.
        assert "policy.claimLookupFailure is deny" in result.reason, result.reason
        assert _uses_unknown_claim(pod), result.reason
        return
    mutated = jsonpatch.apply_patch(pod, result.ops)
    validate(mutated)
    _check_semantics(mutated)
    gpu = _gpu_container_names(pod, config)
    claims_only = _claims_only_names(pod, config)
    assert (result.decision in (Decision.MUTATED, Decision.UNCHANGED)) == bool(gpu)
    for key in ("containers", "initContainers"):
        for before, after in zip(pod["spec"].get(key, []), mutated["spec"].get(key, []), strict=True):
            if before["name"] not in gpu:
                assert before == after, "a container without GPUs was changed"
            elif before["name"] in claims_only and config is not LIBRARY_PATH_EVERYWHERE:
                # Served only through claims: the image's LD_LIBRARY_PATH stands where the spec
                # sets none, and one the spec sets is merged into, never removed.
                assert _library_path_set(after) == _library_path_set(before), (before, after)
    if gpu:
        assert mutated["metadata"]["annotations"][labels.INJECTED].endswith("@" + config.digest)
    again = mutate(mutated, "CREATE", namespace, config, CLAIMS)
    assert again.ops == [], again.ops
    assert again.decision in (Decision.UNCHANGED, Decision.SKIPPED)
    # A reinvocation sees the stored, defaulted object: still nothing to do.
    stored = mutate(_apiserver_defaults(mutated), "CREATE", namespace, config, CLAIMS)
    assert stored.ops == []
    assert set(stored.warnings) <= set(result.warnings), "our own additions must not look like conflicts"


@settings(max_examples=max(EXAMPLES // 4, 50), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worker=pods(), chief=pods(), namespace=namespaces)
def test_tfjob_mutation_properties(
    worker: dict[str, Any], chief: dict[str, Any], namespace: NamespaceFacts
) -> None:
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "job"},
        "spec": {
            "tfReplicaSpecs": {
                "Worker": {
                    "replicas": 2,
                    "template": {"metadata": worker["metadata"], "spec": worker["spec"]},
                },
                "Chief": {"replicas": 1, "template": {"spec": chief["spec"]}},
            }
        },
    }
    result = mutate(job, "CREATE", namespace, RICH, CLAIMS)
    mutated = jsonpatch.apply_patch(job, result.ops)
    for replica in mutated["spec"]["tfReplicaSpecs"].values():
        validate_pod_template(replica["template"])
        _check_semantics(replica["template"])
    assert mutate(mutated, "CREATE", namespace, RICH, CLAIMS).ops == []
