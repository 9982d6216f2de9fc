"""DRA pods in the core: a container that gets its GPU through ``spec.resourceClaims`` gets the
profile that maps the claim's DeviceClass, exactly as one with ``iluvatar.com/gpu`` in its limits;
claims the core cannot learn follow ``policy.claimLookupFailure``."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from ix_gpu.config.webhook_config import default_config, parse_config
from ix_gpu.devicemodel import labels
from ix_gpu.webhook.core.claims import (
    RESOURCE_CLAIM,
    RESOURCE_CLAIM_TEMPLATE,
    UNKNOWN_CLAIMS,
    KnownClaims,
    claim_key,
    device_requests,
)
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import Decision, NamespaceFacts
from ix_gpu.webhook.core.mutation import mutate
from tests.support.k8s_schema import validate
from tests.support.objects import (
    DRA_CLASS,
    claim_template,
    container,
    device_request,
    pod,
    pod_claim,
    replica,
    resource_claim,
    tfjob,
)

DEFAULT = CompiledConfig(default_config())
ALLOW = CompiledConfig(parse_config({"policy": {"claimLookupFailure": "allow-unmodified"}}))
NO_CLASSES = CompiledConfig(
    parse_config({"profiles": [{"name": "iluvatar", "resources": ["iluvatar.com/gpu"]}]})
)
TEAM = NamespaceFacts("team")
NIC = "nic.example.com"

CLAIMS = KnownClaims.of(
    [
        claim_template("gpu", namespace="team"),
        claim_template("nic", [device_request("nic", NIC)], namespace="team"),
        claim_template("mixed", [device_request("gpu"), device_request("nic", NIC)], namespace="team"),
        claim_template(
            "either",
            [device_request("acc", first_available=[("nic", NIC), ("big", DRA_CLASS)])],
            namespace="team",
        ),
        resource_claim("shared", namespace="team"),
        claim_template("elsewhere", namespace="other"),
    ]
)


def admit(obj: dict[str, Any], config: CompiledConfig = DEFAULT, claims: Any = CLAIMS) -> dict[str, Any]:
    result = mutate(obj, "CREATE", TEAM, config, claims)
    assert result.decision is Decision.MUTATED, result.reason
    patched: dict[str, Any] = jsonpatch.apply_patch(obj, result.ops)
    if obj["kind"] == "Pod":
        validate(patched)
    return patched


def _without_gpu_request(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod minus how it asked for its GPU (limits or claims) and the injection record, to
    compare what was injected."""
    out = copy.deepcopy(obj)
    out["spec"].pop("resourceClaims", None)
    out["metadata"]["annotations"].pop(labels.INJECTED_ITEMS)
    for c in out["spec"]["containers"]:
        c.pop("resources", None)
    return out


def test_a_claim_from_a_template_gets_the_same_injection_as_a_limit_but_the_library_path() -> None:
    """All of the profile but its LD_LIBRARY_PATH, which a container served only through claims
    gets only merged into a value its spec sets (policy.keepImageLibraryPathInClaims)."""
    dra = admit(pod(containers=[container("main", claims=["gpu"])], resource_claims=[pod_claim("gpu")]))
    limits = admit(pod(containers=[container("main", 1)]))
    assert limits["spec"]["containers"][0].pop("env") == [
        {"name": "LD_LIBRARY_PATH", "value": "/usr/local/corex/lib64"}
    ]
    assert _without_gpu_request(dra) == _without_gpu_request(limits)
    annotations = dra["metadata"]["annotations"]
    assert annotations[labels.INJECTED] == f"iluvatar@{DEFAULT.digest}"
    assert dra["spec"]["volumes"][0]["hostPath"]["path"] == "/usr/local/corex"


def test_a_shared_resource_claim_counts_as_a_template_does() -> None:
    obj = pod(containers=[container("main", claims=["g"])], resource_claims=[pod_claim("g", claim="shared")])
    main = admit(obj)["spec"]["containers"][0]
    assert [m["mountPath"] for m in main["volumeMounts"]] == ["/usr/local/corex"]


def test_only_the_containers_that_reference_the_claim_are_injected() -> None:
    obj = pod(
        containers=[container("main", claims=["gpu"]), container("side")],
        init_containers=[container("warm", claims=["gpu"])],
        resource_claims=[pod_claim("gpu")],
    )
    mutated = admit(obj)
    assert mutated["spec"]["containers"][1] == obj["spec"]["containers"][1]
    for injected in (mutated["spec"]["containers"][0], mutated["spec"]["initContainers"][0]):
        assert [m["name"] for m in injected["volumeMounts"]] == ["ix-gpu-iluvatar-driver"]


