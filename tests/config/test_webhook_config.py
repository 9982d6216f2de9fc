"""The webhook config schema: strict, camelCase, errors that name the field; its JSON Schema; the
built-in profiles."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from ix_gpu.config.input_files import ConfigError
from ix_gpu.config.webhook_config import (
    Workload,
    default_config,
    json_schema,
    load_config,
    parse_config,
)
from tests.support.paths import EXAMPLES


def profile(**extra: Any) -> dict[str, Any]:
    return {"name": "p", "resources": ["a.com/gpu"], **extra}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"profile": []}, "profile: unknown key"),
        (
            {"profiles": [profile(volumes=[{"name": "v", "hostPath": "/a", "mountPath": "/b", "ro": 1}])]},
            "profiles[0].volumes[0].ro: unknown key",
        ),
        (
            {"profiles": [profile(volumes=[{"name": "v", "hostPath": "rel", "mountPath": "/b"}])]},
            "profiles[0].volumes[0].hostPath: Value error, must be an absolute path",
        ),
        (
            {"profiles": [profile(volumes=[{"name": "V_1", "hostPath": "/a", "mountPath": "/b"}])]},
            "profiles[0].volumes[0].name: Value error, must be a DNS label",
        ),
        (
            {"profiles": [profile(env=[{"name": "A", "value": "1", "mode": "prepend"}])]},
            "profiles[0].env[0].mode: Input should be 'set-if-absent', 'prepend-path', 'append-path', "
            "'prepend-path-if-set', 'append-path-if-set' or 'override'",
        ),
        ({"profiles": [profile(privileged="yes")]}, "profiles[0].privileged"),
        ({"profiles": [profile(), profile()]}, "duplicate profile name 'p'"),
        (
            {"profiles": [profile(env=[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}])]},
            "duplicate env name 'A'",
        ),
        ({"profiles": [{"name": "p", "resources": []}]}, "profiles[0].resources"),
        (
            {"profiles": [profile(tolerations=[{"operator": "Equal", "value": "x"}])]},
            "an empty key needs operator Exists",
        ),
        (
            {"profiles": [profile(affinity={"requiredNodeExpressions": [{"key": "k", "operator": "In"}]})]},
            "operator In needs at least one value",
        ),
        (
            {"workloads": [{"apiVersion": "v1", "kind": "Pod", "templatePaths": ["spec..template"]}]},
            "workloads[0].templatePaths",
        ),
        ({"apiVersion": "ix-gpu.io/v2"}, "apiVersion"),
        ({"policy": {"conflictPolicy": "overwrite"}}, "policy.conflictPolicy"),
    ],
)
def test_invalid_configs_name_the_field(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, "cfg.yaml")
    assert str(caught.value).startswith("cfg.yaml: ")
    assert message in str(caught.value)


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("profiles: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(scalar)


WEBHOOK_CONFIG_HEAD = (
    "apiVersion: ix-gpu.io/v1alpha1\nkind: WebhookConfig\nprofiles:\n- name: p\n  resources: [a.com/gpu]\n"
)
"""Lines 1-5: one valid profile; what a case appends starts on line 6."""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (WEBHOOK_CONFIG_HEAD + "  privilegd: allowed\n", "line 6: profiles[0].privilegd: unknown key"),
        (
            WEBHOOK_CONFIG_HEAD + "  privileged: sometimes\n",
            "line 6: profiles[0].privileged: Input should be",
        ),
        (
            "apiVersion: ix-gpu.io/v1alpha1\npolicy:\n  conflictPolicy: overwrite\n",
            "line 3: policy.conflictPolicy: ",
        ),
        (
            WEBHOOK_CONFIG_HEAD + "policy:\n  conflictPolicy: overwrite\nworkload: []\n",
            "line 7: policy.conflictPolicy: ",
        ),
    ],
)
def test_errors_in_a_file_name_key_and_line(tmp_path: Path, text: str, message: str) -> None:
    """As the plugin's config errors do: the operator goes to the line, not only to the field."""
    path = tmp_path / "webhook.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: {message}")


def test_every_error_of_a_file_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "webhook.yaml"
    path.write_text(WEBHOOK_CONFIG_HEAD + "  privilegd: allowed\nworkload: []\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert (
        str(caught.value)
        == f"{path}: line 6: profiles[0].privilegd: unknown key; line 7: workload: unknown key"
    )


def test_empty_file_is_the_default(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty) == default_config()
    assert load_config(None) == default_config()


def test_default_profiles_inject_no_device_nodes_and_no_privilege() -> None:
    for item in default_config().profiles:
        assert item.privileged.value == "never"
        assert item.device_nodes.inject is False
        assert all(not v.host_path.startswith("/dev/") for v in item.all_volumes())


