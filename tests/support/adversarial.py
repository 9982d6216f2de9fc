"""A deterministic corpus of hostile and broken AdmissionReviews, for the webhook's acceptance suite.

One Pod spec must never stall or exhaust the webhook. Each kind of thing an apiserver client can
put in an object is a category here, mixed with valid reviews and plain garbage:

- GPU quantities: ``"1e100000000"``, ``"1e10000000"``, a 5,001-digit count (as a string and as a
  JSON number), huge ints, floats, and every other shape a limit or request can take;
- ``ix-gpu.io/gpu-type`` annotations up to tens of thousands of values (~1 MB);
- nesting about 1,000 levels deep in tolerations, volumes named like the driver volume, env,
  annotations, node selectors, runtime classes, security contexts and TFJob (CRD) fields — orjson
  refuses more than 1,024 levels, so whether a 200 or a 400 is expected is decided by parsing the
  body the way the webhook does;
- a full, valid GPU pod or TFJob with random fields replaced by random JSON;
- Windows pods (``spec.os.name: windows``: no hostPath, no privileged);
- TFJobs with 64, 65 or 12,000 replica keys, or one key of up to 1.4 million characters (``/``
  and ``~`` double when escaped in a JSON pointer), or keys like ``""``, ``~1`` and ``a/b``;
- pods with up to 2,000 containers (past 2,000 patch ops the webhook denies);
- bodies near 3 MiB (accepted) and over it (413), random bytes, truncated and bit-flipped JSON;
- envelope damage (uids, namespaces and names of a megabyte, wrong types, odd operations).

Each :class:`Case` carries the statuses it may get and, where the answer is knowable, the decision
(``mutated``, ``denied``, ``skipped``): a crash hidden behind a tidy denial, or a valid pod denied
because a toleration was odd, fails the oracle, not just a 5xx check.

Everything derives from one seed (``random.Random``), so a failure is reproduced by re-running with
that seed. Large bodies are built once per seed and sent several times (as the same ``bytes``), so a
20,000-review corpus costs a few seconds and well under a gigabyte of client memory.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import yaml

from ix_gpu.webhook.core.mutation import MAX_GPU_CONTAINERS
from ix_gpu.webhook.core.templates import MAX_KEY_CHARS
from tests.support.objects import ILUVATAR, NVIDIA, json_paths, review
from tests.support.paths import ROOT

MiB = 1024 * 1024
MAX_BODY = 3 * MiB
"""The webhook's (and the apiserver's) body limit."""
DRIVER_VOLUME = "ix-gpu-iluvatar-driver"
GPU_TYPE = "ix-gpu.io/gpu-type"
SEED_VARIABLE = "IX_GPU_ADVERSARIAL_SEED"
NVIDIA_NODE_SELECTOR = ("ix-gpu.io/gpu.vendor", "nvidia")


def adversarial_config() -> str:
    """The built-in config with a richer NVIDIA profile: device nodes, a node selector, a runtime
    class, a required node expression and ``privileged: allowed``, so that every merge of the core
    (and every message quoting a user's conflicting value) is reachable by the corpus."""
    from ix_gpu.config.webhook_config import default_config

    config = yaml.safe_load(default_config().to_yaml())
    nvidia = next(p for p in config["profiles"] if p["name"] == "nvidia")
    nvidia["deviceNodes"]["inject"] = True
    nvidia["nodeSelector"] = {NVIDIA_NODE_SELECTOR[0]: NVIDIA_NODE_SELECTOR[1]}
    nvidia["runtimeClassName"] = "nvidia"
    nvidia["affinity"] = {"requiredNodeExpressions": [{"key": "ix-gpu.io/gpu.count", "operator": "Exists"}]}
    nvidia["privileged"] = "allowed"
    config["policy"]["privilegedNamespaces"] = ["team-a"]
    return yaml.safe_dump(config, sort_keys=False)


OK_OR_BAD = frozenset({200, 400})
OK = frozenset({200})
BAD = frozenset({400})
TOO_LARGE = frozenset({413})

MUTATED, DENIED, SKIPPED = "mutated", "denied", "skipped"


@dataclass(slots=True)
class Case:
    """One request of the corpus and what may come back."""

    category: str
    body: bytes
    statuses: frozenset[int] = OK_OR_BAD
    decision: str | None = None
    """The ``auditAnnotations.decision`` a 200 must carry (``denied`` also means status code 403);
    None when any decision is acceptable."""
    uid: str | None = None
    """The uid a 200 must echo; None: read it from the body when the answer is checked."""
    no_host_path: bool = False
    """A Windows pod: the patch must add no hostPath and no privileged."""
    send: str = "post"
    """``post``: a normal request on a keep-alive connection. ``declared-over``: headers announcing
    ``declared`` bytes, then only a little of the body. ``chunked-over``: a chunked body past 3 MiB."""
    declared: int = 0


def adversarial_seed() -> tuple[int, str]:
    """(seed, where it came from): ``IX_GPU_ADVERSARIAL_SEED`` when set, else the first 8 bytes of
    the checkout's HEAD commit hash, so each commit's CI run covers a different slice of the space."""
    configured = os.environ.get(SEED_VARIABLE)
    if configured:
        return int(configured, 0), f"${SEED_VARIABLE}"
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        return int(head[:16], 16), f"git HEAD {head[:12]}"
    except (OSError, subprocess.SubprocessError, ValueError):
        return 0, "default (no git HEAD)"


# ------------------------------------------------------------------------------ JSON helpers


def dumps(value: Any) -> bytes:
    """Compact JSON; falls back to the stdlib for integers beyond 64 bits (orjson refuses them)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()


_DEEP_MARKER = re.compile(rb'"\\u0001deep:(\d+):(\w)\\u0001"')


def deep_marker(depth: int, shape: str) -> str:
    """A string that :func:`expand_deep` replaces with ``depth`` levels of nesting of ``shape``.

    Nesting is spliced into the serialized bytes because neither JSON encoder writes 1,000 levels
    (orjson stops at 255, the stdlib's recursion at about 1,000)."""
    return f"\x01deep:{depth}:{shape}\x01"


def _deep_bytes(depth: int, shape: bytes) -> bytes:
    if shape == b"l":  # [[[...]]]
        return b"[" * depth + b"]" * depth
    if shape == b"m":  # {"k":[{"k":[...]}]}: objects and lists alternating
        half = depth // 2
        return b'{"k":[' * half + b"null" + b"]}" * half
    if shape == b"v":  # a volume named like the driver's, whose hostPath is such a volume, ...
        return b'{"name":"%s","hostPath":' % DRIVER_VOLUME.encode() * depth + b"{}" + b"}" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth  # "o"


def expand_deep(body: bytes) -> bytes:
    if b"\\u0001deep:" not in body:
        return body
    return _DEEP_MARKER.sub(lambda m: _deep_bytes(int(m[1]), m[2]), body)


def parses(body: bytes) -> frozenset[int]:
    """200 when the webhook's parser (orjson) takes ``body``'s nesting, else 400: orjson refuses
    more than 1,024 levels, and where a ~1,000-deep value lands decides which side it is on."""
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return BAD
    return OK


# ------------------------------------------------------------------------------ objects


def _uid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def envelope(
    obj: Any,
    uid: str,
    *,
    namespace: str = "team-a",
    operation: str = "CREATE",
    dry_run: bool = False,
    old: Any = None,
) -> dict[str, Any]:
    """An AdmissionReview v1 request around ``obj``, not copied: a deep copy costs more than the
    rest of a case here, and the case is serialized at once."""
    return review(
        obj, namespace=namespace, operation=operation, dry_run=dry_run, uid=uid, old=old, copied=False
    )


def gpu_container(name: str, gpus: Any = 1, resource: str = ILUVATAR, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": "corex:4.0.0", "resources": {"limits": {resource: gpus}}, **fields}


def full_pod(rng: random.Random, resource: str = ILUVATAR) -> dict[str, Any]:
    """A valid GPU pod with every commonly used field filled in (so that a random field to damage
    can be any of them)."""
    gpus = rng.choice([1, 2, "1", "4"])
    main = {
        "name": "main",
        "image": "registry.example.com/ml/trainer:2024.11",
        "command": ["python", "train.py"],
        "args": ["--epochs", "3"],
        "env": [
            {"name": "LD_LIBRARY_PATH", "value": "/opt/lib"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "MODE", "value": "train"},
        ],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "cfg", "mountPath": "/etc/cfg"}],
        "resources": {
            "limits": {resource: gpus, "cpu": "2", "memory": "4Gi"},
            "requests": {resource: gpus, "cpu": "1", "memory": "2Gi"},
        },
        "securityContext": {"runAsUser": 1000, "allowPrivilegeEscalation": True},
        "ports": [{"containerPort": 8080, "protocol": "TCP"}],
    }
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"trainer-{rng.randrange(10**6)}",
            "generateName": "trainer-",
            "namespace": "team-a",
            "labels": {"app": "trainer", "tier": "gpu"},
            "annotations": {GPU_TYPE: "bi-v100,mr-v100", "team": "ml"},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "trainer",
                    "uid": "0f3c",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "volumes": [{"name": "data", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "trainer"}}],
            "initContainers": [gpu_container("warmup", 1, resource, command=["sh", "-c", "true"])],
            "containers": [
                main,
                {"name": "sidecar", "image": "busybox", "resources": {"limits": {"cpu": "100m"}}},
            ],
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
                                ]
                            }
                        ]
                    }
                }
            },
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
            ],
            "securityContext": {"runAsNonRoot": True},
            "os": {"name": "linux"},
            "restartPolicy": "Never",
            "serviceAccountName": "trainer",
        },
    }
    if rng.random() < 0.3:  # as after an earlier injection: our volume is already there
        pod["spec"]["volumes"].append(
            {"name": DRIVER_VOLUME, "hostPath": {"path": "/usr/local/corex", "type": "Directory"}}
        )
    return pod