@pytest.mark.parametrize(
    ("claim", "ref", "injected"),
    [
        ("nic", "c", False),
        ("mixed", "c", True),
        ("mixed", {"name": "c", "request": "gpu"}, True),
        ("mixed", {"name": "c", "request": "nic"}, False),
        ("either", "c", True),
        ("either", {"name": "c", "request": "acc"}, True),
        ("either", {"name": "c", "request": "acc/big"}, True),
        ("either", {"name": "c", "request": "acc/nic"}, False),
    ],
    ids=lambda v: str(v),
)
def test_the_device_class_of_the_referenced_request_decides(claim: str, ref: Any, injected: bool) -> None:
    obj = pod(containers=[container("main", claims=[ref])], resource_claims=[pod_claim("c", template=claim)])
    result = mutate(obj, "CREATE", TEAM, DEFAULT, CLAIMS)
    assert (result.decision is Decision.MUTATED) is injected, result.reason
    assert result.warnings == []


def test_claims_and_limits_in_one_pod_merge_per_container() -> None:
    obj = pod(
        containers=[
            container("main", 1, claims=["gpu"]),
            container("nv", 1, "nvidia.com/gpu", claims=["gpu"]),
        ],
        resource_claims=[pod_claim("gpu")],
    )
    result = mutate(obj, "CREATE", TEAM, DEFAULT, CLAIMS)
    assert result.profiles == ("iluvatar", "nvidia")
    mutated = jsonpatch.apply_patch(obj, result.ops)
    assert [e["name"] for e in mutated["spec"]["containers"][1]["env"]] == ["LD_LIBRARY_PATH"]


def test_a_second_pass_makes_no_ops() -> None:
    obj = pod(
        containers=[container("main", claims=["gpu"]), container("side", claims=["n"])],
        resource_claims=[pod_claim("gpu"), pod_claim("n", template="nic")],
    )
    mutated = admit(obj)
    again = mutate(mutated, "CREATE", TEAM, DEFAULT, CLAIMS)
    assert again.decision is Decision.UNCHANGED and again.ops == []