def test_digest_tracks_content() -> None:
    base = default_config()
    assert base.digest() == default_config().digest()
    changed = parse_config({"policy": {"privilegedNamespaces": ["x"]}})
    assert changed.digest() != base.digest()


def test_default_yaml_round_trips() -> None:
    text = default_config().to_yaml()
    assert parse_config(yaml.safe_load(text)) == default_config()


def test_nvidia_default_mounts_no_driver_and_sets_no_library_path() -> None:
    """The NVIDIA container toolkit (or CDI) provides the driver: a hostPath of /usr/local/cuda
    would shadow the CUDA toolkit in the user's image and fail on nodes without that directory."""
    nvidia = next(p for p in default_config().profiles if p.name == "nvidia")
    assert nvidia.volumes == ()
    assert nvidia.env == ()
    assert all("cuda" not in v.host_path for v in nvidia.all_volumes())
    assert [t.key for t in nvidia.tolerations] == ["nvidia.com/gpu"]
    iluvatar = next(p for p in default_config().profiles if p.name == "iluvatar")
    assert [(v.host_path, v.read_only) for v in iluvatar.volumes] == [("/usr/local/corex", True)]
    assert [(e.name, e.value) for e in iluvatar.env] == [("LD_LIBRARY_PATH", "/usr/local/corex/lib64")]


def test_the_host_driver_example_is_the_previous_nvidia_default() -> None:
    config = load_config(EXAMPLES / "nvidia-hostpath-driver.yaml")
    nvidia = next(p for p in config.profiles if p.name == "nvidia")
    assert [(v.host_path, v.mount_path, v.read_only) for v in nvidia.volumes] == [
        ("/usr/local/cuda", "/usr/local/cuda", True)
    ]
    assert [(e.name, e.value, e.mode.value) for e in nvidia.env] == [
        ("LD_LIBRARY_PATH", "/usr/local/cuda/lib64", "prepend-path")
    ]
    assert config.profiles[0] == default_config().profiles[0]  # Iluvatar as built in
    # Pinned: a change here changes the injected annotation of every object mutated under this
    # config (its next pass strips and re-injects the same items). It was the built-in default's
    # digest before NVIDIA left the driver to the toolkit; DRA (deviceClasses,
    # policy.claimLookupFailure) changed it, again the any-form DeviceClass (boards and chips), and
    # the lookup policies' defaults turning deny.
    assert config.digest() == "bc04628fa9"


@pytest.mark.parametrize(
    ("kind", "resource"),
    [
        ("Pod", "pods"),
        ("TFJob", "tfjobs"),
        ("TfJob", "tfjobs"),
        ("PyTorchJob", "pytorchjobs"),
        ("Policy", "policies"),
        ("Status", "statuses"),
        ("*Job", "*"),
    ],
)
def test_workload_resource_is_guessed_from_the_kind_as_kubernetes_does(kind: str, resource: str) -> None:
    workload = Workload(api_version="example.com/v1", kind=kind, template_paths=("spec.template",))
    assert workload.resource_name() == resource
    named = Workload(api_version="example.com/v1", kind=kind, template_paths=("t",), resource="things")
    assert named.resource_name() == "things"


def test_an_unset_workload_resource_leaves_the_digest_alone() -> None:
    bare = {"apiVersion": "example.com/v1", "kind": "Job", "templatePaths": ["spec.template"]}
    assert "resource" not in parse_config({"workloads": [bare]}).model_dump(by_alias=True)["workloads"][0]
    named = parse_config({"workloads": [{**bare, "resource": "jobs"}]})
    assert named.workloads[0].resource == "jobs"
    assert named.digest() != parse_config({"workloads": [bare]}).digest()
    with pytest.raises(ConfigError, match=r"workloads\[0\].resource"):
        parse_config({"workloads": [{**bare, "resource": "Jobs"}]})


# --------------------------------------------------------------------------- JSON Schema