def tf_replica(*containers: dict[str, Any], replicas: int = 1, **template_fields: Any) -> dict[str, Any]:
    return {
        "replicas": replicas,
        "restartPolicy": "OnFailure",
        "template": {
            "metadata": {"labels": {"app": "mnist"}},
            "spec": {"containers": list(containers), **template_fields},
        },
    }


def full_tfjob(rng: random.Random, resource: str = NVIDIA) -> dict[str, Any]:
    """A valid kubeflow.org/v1 TFJob: a Chief and Workers asking for GPUs, a parameter server without."""

    def tf(gpus: Any) -> dict[str, Any]:
        container = gpu_container("tensorflow", gpus, resource, image="tensorflow/tensorflow:2.15.0-gpu")
        container["env"] = [{"name": "TF_CPP_MIN_LOG_LEVEL", "value": "2"}]
        return container

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": f"mnist-{rng.randrange(10**6)}", "namespace": "team-a"},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": 3},
            "tfReplicaSpecs": {
                "Chief": tf_replica(tf(1)),
                "Worker": tf_replica(tf(rng.choice([1, 2])), replicas=rng.randint(1, 4)),
                "PS": tf_replica({"name": "tensorflow", "image": "tensorflow/tensorflow:2.15.0"}),
            },
        },
    }