def test_a_tfjob_template_with_a_claim_is_injected() -> None:
    worker = replica(container("tf", claims=["gpu"]))
    worker["template"]["spec"]["resourceClaims"] = [pod_claim("gpu")]
    mutated = admit(tfjob({"Worker": worker}))
    spec = mutated["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    assert spec["containers"][0]["volumeMounts"][0]["mountPath"] == "/usr/local/corex"


def test_claims_are_looked_up_in_the_objects_namespace() -> None:
    obj = pod(
        containers=[container("main", claims=["gpu"])],
        resource_claims=[pod_claim("gpu", template="elsewhere")],
    )
    result = mutate(obj, "CREATE", TEAM, ALLOW, CLAIMS)
    assert result.decision is Decision.SKIPPED
    assert 'ResourceClaimTemplate "elsewhere" in namespace "team"' in result.warnings[0]


@pytest.mark.parametrize("template", [True, False], ids=["template", "claim"])
def test_an_unknown_claim_is_allowed_unmodified_with_a_warning_when_configured(template: bool) -> None:
    ref = pod_claim("gpu", template="new") if template else pod_claim("gpu", claim="new")
    obj = pod(containers=[container("main", claims=["gpu"])], resource_claims=[ref])
    result = mutate(obj, "CREATE", TEAM, ALLOW, UNKNOWN_CLAIMS)
    kind = "ResourceClaimTemplate" if template else "ResourceClaim"
    assert result.decision is Decision.SKIPPED and result.ops == []
    assert result.allowed_unknown == "claim"  # counted and alerted on
    assert "policy.claimLookupFailure" in result.reason
    assert result.warnings == [
        f'ix-gpu did not inject GPU settings for container "main": the device classes of {kind} "new" '
        'in namespace "team" are not known to the webhook (policy.claimLookupFailure)'
    ]


def test_an_unknown_claim_is_denied_by_default() -> None:
    obj = pod(
        containers=[container("main", claims=["gpu"])], resource_claims=[pod_claim("gpu", template="new")]
    )
    result = mutate(obj, "CREATE", TEAM, DEFAULT, UNKNOWN_CLAIMS)
    assert result.decision is Decision.DENIED
    assert result.reason == (
        'container "main": the device classes of ResourceClaimTemplate "new" in namespace "team" are not '
        "known to the webhook; policy.claimLookupFailure is deny"
    )


def test_an_unknown_claim_leaves_a_limits_gpu_container_injected() -> None:
    obj = pod(
        containers=[container("main", 1), container("dra", claims=["gpu"])],
        resource_claims=[pod_claim("gpu", template="new")],
    )
    result = mutate(obj, "CREATE", TEAM, ALLOW, UNKNOWN_CLAIMS)
    assert result.decision is Decision.MUTATED and result.allowed_unknown == "claim"
    assert not any("/containers/1/" in op["path"] for op in result.ops)
    assert any("claimLookupFailure" in w for w in result.warnings)


def test_without_device_classes_in_the_config_claims_are_not_looked_up() -> None:
    obj = pod(containers=[container("main", claims=["gpu"])], resource_claims=[pod_claim("gpu")])
    result = mutate(obj, "CREATE", TEAM, NO_CLASSES, UNKNOWN_CLAIMS)
    assert result.decision is Decision.SKIPPED and result.warnings == []


class _Refusing:
    def device_requests(self, kind: str, namespace: str, name: str) -> None:
        raise AssertionError("claim facts read for a pod without resourceClaims")


def test_a_pod_without_resource_claims_never_reads_claim_facts() -> None:
    assert mutate(pod(), "CREATE", TEAM, DEFAULT, _Refusing()).decision is Decision.MUTATED
    assert mutate(pod(limits={"cpu": "1"}), "CREATE", TEAM, DEFAULT, _Refusing()).decision is Decision.SKIPPED


def test_references_to_claims_the_pod_does_not_declare_are_ignored() -> None:
    obj = pod(containers=[container("main", claims=["missing"])], resource_claims=[pod_claim("gpu")])
    obj["spec"]["resourceClaims"].append("x")
    obj["spec"]["containers"][0]["resources"]["claims"].append(7)
    assert mutate(obj, "CREATE", TEAM, DEFAULT, CLAIMS).decision is Decision.SKIPPED


# --------------------------------------------------------------------------- reading claims


def test_device_requests_of_claims_and_templates() -> None:
    either = device_request("acc", first_available=[("nic", NIC), ("big", DRA_CLASS)])
    assert device_requests(claim_template("t", [device_request("gpu"), either])) == (
        ("gpu", DRA_CLASS),
        ("acc/nic", NIC),
        ("acc/big", DRA_CLASS),
    )
    assert device_requests(resource_claim("c")) == (("gpu", DRA_CLASS),)
    # resource.k8s.io/v1beta1 put the class on the request itself.
    beta = {
        "kind": "ResourceClaim",
        "spec": {"devices": {"requests": [{"name": "g", "deviceClassName": "x.io"}]}},
    }
    assert device_requests(beta) == (("g", "x.io"),)


@pytest.mark.parametrize(
    "obj",
    [
        None,
        {"kind": "ResourceClaim"},
        {"kind": "ResourceClaim", "spec": {"devices": {"requests": "x"}}},
        {"kind": "ResourceClaim", "spec": {"devices": {"requests": [1, {"exactly": []}, {"name": 3}]}}},
        {
            "kind": "ResourceClaimTemplate",
            "spec": {"devices": {"requests": [{"name": "g", "deviceClassName": "x"}]}},
        },
        {"kind": "Pod", "spec": {}},
    ],
)
def test_device_requests_of_odd_shapes_is_empty(obj: Any) -> None:
    assert device_requests(obj) == ()


def test_claim_key_names_kind_namespace_and_name() -> None:
    assert claim_key(claim_template("t", namespace="a")) == (RESOURCE_CLAIM_TEMPLATE, "a", "t")
    assert claim_key(resource_claim("c")) == (RESOURCE_CLAIM, None, "c")
    assert claim_key(pod()) is None


def test_known_claims_without_a_namespace_stand_for_any_namespace() -> None:
    known = KnownClaims.of([claim_template("t")])
    assert known.device_requests(RESOURCE_CLAIM_TEMPLATE, "anywhere", "t") == (("gpu", DRA_CLASS),)
    assert known.device_requests(RESOURCE_CLAIM, "anywhere", "t") is None