def _validator() -> jsonschema.Draft7Validator:
    schema = json_schema()
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.mark.parametrize("path", ["seed-config.yaml", "nvidia-hostpath-driver.yaml"], ids=lambda p: str(p))
def test_json_schema_accepts_the_default_and_the_examples(path: str) -> None:
    validator = _validator()
    validator.validate(default_config().model_dump(mode="json", by_alias=True, exclude_none=True))
    validator.validate(yaml.safe_load((EXAMPLES / path).read_text()))


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"profile": []}, "profile"),
        (
            {"profiles": [profile(volumes=[{"name": "v", "hostPath": "/a", "mountPath": "/b", "ro": 1}])]},
            "ro",
        ),
        ({"profiles": [profile(env=[{"name": "A", "value": "1", "mode": "prepend"}])]}, "prepend"),
        ({"profiles": [{"name": "p", "resources": []}]}, "resources"),
        ({"profiles": [{"name": "p", "resource": ["a.com/gpu"]}]}, "resource"),
        (
            {"workloads": [{"apiVersion": "v1", "kind": "Pod", "templatePaths": ["."], "resource": "Pods"}]},
            "Pods",
        ),
        ({"policy": {"conflictPolicy": "overwrite"}}, "overwrite"),
        ({"apiVersion": "ix-gpu.io/v2"}, "apiVersion"),
        ({"profiles": [profile(workload_resource="x")]}, "workload_resource"),
        # Kubernetes' name rules, as far as a pattern says them: helm refuses these before installing.
        ({"profiles": [{"name": "p", "resources": ["*"]}]}, "profiles.0.resources.0"),
        ({"profiles": [{"name": "p", "resources": ["cpu"]}]}, "profiles.0.resources.0"),
        ({"profiles": [profile(nodeSelector={"bad key": "x"})]}, "profiles.0.nodeSelector"),
        ({"profiles": [profile(nodeSelector={"k": "a b"})]}, "profiles.0.nodeSelector.k"),
        ({"profiles": [profile(env=[{"name": "A=B", "value": ""}])]}, "profiles.0.env.0.name"),
        ({"profiles": [profile(runtimeClassName="RT")]}, "profiles.0.runtimeClassName"),
        ({"policy": {"excludedNamespaces": ["Team_A"]}}, "policy.excludedNamespaces.0"),
    ],
)
def test_json_schema_rejects_what_the_models_reject(data: dict[str, Any], where: str) -> None:
    errors = list(_validator().iter_errors(data))
    assert errors, data
    # The offending key or value, named in the message or in the error's location.
    found = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]
    assert any(where in text for text in found), found
    with pytest.raises(ConfigError):
        parse_config(data)


def test_json_schema_is_generated_from_the_models_with_camel_case_keys() -> None:
    schema = json_schema()
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert set(schema["properties"]) == {"apiVersion", "kind", "profiles", "workloads", "policy"}
    profile_schema = schema["definitions"]["Profile"]
    assert profile_schema["additionalProperties"] is False
    assert {"deviceNodes", "nodeSelector", "runtimeClassName"} <= set(profile_schema["properties"])
    assert (
        "Dotted paths to PodTemplateSpecs"
        in schema["definitions"]["Workload"]["properties"]["templatePaths"]["description"]
    )
    refs = {m for m in re.findall(r'"\$ref": "#/definitions/(\w+)"', json.dumps(schema))}
    assert refs <= set(schema["definitions"])


# --------------------------------------------------------------------------- DRA device classes


def test_device_classes_map_to_profiles_and_the_iluvatar_default_has_its_own() -> None:
    config = default_config()
    assert [(p.name, p.device_classes) for p in config.profiles] == [
        ("iluvatar", ("gpu.iluvatar.com", "any.gpu.iluvatar.com")),
        ("nvidia", ()),
    ]
    dumped = config.model_dump(mode="json", by_alias=True)
    assert dumped["profiles"][0]["deviceClasses"] == ["gpu.iluvatar.com", "any.gpu.iluvatar.com"]
    assert dumped["policy"]["claimLookupFailure"] == "deny"
    assert dumped["policy"]["namespaceLookupFailure"] == "deny"
    allow = parse_config({"policy": {"claimLookupFailure": "allow-unmodified"}})
    assert allow.policy.claim_lookup_failure == "allow-unmodified"


def test_unset_device_classes_leave_the_digest_alone() -> None:
    bare = parse_config({"profiles": [profile()]})
    assert "deviceClasses" not in bare.model_dump(by_alias=True)["profiles"][0]
    assert parse_config({"profiles": [profile(deviceClasses=["gpu.example.com"])]}).digest() != bare.digest()


@pytest.mark.parametrize(
    ("classes", "message"),
    [
        (["GPU.example.com"], "profiles[0].deviceClasses[0]: Value error, must be a DNS subdomain"),
        (["gpu_example"], "profiles[0].deviceClasses[0]: Value error, must be a DNS subdomain"),
        (["a" * 254], "profiles[0].deviceClasses[0]: Value error, must be no more than 253 characters"),
        (["gpu.example.com", "gpu.example.com"], "duplicate device class 'gpu.example.com'"),
    ],
)
def test_invalid_device_classes_name_the_field(classes: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"profiles": [profile(deviceClasses=classes)]}, "cfg.yaml")
    assert message in str(caught.value)


def test_claim_lookup_failure_takes_the_namespace_lookup_choices() -> None:
    with pytest.raises(
        ConfigError, match=r"policy.claimLookupFailure: Input should be 'allow-unmodified' or 'deny'"
    ):
        parse_config({"policy": {"claimLookupFailure": "ignore"}})