_KEYS = [
    "name", "value", "valueFrom", "hostPath", "path", "type", "mountPath", "key", "operator", "effect",
    "limits", "requests", "resources", ILUVATAR, NVIDIA, "privileged", "securityContext", "os",
    "nodeSelectorTerms", "matchExpressions", "values", "containers", "initContainers", "spec",
    "metadata", "annotations", "template", GPU_TYPE, "ix-gpu.io/inject", "", "~1/", "a/b~c", "é",
]  # fmt: skip
_SCALARS: list[Any] = [
    None, True, False, 0, 1, -1, 2**63 - 1, -(2**63), 2**64 - 1, 2**70, 1.5, -0.0, 1e308, 5e-324,
    "", "1", "0", "-1", "1e100000000", "1e10000000", "1.5", "1Ki", "windows", "Windows", DRIVER_VOLUME,
    "/usr/local/corex", "LD_LIBRARY_PATH", "disabled", "CREATE", "\u0000", "\u2028", "é", "~0~1/",
]  # fmt: skip


def random_json(rng: random.Random, budget: int = 3) -> Any:
    """Random JSON: scalars (including the values the webhook branches on), small lists and
    objects, long strings, and now and then nesting hundreds or thousands of levels deep."""
    roll = rng.random()
    if roll < 0.03:
        return deep_marker(rng.choice([50, 300, 900, 1000, 1015, 1030, 3000]), rng.choice("olm"))
    if roll < 0.05:
        return rng.choice(["x", "9", "\u00e9"]) * rng.choice([100, 100, 5001, 5001, 70_000])
    if budget <= 0 or roll < 0.6:
        return rng.choice(_SCALARS)
    if roll < 0.8:
        return [random_json(rng, budget - 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(_KEYS): random_json(rng, budget - 1) for _ in range(rng.randint(0, 4))}


def _set_path(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


def _delete_path(doc: Any, path: tuple[Any, ...]) -> None:
    target = doc
    for key in path[:-1]:
        target = target[key]
    if isinstance(target, dict):
        del target[path[-1]]
    else:
        target.pop(path[-1])


# ------------------------------------------------------------------------------ the corpus


Builder = Callable[[], Case]

QUANTITIES: list[tuple[Any, str]] = [
    ("1e100000000", DENIED),
    ("1e10000000", DENIED),
    ("-1e100000000", DENIED),
    ("1e-100000000", DENIED),
    ("0e100000000", SKIPPED),
    ("9" * 5001, DENIED),
    ("1" * 64, DENIED),
    ("1" * 65, DENIED),
    ("x" * 100_000, DENIED),
    (2**63 - 1, MUTATED),
    (2**63, DENIED),
    (2**64 - 1, DENIED),
    (2**64, DENIED),
    (10**30, DENIED),
    (-(2**63), DENIED),
    (1.5, DENIED),
    (1.0, MUTATED),
    (-0.0, SKIPPED),
    (1e308, DENIED),
    (5e-324, DENIED),
    (0.1, DENIED),
    ("1", MUTATED),
    ("01", MUTATED),
    ("+1", MUTATED),
    ("1.0", MUTATED),
    ("1000m", MUTATED),
    ("1k", MUTATED),
    ("1Ki", MUTATED),
    ("1e3", MUTATED),
    ("1E3", MUTATED),
    ("1e18", MUTATED),
    ("1e19", DENIED),
    ("1e40", DENIED),
    ("1e41", DENIED),
    ("0", SKIPPED),
    (0, SKIPPED),
    ("1.5", DENIED),
    ("500m", DENIED),
    ("-1", DENIED),
    (-1, DENIED),
    ("", DENIED),
    (" ", DENIED),
    ("abc", DENIED),
    ("0x10", DENIED),
    ("Infinity", DENIED),
    ("NaN", DENIED),
    (None, DENIED),
    (True, DENIED),
    ([], DENIED),
    ({}, DENIED),
    ([1], DENIED),
]
"""GPU limit values and the decision for a pod whose GPU container has that limit (alone, or with
an equal request)."""

RAW_NUMBERS = [b"1e100000000", b"1e10000000", b"9" * 5001, b"-" + b"9" * 5001, b"1e400", b"1e-100000000"]
"""Written into the body as JSON numbers, not strings: orjson refuses most (400)."""


class CorpusBuilder:
    """Builds the cases of one seed. ``build(count)`` draws categories by weight."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self._pool: dict[str, bytes] = {}

    # -------------------------------------------------------------- plumbing

    def _pooled(self, key: str, make: Callable[[], bytes]) -> bytes:
        """Large bodies are built once per seed and key, then sent again as the same bytes."""
        body = self._pool.get(key)
        if body is None:
            body = self._pool[key] = make()
        return body

    def _review(self, obj: Any, **kwargs: Any) -> tuple[bytes, str]:
        uid = _uid(self.rng)
        return expand_deep(dumps(envelope(obj, uid, **kwargs))), uid

    def _case(self, category: str, obj: Any, decision: str | None, **kwargs: Any) -> Case:
        body, uid = self._review(obj, **kwargs)
        return Case(category, body, OK, decision, uid)

    def _gpu_obj(self, kind: str = "") -> dict[str, Any]:
        """A full GPU Pod or TFJob (``kind``, else 70 % Pods), asking for either vendor's GPUs."""
        resource = self.rng.choice([ILUVATAR, NVIDIA])
        if kind == "Pod" or (not kind and self.rng.random() < 0.7):
            return full_pod(self.rng, resource)
        return full_tfjob(self.rng, resource)

    # -------------------------------------------------------------- categories

    def valid(self) -> Case:
        rng = self.rng
        choice = rng.randrange(12)
        if choice == 0:
            return self._case("valid", full_pod(rng, rng.choice([ILUVATAR, NVIDIA])), MUTATED)
        if choice == 1:
            return self._case("valid", full_tfjob(rng, rng.choice([ILUVATAR, NVIDIA])), MUTATED)
        if choice == 2:
            obj = full_pod(rng)
            obj["metadata"]["annotations"]["ix-gpu.io/inject"] = "disabled"
            return self._case("valid", obj, SKIPPED)
        if choice == 3:
            return self._case("valid", full_pod(rng), SKIPPED, namespace="kube-system")
        if choice == 4:
            operation = rng.choice(["UPDATE", "DELETE", "CONNECT"])
            current = None if operation == "DELETE" else full_pod(rng)
            return self._case("valid", current, SKIPPED, operation=operation, old=full_pod(rng))
        if choice == 5:
            return self._case("valid", full_pod(rng), MUTATED, dry_run=True)
        if choice == 6:
            obj = full_pod(rng)
            for container in obj["spec"]["containers"] + obj["spec"]["initContainers"]:
                container["resources"] = {"limits": {"cpu": "1"}}
            return self._case("valid", obj, SKIPPED)
        if choice == 7:
            legacy = {
                "apiVersion": "mlkube.io/v1beta1",
                "kind": "TfJob",
                "metadata": {"name": "legacy"},
                "spec": {"replica_specs": [{"template": {"spec": {"containers": [gpu_container("tf")]}}}]},
            }
            return self._case("valid", legacy, MUTATED)
        if choice == 8:
            deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}
            return self._case("valid", deployment, SKIPPED)
        if choice == 9:
            obj = full_pod(rng)
            obj["metadata"]["annotations"]["kubernetes.io/config.mirror"] = "x"
            return self._case("valid", obj, SKIPPED)
        if choice == 10:
            obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}
            obj["spec"]["containers"] = [gpu_container("main", rng.randint(1, 8))]
            return self._case("valid", obj, MUTATED)
        obj = full_pod(rng)
        obj["spec"]["containers"][0]["env"].append(
            {"name": "LD_LIBRARY_PATH", "value": "/usr/local/corex/lib64"}
        )
        return self._case("valid", obj, MUTATED)

    def quantity(self, pick: tuple[Any, str] | None = None, kind: str = "", raw: bytes = b"") -> Case:
        """A GPU pod or TFJob (``kind``) whose GPU containers' quantity is ``pick`` (value,
        decision) as a limit, or ``raw`` JSON number text; drawn (and placed) at random by default."""
        rng = self.rng
        obj = self._gpu_obj(kind)
        if raw or (pick is None and rng.random() < 0.1):  # a JSON number orjson may refuse
            placeholder = "\x01quantity\x01"
            self._set_gpu_quantity(obj, placeholder)
            body, uid = self._review(obj)
            number = raw or rng.choice(RAW_NUMBERS)
            return Case(
                "quantity-raw", body.replace(b'"\\u0001quantity\\u0001"', number), OK_OR_BAD, None, uid
            )
        value, decision = pick or rng.choice(QUANTITIES)
        placement = "limit" if pick else rng.choice(["limit", "limit", "both", "request", "cpu"])
        if placement == "cpu":
            for spec in self._specs(obj):
                spec["containers"][0]["resources"]["limits"]["cpu"] = value
            decision = MUTATED  # not a GPU resource: not the webhook's to judge
        else:
            self._set_gpu_quantity(obj, value, placement)
            if placement == "request":
                decision = DENIED  # a GPU request needs an equal limit
        return self._case(f"quantity-{placement}", obj, decision)

    def _specs(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        """Every pod spec in ``obj`` that asks for GPUs (the Pod's, or the TFJob's GPU replicas')."""
        if obj["kind"] == "Pod":
            return [obj["spec"]]
        replicas = obj["spec"]["tfReplicaSpecs"]
        return [replicas[name]["template"]["spec"] for name in ("Chief", "Worker")]

    def _set_gpu_quantity(self, obj: dict[str, Any], value: Any, placement: str = "limit") -> None:
        """Give every GPU container of ``obj`` this GPU ``limit``, the same limit and request
        (``both``), or only a ``request``."""
        for spec in self._specs(obj):
            for list_name in ("initContainers", "containers"):
                for container in spec.get(list_name, []):
                    resources = container.get("resources", {})
                    limits, requests = resources.get("limits", {}), resources.setdefault("requests", {})
                    for resource in (ILUVATAR, NVIDIA):
                        if resource not in limits:
                            continue
                        requests.pop(resource, None)
                        if placement == "request":
                            del limits[resource]
                        else:
                            limits[resource] = value
                        if placement in ("request", "both"):
                            requests[resource] = value

    def gpu_type(self, models: int = 0) -> Case:
        """A ``gpu-type`` annotation of ``models`` values (0: a drawn count and width)."""
        rng = self.rng
        if models or rng.random() < 0.03:  # tens of thousands of values: about 1 MB
            models = models or rng.choice([20_000, 60_000, 120_000])

            def make() -> bytes:
                obj = full_pod(random.Random(models))
                obj["metadata"]["annotations"][GPU_TYPE] = ",".join(f"bi-v{i}" for i in range(models))
                return dumps(envelope(obj, "gpu-type-huge"))

            return Case(
                "gpu-type-huge", self._pooled(f"gpu-type-{models}", make), OK, DENIED, "gpu-type-huge"
            )
        count = rng.choice([0, 1, 2, 15, 16, 17, 100, 1000])
        width = rng.choice([1, 8, 60, 70, 1100] if count <= 17 else [1, 8])
        values = [f"m{i}".ljust(width, rng.choice("ax -,")) for i in range(count)]
        raw: Any = ",".join(values) if rng.random() < 0.9 else random_json(rng)
        obj = self._gpu_obj()
        if obj["kind"] == "Pod":
            obj["metadata"]["annotations"][GPU_TYPE] = raw
        else:
            obj["spec"]["tfReplicaSpecs"]["Worker"]["template"]["metadata"]["annotations"] = {GPU_TYPE: raw}
        decision: str | None = MUTATED
        if isinstance(raw, str):
            if len(raw) > 1024 or len(raw.split(",")) > 16:
                decision = DENIED
        else:
            decision = None  # random JSON may be deep: any decision, the status says enough
        body, uid = self._review(obj)
        statuses = parses(body)
        return Case("gpu-type", body, statuses, decision if statuses == OK else None, uid)

    _DEEP_PLACES = (
        "toleration", "volume", "volume-hostPath", "env-value", "env-valueFrom", "annotation",
        "nodeSelector", "nodeSelector-value", "runtimeClassName", "affinity", "securityContext",
        "volumeMount", "gpu-limit", "crd-runPolicy", "crd-replica", "crd-template-spec", "metadata",
    )  # fmt: skip

    def deep(self, place: str = "", depth: int = 0, tfjob: bool | None = None) -> Case:
        """A value ``depth`` levels deep at ``place`` of a Pod or (``tfjob``) a TFJob's Worker
        template; each drawn when not given."""
        rng = self.rng
        if not depth:
            depth = rng.choice([100, 500, 900, 990, 1000, 1005, 1010, 1015, 1020, 1030, 1100, 5000])
            if rng.random() < 0.02:
                depth = rng.choice([20_000, 100_000])  # 40-200 KB of brackets: the heavy lane, then a 400
        place = place or rng.choice(self._DEEP_PLACES)
        marker = deep_marker(depth, rng.choice("olm") if depth <= 5000 else "l")
        if tfjob is None:
            tfjob = rng.random() < 0.3
        crd = tfjob or place.startswith("crd")
        # The NVIDIA profile of ADVERSARIAL_CONFIG sets a node selector and a runtime class, so a
        # deep value there meets the merge that compares (and quotes) the user's value.
        resource = (
            NVIDIA if place in ("nodeSelector-value", "runtimeClassName") else rng.choice([ILUVATAR, NVIDIA])
        )
        obj = full_tfjob(rng, resource) if crd else full_pod(rng, resource)
        spec = obj["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"] if crd else obj["spec"]
        main = spec["containers"][0]
        obj["metadata"].setdefault("annotations", {})
        decision = MUTATED
        if place == "toleration":
            spec.setdefault("tolerations", []).append(marker)
        elif place == "volume":
            spec.setdefault("volumes", []).append({"name": DRIVER_VOLUME, "hostPath": marker})
        elif place == "volume-hostPath":
            spec.setdefault("volumes", []).append(deep_marker(min(depth, 1100), "v"))
        elif place == "env-value":
            main["env"].append({"name": "LD_LIBRARY_PATH", "value": marker})
        elif place == "env-valueFrom":
            main["env"].append({"name": "LD_LIBRARY_PATH", "valueFrom": marker})
        elif place == "annotation":
            obj["metadata"]["annotations"][rng.choice([GPU_TYPE, "team", "ix-gpu.io/inject"])] = marker
        elif place == "nodeSelector":
            spec["nodeSelector"] = marker
        elif place == "nodeSelector-value":
            spec["nodeSelector"] = {NVIDIA_NODE_SELECTOR[0]: marker}
        elif place == "runtimeClassName":
            spec["runtimeClassName"] = marker
        elif place == "affinity":
            spec["affinity"] = {"nodeAffinity": marker}
        elif place == "securityContext":
            main["securityContext"] = marker
        elif place == "volumeMount":
            main["volumeMounts"] = [{"name": marker, "mountPath": "/usr/local/corex"}]
        elif place == "gpu-limit":
            self._set_gpu_quantity(obj, marker)
            decision = DENIED
        elif place == "crd-runPolicy":
            obj["spec"]["runPolicy"] = marker
        elif place == "crd-replica":
            obj["spec"]["tfReplicaSpecs"]["Deep"] = marker
        elif place == "crd-template-spec":
            obj["spec"]["tfReplicaSpecs"]["Deep"] = {"template": {"spec": {"containers": [marker]}}}
        else:
            obj["metadata"] = {"name": "deep", "annotations": marker, "labels": marker}
        body, uid = self._review(obj)
        statuses = parses(body)
        where = "tfjob" if crd else "pod"
        return Case(f"deep-{where}-{place}", body, statuses, decision if statuses == OK else None, uid)

    def wrong_types(self) -> Case:
        """A full valid GPU pod or TFJob with one to three fields replaced by random JSON (or removed).

        The envelope is intact and the object stays an object, so the answer must be a 200 (or a
        400 when a replacement nests past orjson's depth limit)."""
        rng = self.rng
        obj = self._gpu_obj()
        category = f"wrong-types-{obj['kind'].lower()}"
        paths = json_paths(obj)
        for path in rng.sample(paths, rng.randint(1, 3)):
            try:
                if rng.random() < 0.85:
                    _set_path(obj, path, random_json(rng))
                else:
                    _delete_path(obj, path)
            except (KeyError, IndexError, TypeError, AttributeError):
                pass  # an earlier replacement took the way there away
        body, uid = self._review(obj)
        return Case(category, body, parses(body), None, uid)

    def windows(self, tfjob: bool | None = None) -> Case:
        """A Windows GPU pod, or a TFJob with one or every template on Windows."""
        rng = self.rng
        if tfjob is False or (tfjob is None and rng.random() < 0.75):
            obj = full_pod(rng, rng.choice([ILUVATAR, NVIDIA]))
            obj["spec"]["os"] = {"name": "windows"}
            if rng.random() < 0.5:
                obj["spec"]["containers"][0]["securityContext"] = {"privileged": None, "windowsOptions": {}}
            body, uid = self._review(obj)
            return Case("windows-pod", body, OK, MUTATED, uid, no_host_path=True)
        obj = full_tfjob(rng)
        every = rng.random() < 0.5
        for name, replica in obj["spec"]["tfReplicaSpecs"].items():
            if every or name == "Worker":
                replica["template"]["spec"]["os"] = {"name": "windows"}
        body, uid = self._review(obj)
        return Case("windows-tfjob", body, OK, MUTATED, uid, no_host_path=every)

    def tfjob_keys(self, keys: int = 0, length: int = 0, fill: str = "") -> Case:
        """A TFJob with ``keys`` replica specs, or one replica key ``length`` characters of
        ``fill`` long, or an odd key (each drawn when not given)."""
        rng = self.rng
        roll = 0.0 if keys else 0.6 if length else rng.random()
        if roll < 0.5:
            if not keys:
                keys = rng.choice([1, 2, 16, 63, 64, 65, 100, 300])
                if rng.random() < 0.05:
                    keys = rng.choice([2000, 12_000])  # heavy: 0.4-2.6 MB

            def make() -> bytes:
                replicas = {f"Worker{i}": tf_replica(gpu_container("tf", 1, NVIDIA)) for i in range(keys)}
                obj = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "wide"}}
                obj["spec"] = {"tfReplicaSpecs": replicas}
                return dumps(envelope(obj, f"tfjob-{keys}-keys"))

            body = self._pooled(f"tfjob-{keys}", make)
            statuses = TOO_LARGE if len(body) > MAX_BODY else OK
            decision = MUTATED if keys <= 64 else DENIED
            return Case("tfjob-many-keys", body, statuses, decision, f"tfjob-{keys}-keys")
        if roll < 0.8:
            if not length:
                length = rng.choice([100, 1000, 20_000, 65_000])
                if rng.random() < 0.1:
                    length = rng.choice([500_000, 1_400_000])
            fill = fill or rng.choice(["W", "/", "~", "é", "~1"])

            def make_long() -> bytes:
                key = (fill * length)[:length]
                obj = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "long"}}
                obj["spec"] = {"tfReplicaSpecs": {key: tf_replica(gpu_container("tf", 1, NVIDIA))}}
                return dumps(envelope(obj, f"tfjob-key-{length}"))

            body = self._pooled(f"tfjob-key-{length}-{fill}", make_long)
            # No Kubernetes name is longer than 253 characters; the core refuses such a template
            # key rather than repeat it in every patch op (templates.MAX_KEY_CHARS).
            decision = MUTATED if length <= MAX_KEY_CHARS else DENIED
            return Case("tfjob-long-key", body, OK, decision, f"tfjob-key-{length}")
        obj = full_tfjob(rng)
        odd = rng.choice(["", "~", "/", "a/b", "~1", "0", "-", "Worker ", "ワーカー", "\u0000"])
        obj["spec"]["tfReplicaSpecs"][odd] = tf_replica(gpu_container("tf", 1, NVIDIA))
        return self._case("tfjob-odd-key", obj, MUTATED)

    def many_containers(self, count: int = 0) -> Case:
        """A pod with ``count`` containers (drawn when 0), mostly all asking for a GPU."""
        rng = self.rng
        gpu = rng.random() < 0.8
        init = rng.random() < 0.3
        if not count:
            count = rng.choice([10, 50, 100, 300, 500, 900, 1100, 1500])
            if rng.random() < 0.1:
                count = 2000

        def make() -> bytes:
            containers = [
                gpu_container(f"c{i}", 1) if gpu or i == 0 else {"name": f"c{i}", "image": "busybox"}
                for i in range(count)
            ]
            spec: dict[str, Any] = {"containers": containers}
            if init:
                spec["initContainers"] = [gpu_container(f"i{i}", 1) for i in range(count // 10)]
            obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wide"}, "spec": spec}
            return dumps(envelope(obj, f"containers-{count}"))

        body = self._pooled(f"containers-{count}-{gpu}-{init}", make)
        gpu_containers = (count + (count // 10 if init else 0)) if gpu else 1 + (count // 10 if init else 0)
        # The core refuses more than MAX_GPU_CONTAINERS (256) before injecting anything.
        decision = MUTATED if gpu_containers <= MAX_GPU_CONTAINERS else DENIED
        return Case("many-containers", body, OK, decision, f"containers-{count}")

    _NEAR_LIMIT = (
        "padded-annotation", "big-env", "many-plain-containers", "many-gpu-containers", "huge-gpu-type",
        "exactly-3-mib", "many-volumes", "big-tfjob", "huge-uid",
    )  # fmt: skip

    def near_limit(self, kind: str = "") -> Case:
        """A body just under (or at) 3 MiB, of several shapes: one long string, whitespace, and many
        small objects (the expensive kind to parse and walk)."""
        kind = kind or self.rng.choice(self._NEAR_LIMIT)
        target = MAX_BODY if kind == "exactly-3-mib" else MAX_BODY - self.rng.choice([1, 4096])
        uid = f"near-{kind}"
        body = self._pooled(f"near-{kind}-{target}", lambda: near_limit_body(kind, target, uid))
        decision = DENIED if kind in ("many-gpu-containers", "huge-gpu-type") else MUTATED
        if kind == "huge-uid":
            start = body.index(b'"uid":"') + 7
            uid = body[start : body.index(b'"', start)].decode()
        return Case(f"near-3mib-{kind}", body, OK, decision, uid)

    def over_limit(self, chunked: bool | None = None) -> Case:
        """More than 3 MiB: announced by Content-Length (413 before the body is read) or streamed
        chunked (413 once 3 MiB have come)."""
        rng = self.rng
        if chunked is False or (chunked is None and rng.random() < 0.8):
            declared = rng.choice([MAX_BODY + 1, MAX_BODY + 4096, 4 * MiB, 16 * MiB, 2**40])
            return Case("over-3mib-declared", b"{", TOO_LARGE, send="declared-over", declared=declared)
        return Case("over-3mib-chunked", b"", TOO_LARGE, send="chunked-over", declared=MAX_BODY + MiB // 4)

    def garbage(self, roll: int = -1) -> Case:
        """Not an AdmissionReview, or a damaged one: random bytes (``roll`` 0), truncated (1),
        bit-flipped, spliced, random JSON, invalid UTF-8, duplicate keys, trailing junk."""
        rng = self.rng
        valid, _ = self._review(self._gpu_obj())
        roll = roll if roll >= 0 else rng.randrange(10)
        if roll == 0:
            body = rng.randbytes(rng.choice([0, 1, 10, 300, 3000]))
        elif roll == 1:
            body = valid[: rng.randrange(len(valid))]
        elif roll in (2, 3):
            data = bytearray(valid)
            for _ in range(rng.randint(1, 6)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            body = bytes(data)
        elif roll == 4:
            at = rng.randrange(len(valid))
            body = valid[:at] + rng.randbytes(rng.randint(1, 20)) + valid[at:]
        elif roll == 5:
            body = expand_deep(dumps(random_json(rng, 5)))
        elif roll == 6:
            body = rng.choice([b"[]", b"null", b"42", b'"AdmissionReview"', b"{}", b"\xef\xbb\xbf{}", b"NaN"])
        elif roll == 7:  # invalid UTF-8, lone surrogates, NaN inside an otherwise valid review
            body = valid.replace(
                b'"team-a"', rng.choice([b'"\xff\xfe"', b'"\\ud800"', b"NaN", b"Infinity"]), 1
            )
        elif roll == 8:  # duplicate keys: orjson keeps the last
            body = valid[:-1] + b',"request":' + dumps(random_json(rng)) + b"}"
        else:
            body = valid + rng.choice([b"x", b"}", b"{}", b"\x00", b"\n\n"])
        return Case("garbage", body, OK_OR_BAD)

    def envelope_damage(self) -> Case:
        rng = self.rng
        obj = self._gpu_obj()
        doc = envelope(obj, _uid(rng))
        request = doc["request"]
        roll = rng.randrange(8)
        if roll == 0:
            request["uid"] = random_json(rng)
        elif roll == 1:
            length = rng.choice([100, 1000, 10_000])
            if rng.random() < 0.1:
                length = rng.choice([100_000, 1_000_000])
            request["uid"] = "u" * length
        elif roll == 2:
            request["namespace"] = rng.choice(
                ["n" * rng.choice([64, 10_000]), "", "kube-system", random_json(rng)]
            )
        elif roll == 3:
            request["operation"] = rng.choice(["create", "Create", "", "X" * 10_000, None, 1, "DELETE"])
        elif roll == 4:
            request["kind"] = random_json(rng)
            request["requestKind"] = random_json(rng)
        elif roll == 5:
            request["dryRun"] = random_json(rng)
            request["oldObject"] = random_json(rng)
        elif roll == 6:
            obj["metadata"]["name"] = "p" * rng.choice([253, 10_000, 10_000, 100_000])
        else:
            doc[rng.choice(["apiVersion", "kind", "request"])] = random_json(rng)
        body = expand_deep(dumps(doc))
        return Case("envelope", body, OK_OR_BAD)

    _ENVELOPE_FIELDS = (
        ("apiVersion",), ("kind",), ("request",), ("request", "uid"), ("request", "operation"),
        ("request", "namespace"), ("request", "name"), ("request", "kind"), ("request", "dryRun"),
        ("request", "oldObject"), ("request", "userInfo"),
    )  # fmt: skip

    def envelope_deep(self, path: tuple[str, ...], depth: int = 1000) -> Case:
        """An envelope field nested ``depth`` deep: the webhook reads and quotes these (in its
        400 messages too), before the core's bounded walks ever see the object."""
        doc = envelope(full_pod(self.rng), _uid(self.rng))
        _set_path(doc, path, deep_marker(depth, self.rng.choice("olm")))
        body = expand_deep(dumps(doc))
        return Case(f"envelope-deep-{'.'.join(path)}", body, OK_OR_BAD)

    # -------------------------------------------------------------- the mix

    def weights(self) -> list[tuple[Builder, float]]:
        return [
            (self.valid, 12),
            (self.quantity, 14),
            (self.gpu_type, 5),
            (self.deep, 6),
            (self.wrong_types, 28),
            (self.windows, 3),
            (self.tfjob_keys, 3),
            (self.many_containers, 2),
            (self.near_limit, 0.3),
            (self.over_limit, 0.25),
            (self.garbage, 20),
            (self.envelope_damage, 6.45),
        ]

    def required(self) -> list[Case]:
        """One case of each kind the issue names, in every run whatever the seed (about 100)."""
        cases = []
        for value in ("1e100000000", "1e10000000", "9" * 5001, 2**63, 2**64, 10**30, 1.5, 1e308, 2**63 - 1):
            decision = next(d for v, d in QUANTITIES if type(v) is type(value) and v == value)
            cases += [self.quantity((value, decision), kind) for kind in ("Pod", "TFJob")]
        for number in (b"1e100000000", b"1e10000000", b"9" * 5001):
            cases += [self.quantity(kind=kind, raw=number) for kind in ("Pod", "TFJob")]
        cases.append(self.gpu_type(models=60_000))
        for place in self._DEEP_PLACES:
            for depth in (1000, 1015):
                cases.append(self.deep(place, depth, tfjob=False))
                if not place.startswith("crd"):
                    cases.append(self.deep(place, depth, tfjob=True))
        cases += [self.windows(tfjob=False), self.windows(tfjob=True)]
        cases += [
            self.tfjob_keys(keys=65),
            self.tfjob_keys(keys=12_000),
            self.tfjob_keys(length=1_400_000, fill="/"),
        ]
        cases += [self.many_containers(count=1500)]
        cases += [self.near_limit(kind) for kind in self._NEAR_LIMIT]
        cases += [self.over_limit(chunked=False), self.over_limit(chunked=True)]
        cases += [self.garbage(roll=0), self.garbage(roll=1)]
        cases += [self.envelope_deep(path) for path in self._ENVELOPE_FIELDS]
        return cases

    def build(self, count: int) -> list[Case]:
        """``count`` cases: :meth:`required`, then each category at least once, then draws by weight."""
        builders, weights = zip(*self.weights(), strict=True)
        cases = self.required() + [builder() for builder in builders]
        for builder in self.rng.choices(builders, weights, k=max(0, count - len(cases))):
            cases.append(builder())
        self.rng.shuffle(cases)
        return cases


def near_limit_body(kind: str, target: int, uid: str) -> bytes:
    """A review of ``kind`` filled to ``target`` bytes: lists of small objects are sized by
    measuring a sample, strings exactly; trailing whitespace (valid JSON) makes up the rest."""

    def pod(n: int) -> dict[str, Any]:
        main = gpu_container("main")
        obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": kind, "annotations": {}},
            "spec": {"containers": [main]},
        }
        if kind == "big-env":
            main["env"] = [{"name": f"E{i}", "value": "v" * 40} for i in range(n)]
        elif kind == "many-plain-containers":
            obj["spec"]["containers"] += [
                {"name": f"c{i}", "image": "busybox", "env": [{"name": "A", "value": "b" * 20}]}
                for i in range(n)
            ]
        elif kind == "many-gpu-containers":
            obj["spec"]["containers"] = [
                gpu_container(f"c{i}", env=[{"name": "A", "value": "b"}]) for i in range(max(n, 1))
            ]
        elif kind == "many-volumes":
            obj["spec"]["volumes"] = [{"name": f"v{i}", "emptyDir": {}} for i in range(n)]
        elif kind == "big-tfjob":
            env = [{"name": f"E{j}", "value": "x" * 40} for j in range(max(n, 1))]
            replicas = {f"W{i}": tf_replica(gpu_container("tf", 1, NVIDIA, env=env)) for i in range(60)}
            obj = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": kind}}
            obj["spec"] = {"tfReplicaSpecs": replicas}
        return obj

    listed = kind in ("big-env", "many-plain-containers", "many-gpu-containers", "many-volumes", "big-tfjob")
    if listed:
        small, sample = len(dumps(envelope(pod(0), uid))), len(dumps(envelope(pod(10_000), uid)))
        count = int((target - small) / ((sample - small) / 10_000))
        body = dumps(envelope(pod(count), uid))
        while len(body) > target:  # item sizes grow with their index's digits: scale down and retry
            count = int(count * (target - small) / (len(body) - small) * 0.999)
            body = dumps(envelope(pod(count), uid))
    else:
        obj = pod(0)
        body = dumps(envelope(obj, uid))
        room = target - len(body) - 64
        if kind == "huge-uid":
            body = body.replace(f'"{uid}"'.encode(), b'"' + b"u" * room + b'"', 1)
        elif kind in ("padded-annotation", "huge-gpu-type"):
            obj["metadata"]["annotations"][GPU_TYPE if kind == "huge-gpu-type" else "notes"] = "a," * (
                room // 2
            )
            body = dumps(envelope(obj, uid))
    if len(body) > target:
        raise AssertionError(f"near-limit {kind}: {len(body)} bytes is over {target}")
    return body + b" " * (target - len(body))


def build_corpus(seed: int, count: int) -> list[Case]:
    return CorpusBuilder(seed).build(count)
