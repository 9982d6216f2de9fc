"""Pods, TFJobs and AdmissionReview requests as the apiserver would send them.

One set of builders for every suite: the core's table tests, the service over HTTPS, the chart's CEL
matchConditions and the real apiserver. Defaults give the common case (a Pod with one container
asking for one Iluvatar GPU); every part a test cares about is a parameter.
"""

from __future__ import annotations

import base64
import copy
import json
import uuid
from collections.abc import Mapping
from typing import Any

import jsonpatch

ILUVATAR = "iluvatar.com/gpu"
NVIDIA = "nvidia.com/gpu"
IMAGE = "corex:4.0.0"
NAMESPACE = "team-a"
"""The namespace of a review when none is named."""

GROUP_VERSION_KIND = {
    "Pod": {"group": "", "version": "v1", "kind": "Pod"},
    "TFJob": {"group": "kubeflow.org", "version": "v1", "kind": "TFJob"},
}
RESOURCE = {
    "Pod": {"group": "", "version": "v1", "resource": "pods"},
    "TFJob": {"group": "kubeflow.org", "version": "v1", "resource": "tfjobs"},
}


def container(
    name: str = "main",
    gpus: Any = None,
    resource: str = ILUVATAR,
    *,
    limits: Mapping[str, Any] | None = None,
    requests: Mapping[str, Any] | None = None,
    claims: list[str | dict[str, str]] | None = None,
    image: str = IMAGE,
    **fields: Any,
) -> dict[str, Any]:
    """A container; ``gpus`` adds ``resource: gpus`` to its limits. ``resources`` is present only when
    limits, requests or claims are given (an empty mapping gives an empty one). ``claims``: names of
    the pod's ``resourceClaims`` (or ``{"name", "request"}`` entries) the container uses."""
    body: dict[str, Any] = {"name": name, "image": image, **fields}
    resources: dict[str, Any] = {}
    if limits is not None or gpus is not None:
        resources["limits"] = {**(limits or {}), **({} if gpus is None else {resource: gpus})}
    if requests is not None:
        resources["requests"] = dict(requests)
    if claims is not None:
        resources["claims"] = [{"name": c} if isinstance(c, str) else dict(c) for c in claims]
    if resources:
        body["resources"] = resources
    return body


