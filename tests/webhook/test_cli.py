"""``ix-gpu mutate`` / ``config`` / ``certs``: golden outputs and exit codes, run as a user would."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import jsonschema
import pytest
import yaml
from cryptography import x509

from ix_gpu.config.webhook_config import json_schema
from ix_gpu.webhook.certs.authority import serving_cert_sans
from tests.support.cli import ix_gpu
from tests.support.paths import EXAMPLES

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text(), f"output differs from {path} (UPDATE_GOLDEN=1 to accept)"


SEED = ["-f", str(EXAMPLES / "seed-tfjob.yaml"), "--config", str(EXAMPLES / "seed-config.yaml")]


@pytest.mark.parametrize(
    ("golden", "args"),
    [
        ("seed-tfjob.yaml", [*SEED, "--namespace", "ml-team"]),
        ("seed-tfjob.patch.json", [*SEED, "--namespace", "ml-team", "--patch"]),
        ("gpu-pod.yaml", ["-f", str(EXAMPLES / "gpu-pod.yaml")]),
        ("gpu-pod.patch.json", ["-f", str(EXAMPLES / "gpu-pod.yaml"), "--patch"]),
    ],
)
def test_mutate_golden(golden: str, args: list[str]) -> None:
    result = ix_gpu("mutate", *args)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    check_golden(golden, result.stdout)


def test_mutate_multi_document_from_stdin_with_warnings() -> None:
    docs = (
        (EXAMPLES / "gpu-pod.yaml").read_text()
        + "\n---\n"
        + "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"
    )
    result = ix_gpu(
        "mutate", "-f", "-", "--namespace-label", "pod-security.kubernetes.io/enforce=baseline", stdin=docs
    )
    assert result.returncode == 0
    assert result.stdout.count("---\n") == 1
    assert "kind: ConfigMap" in result.stdout
    assert "Warning: Pod/corex-example: spec.volumes: hostPath volumes not injected" in result.stderr


def test_mutate_namespace_annotation_opts_out() -> None:
    result = ix_gpu(
        "mutate",
        "-f",
        str(EXAMPLES / "gpu-pod.yaml"),
        "--patch",
        "-v",
        "--namespace-annotation",
        "ix-gpu.io/inject=disabled",
    )
    assert result.returncode == 0
    assert result.stdout == "[]\n"
    assert 'skipped: namespace "default" opted out' in result.stderr


def test_mutate_a_list_mutates_its_items() -> None:
    # What `kubectl get pods -o yaml` prints: the items are the objects the webhook would see.
    gpu_pod = yaml.safe_load((EXAMPLES / "gpu-pod.yaml").read_text())
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    listed = yaml.safe_dump(
        {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": [gpu_pod, config_map]}
    )
    result = ix_gpu("mutate", "-f", "-", stdin=listed)
    assert result.returncode == 0, result.stderr
    out = yaml.safe_load(result.stdout)
    assert out["kind"] == "List"
    mutated, untouched = out["items"]
    assert mutated["metadata"]["annotations"]["ix-gpu.io/injected"].startswith("iluvatar@")
    assert untouched == config_map
    # --patch: one patch per item, as the webhook would send one per object.
    patches = ix_gpu("mutate", "-f", "-", "--patch", stdin=listed).stdout.splitlines()
    assert len(patches) == 2
    assert json.loads(patches[0]) and json.loads(patches[1]) == []
    # A denied item is left out and makes the exit code 1, as a denied document does.
    bad = listed.replace("iluvatar.com/gpu: 1", "iluvatar.com/gpu: 1.5")
    denied = ix_gpu("mutate", "-f", "-", stdin=bad)
    assert denied.returncode == 1
    assert yaml.safe_load(denied.stdout)["items"] == [config_map]
    assert "Pod/corex-example denied" in denied.stderr


def test_mutate_denied_exits_1_with_reason() -> None:
    bad = (EXAMPLES / "gpu-pod.yaml").read_text().replace("iluvatar.com/gpu: 1", "iluvatar.com/gpu: 1.5")
    result = ix_gpu("mutate", "-f", "-", stdin=bad)
    assert result.returncode == 1
    assert result.stdout == ""
    assert (
        'Pod/corex-example denied: container "corex-example": limit of iluvatar.com/gpu: 1.5' in result.stderr
    )


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["mutate", "-f", "/does/not/exist"], None, "cannot read /does/not/exist"),
        (["mutate", "-f", "-"], "a: [unclosed", "not valid YAML or JSON"),
        (["mutate", "-f", "-", "--config", "/nope.yaml"], "{}", "invalid config: /nope.yaml: cannot read"),
        (["mutate"], None, "the following arguments are required: -f/--filename"),
        (["mutate", "-f", "-", "--namespace-label", "novalue"], "{}", "expected KEY=VALUE"),
        (["certs", "generate", "--out", "/tmp/x", "--ip", "300.1.1.1"], None, "is not an IP address"),
        (["bogus"], None, "invalid choice"),
        (["webhook", "--shutdown-delay", "-1"], None, "must be between 0 and 3600 seconds, got -1"),
        (["webhook", "--shutdown-delay", "nan"], None, "must be between 0 and 3600 seconds, got nan"),
        (["config", "schema", "extra"], None, "unrecognized arguments: extra"),
        (["config", "scheme"], None, "invalid choice"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str], stdin: str | None, message: str) -> None:
    result = ix_gpu(*args, stdin=stdin)
    assert result.returncode == 2, result
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_mutate_rejects_invalid_config_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("profiles:\n- name: x\n  resources: [a.com/gpu]\n  privileged: sometimes\n")
    result = ix_gpu("mutate", "-f", str(EXAMPLES / "gpu-pod.yaml"), "--config", str(config))
    assert result.returncode == 2
    assert "profiles[0].privileged" in result.stderr


def test_config_default_round_trips_and_validates(tmp_path: Path) -> None:
    default = ix_gpu("config", "default")
    assert default.returncode == 0
    path = tmp_path / "default.yaml"
    path.write_text(default.stdout)
    validated = ix_gpu("config", "validate", str(path))
    assert validated.returncode == 0, validated.stderr
    assert "valid (2 profiles, 3 workloads" in validated.stdout


def test_config_schema_prints_the_models_json_schema(tmp_path: Path) -> None:
    result = ix_gpu("config", "schema")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    schema = json.loads(result.stdout)
    assert schema == json_schema()
    # What the schema accepts, the webhook loads: the built-in default, as `config default` prints it.
    jsonschema.Draft7Validator(schema).validate(yaml.safe_load(ix_gpu("config", "default").stdout))
    assert list(jsonschema.Draft7Validator(schema).iter_errors({"policy": {"excludedNamespace": ["a"]}}))


def test_config_validate_names_unknown_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("policy:\n  excludedNamespace: [a]\n")
    result = ix_gpu("config", "validate", str(path))
    assert result.returncode == 1
    assert "policy.excludedNamespace: unknown key" in result.stderr


def test_certs_generate(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    result = ix_gpu("certs", "generate", "--out", str(out), "--dns", "ix-gpu.ix.svc", "--ip", "127.0.0.1")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    assert stat.S_IMODE((out / "tls.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "ca.key").stat().st_mode) == 0o600
    assert serving_cert_sans((out / "tls.crt").read_bytes()) == (["ix-gpu.ix.svc"], ["127.0.0.1"])
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.SERVER_AUTH in usages


# --------------------------------------------------------------------------- DRA pods

DRA = EXAMPLES / "dra-gpu-pod.yaml"


def _dra_pod(stdout: str) -> dict[str, object]:
    docs = [d for d in yaml.safe_load_all(stdout) if d and d["kind"] == "Pod"]
    assert len(docs) == 1
    return docs[0]


def test_mutate_a_dra_pod_with_its_claim_template() -> None:
    result = ix_gpu("mutate", "-f", str(DRA), "--claim-template", str(DRA))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    corex = _dra_pod(result.stdout)["spec"]["containers"][0]  # type: ignore[index]
    # Served only through its claim: no LD_LIBRARY_PATH, so the image's stands (the claim's CDI
    # spec puts the driver in the linker cache).
    assert "env" not in corex
    assert corex["volumeMounts"][0]["mountPath"] == "/usr/local/corex"


def test_mutate_injects_the_board_chip_and_memory_share_examples() -> None:
    """examples/dra-board-or-chip.yaml (claims of any.gpu.iluvatar.com, which the built-in Iluvatar
    profile names beside gpu.iluvatar.com) and examples/dra-memory-share.yaml."""
    pods = []
    for example in ("dra-board-or-chip.yaml", "dra-memory-share.yaml"):
        path = str(EXAMPLES / example)
        result = ix_gpu("mutate", "-f", path, "--claim-template", path)
        assert result.returncode == 0, result.stderr
        pods += [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "Pod"]
    assert [p["metadata"]["name"] for p in pods] == ["corex-board", "corex-chip", "corex-share"]
    for pod in pods:
        corex = pod["spec"]["containers"][0]
        assert "env" not in corex  # claims only: the image's LD_LIBRARY_PATH stands
        assert corex["volumeMounts"][0]["mountPath"] == "/usr/local/corex"


def test_mutate_a_dra_pod_without_claim_facts_says_it_would_be_refused() -> None:
    """Without ``--claims`` its claim is unknown, and ``claimLookupFailure: deny`` (the default)
    refuses it, as the webhook would: exit 1 and the reason."""
    result = ix_gpu("mutate", "-f", str(DRA), "--patch")
    assert result.returncode == 1, result.stderr
    assert (
        'Pod/corex-dra denied: container "corex": the device classes of ResourceClaimTemplate "bi-v100" '
        'in namespace "default" are not known to the webhook; policy.claimLookupFailure is deny'
    ) in result.stderr


def test_mutate_a_dra_pod_without_claim_facts_warns_and_leaves_it_under_allow_unmodified(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "apiVersion: ix-gpu.io/v1alpha1\nkind: WebhookConfig\n"
        "policy:\n  claimLookupFailure: allow-unmodified\n"
    )
    result = ix_gpu("mutate", "-f", str(DRA), "--patch", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n[]\n"
    assert (
        'Warning: Pod/corex-dra: ix-gpu did not inject GPU settings for container "corex": the device '
        'classes of ResourceClaimTemplate "bi-v100" in namespace "default" are not known to the webhook '
        "(policy.claimLookupFailure)"
    ) in result.stderr


def test_mutate_claim_files_are_repeatable_and_take_resource_claims(tmp_path: Path) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {
            "resourceClaims": [
                {"name": "a", "resourceClaimName": "shared"},
                {"name": "b", "resourceClaimTemplateName": "nic"},
            ],
            "containers": [
                {"name": "one", "image": "x", "resources": {"claims": [{"name": "a"}]}},
                {"name": "two", "image": "x", "resources": {"claims": [{"name": "b"}]}},
            ],
        },
    }
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "shared", "namespace": "ml"},
        "spec": {
            "devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.iluvatar.com"}}]}
        },
    }
    nic = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "nic"},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "n", "exactly": {"deviceClassName": "nic.io"}}]}}
        },
    }
    (tmp_path / "pod.json").write_text(json.dumps(pod))
    (tmp_path / "claim.yaml").write_text(yaml.safe_dump(claim))
    (tmp_path / "nic.yaml").write_text(yaml.safe_dump(nic))
    args = ["-f", str(tmp_path / "pod.json"), "--claim-template", str(tmp_path / "claim.yaml")]
    result = ix_gpu("mutate", *args, "--claim-template", str(tmp_path / "nic.yaml"), "--patch")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    paths = [op["path"] for op in json.loads(result.stdout)]
    one = "/spec/containers/0/volumeMounts"
    assert one in paths and not any(p.startswith("/spec/containers/1/") for p in paths)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
            "holds no ResourceClaimTemplate or ResourceClaim",
        ),
        ("kind: ResourceClaim\nmetadata: {}\n", "a ResourceClaim without metadata.name"),
        ("a: [", "claims.yaml"),
    ],
)
def test_mutate_claim_files_that_are_not_claims_are_refused(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "claims.yaml"
    path.write_text(content)
    result = ix_gpu("mutate", "-f", str(DRA), "--claim-template", str(path))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("ix-gpu mutate: ") and result.stderr.count("\n") == 1
    assert message in result.stderr


def test_mutate_a_missing_claim_file_is_an_input_error(tmp_path: Path) -> None:
    result = ix_gpu("mutate", "-f", str(DRA), "--claim-template", str(tmp_path / "absent.yaml"))
    assert result.returncode == 2
    assert "absent.yaml" in result.stderr and result.stderr.count("\n") == 1