def pod(
    name: str = "p",
    containers: list[Any] | None = None,
    *,
    namespace: str | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    init_containers: list[Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    requests: Mapping[str, Any] | None = None,
    resource_claims: list[dict[str, str]] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A v1 Pod. Without ``containers``: one container ``main``, built from ``limits``, ``requests``
    and ``fields`` when any is given, else asking for one Iluvatar GPU. ``resource_claims``: its
    ``spec.resourceClaims`` (see :func:`pod_claim`)."""
    if containers is None:
        if limits is None and requests is None and not fields:
            containers = [container("main", 1)]
        else:
            containers = [container("main", limits=limits, requests=requests, **fields)]
    else:
        assert limits is None and requests is None and not fields, "container fields go into containers"
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if annotations:
        metadata["annotations"] = annotations
    if labels:
        metadata["labels"] = labels
    spec: dict[str, Any] = {"containers": containers}
    if init_containers is not None:
        spec["initContainers"] = init_containers
    if resource_claims is not None:
        spec["resourceClaims"] = resource_claims
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


DRA_CLASS = "gpu.iluvatar.com"
"""The DeviceClass of Iluvatar GPUs under DRA (the chart's, and the built-in profile's)."""


def pod_claim(name: str = "gpu", *, template: str | None = None, claim: str | None = None) -> dict[str, str]:
    """A ``spec.resourceClaims`` entry: from a ResourceClaimTemplate (default: one named ``name``)
    or, with ``claim``, an existing ResourceClaim shared with other pods."""
    if claim is not None:
        return {"name": name, "resourceClaimName": claim}
    return {"name": name, "resourceClaimTemplateName": template or name}


def device_request(
    name: str = "gpu",
    device_class: str | None = DRA_CLASS,
    *,
    first_available: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """A resource.k8s.io/v1 device request: ``exactly`` one device of ``device_class``, or with
    ``first_available`` the (subrequest, device class) alternatives in order."""
    if first_available is not None:
        subrequests = [{"name": sub, "deviceClassName": cls} for sub, cls in first_available]
        return {"name": name, "firstAvailable": subrequests}
    return {"name": name, "exactly": {"deviceClassName": device_class}}


def resource_claim(
    name: str = "gpu", requests: list[dict[str, Any]] | None = None, *, namespace: str | None = None
) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceClaim (default: one Iluvatar GPU)."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    devices = {"requests": requests if requests is not None else [device_request()]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {"devices": devices},
    }


def claim_template(
    name: str = "gpu", requests: list[dict[str, Any]] | None = None, *, namespace: str | None = None
) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceClaimTemplate whose claims hold ``requests``."""
    claim = resource_claim(name, requests, namespace=namespace)
    return {**claim, "kind": "ResourceClaimTemplate", "spec": {"spec": claim["spec"]}}


def replica(*containers: dict[str, Any], replicas: int | None = None, **fields: Any) -> dict[str, Any]:
    """A TFJob replica spec whose pod template runs ``containers``; ``fields`` (e.g. restartPolicy)
    go next to ``replicas``."""
    spec: dict[str, Any] = {} if replicas is None else {"replicas": replicas}
    return {**spec, **fields, "template": {"spec": {"containers": list(containers)}}}


def tfjob(
    replica_specs: dict[str, Any],
    *,
    name: str = "mnist",
    namespace: str | None = None,
    run_policy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A kubeflow.org/v1 TFJob with these ``tfReplicaSpecs``."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    spec: dict[str, Any] = {"tfReplicaSpecs": replica_specs}
    if run_policy is not None:
        spec["runPolicy"] = run_policy
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": metadata, "spec": spec}


def gpu_tfjob_replicas(gpus: Any = 1, resource: str = NVIDIA) -> dict[str, Any]:
    """A Chief and two Workers running TensorFlow, each asking for ``gpus`` (none when ``None``)."""

    def tf() -> dict[str, Any]:
        return container("tensorflow", gpus, resource, image="tensorflow/tensorflow:2.15.0-gpu")

    return {
        "Chief": replica(tf(), replicas=1, restartPolicy="OnFailure"),
        "Worker": replica(tf(), replicas=2, restartPolicy="OnFailure"),
    }


def gpu_tfjob(gpus: Any = 1, resource: str = NVIDIA, namespace: str | None = None) -> dict[str, Any]:
    """The seed's kind of TFJob: ``gpu_tfjob_replicas``, ``runPolicy.cleanPodPolicy: None``."""
    return tfjob(
        gpu_tfjob_replicas(gpus, resource), namespace=namespace, run_policy={"cleanPodPolicy": "None"}
    )


def review(
    obj: dict[str, Any] | None,
    *,
    namespace: str = NAMESPACE,
    operation: str = "CREATE",
    dry_run: bool = False,
    uid: str | None = None,
    old: dict[str, Any] | None = None,
    copied: bool = True,
) -> dict[str, Any]:
    """An admission.k8s.io/v1 AdmissionReview request for ``obj``: a deep copy, so callers may
    damage it, unless ``copied=False`` (for callers that serialize it at once and build thousands)."""
    source: dict[str, Any] = obj if isinstance(obj, dict) else old if isinstance(old, dict) else {}
    kind_field, metadata_field = source.get("kind"), source.get("metadata")
    kind: str = kind_field if isinstance(kind_field, str) else "Pod"
    metadata: dict[str, Any] = metadata_field if isinstance(metadata_field, dict) else {}
    name = metadata["name"] if isinstance(metadata.get("name"), str) else ""
    built = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": GROUP_VERSION_KIND.get(kind, {"group": "example.com", "version": "v1", "kind": kind}),
            "resource": RESOURCE.get(kind, {"group": "example.com", "version": "v1", "resource": "things"}),
            "requestKind": GROUP_VERSION_KIND.get(kind),
            "name": name,
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": old,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }
    return copy.deepcopy(built) if copied else built


def apply_response(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """The object after the response's patch (a copy; unchanged when there is no patch)."""
    if "patch" not in response:
        return copy.deepcopy(obj)
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert isinstance(ops, list) and ops
    return jsonpatch.apply_patch(obj, ops)  # type: ignore[no-any-return]


def json_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``value`` (keys and list indexes), outermost first; the empty
    path of ``value`` itself is not included. Fuzzers pick from these to damage one field."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            out += json_paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            out += json_paths(child, (*prefix, index))
    return out
