"""The Kubeflow training operator (v1.8.1, TFJob only) in a real-node cluster, so that a TFJob really
yields pods: its controller creates each replica's pod from the (already mutated) template.

The binary is built from the Go module proxy (``build-go-command.sh training-operator``) into a
scratch image (``build-images.sh``). What it needs in the cluster is written here from what its
``main.go`` and cert rotator do, not taken from its manifests:

- namespace ``kubeflow`` (``MY_POD_NAMESPACE``): its Secret ``training-operator-webhook-cert``,
  which the rotator fills with a CA and serving certificate and which the pod mounts at
  ``CERT_DIR`` (the rotator is ready only once the mounted files match), and Service
  ``training-operator`` (443 -> 9443), the DNS name in that certificate;
- the ValidatingWebhookConfiguration ``validator.training-operator.kubeflow.org`` whose caBundle the
  rotator keeps, pointing TFJob creates and updates at ``/validate-kubeflow-org-v1-tfjob``;
- RBAC for TFJobs and what a job owns (pods, services, events), and the two objects above.

Its readiness (``/readyz`` on 8081) waits for the certificates, so "available" means it validates
and reconciles.
"""

from __future__ import annotations

from typing import Any

from tests.k8s.k8s_tier import KubeAPI
from tests.support.waiting import wait_until

NAMESPACE = "kubeflow"
NAME = "training-operator"
WEBHOOK_CONFIG = "validator.training-operator.kubeflow.org"
DEPLOYMENT = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{NAME}"
CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"
"""Where the operator's webhook server reads its certificate (fixed in its cert package)."""


def _rules() -> list[dict[str, Any]]:
    def rule(group: str, resources: list[str], verbs: list[str]) -> dict[str, Any]:
        return {"apiGroups": [group], "resources": resources, "verbs": verbs}

    everything = ["create", "delete", "get", "list", "patch", "update", "watch"]
    return [
        rule("kubeflow.org", ["tfjobs", "tfjobs/status", "tfjobs/finalizers"], everything),
        rule("", ["pods", "services", "events", "configmaps", "serviceaccounts"], everything),
        rule("", ["secrets"], ["get", "list", "watch", "update"]),
        rule(
            "admissionregistration.k8s.io",
            ["validatingwebhookconfigurations"],
            ["get", "list", "watch", "update"],
        ),
        rule("scheduling.volcano.sh", ["podgroups"], everything),
        rule("scheduling.x-k8s.io", ["podgroups"], everything),
        rule("coordination.k8s.io", ["leases"], everything),
        rule("autoscaling", ["horizontalpodautoscalers"], everything),
    ]


def manifests(image: str) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) in creation order."""
    labels = {"app.kubernetes.io/name": NAME}
    ns = f"/api/v1/namespaces/{NAMESPACE}"
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    container = {
        "name": NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["--enable-scheme=tfjob", "--webhook-server-port=9443"],
        "env": [{"name": "MY_POD_NAMESPACE", "value": NAMESPACE}],
        "ports": [{"containerPort": 9443, "name": "webhook"}, {"containerPort": 8081, "name": "probes"}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8081}, "periodSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8081}, "periodSeconds": 10},
        "securityContext": {"runAsNonRoot": True, "readOnlyRootFilesystem": True},
        # The cert rotator writes its certificates into the Secret and waits until the kubelet has
        # mounted that Secret where the webhook server reads them: only then is it ready.
        "volumeMounts": [{"name": "cert", "mountPath": CERT_DIR, "readOnly": True}],
        "resources": {"limits": {"memory": "256Mi"}},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": NAME,
                    "containers": [container],
                    "volumes": [{"name": "cert", "secret": {"secretName": f"{NAME}-webhook-cert"}}],
                    "terminationGracePeriodSeconds": 5,
                },
            },
        },
    }
    webhook = {
        "name": "validator.tfjob.training-operator.kubeflow.org",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "clientConfig": {
            "service": {"namespace": NAMESPACE, "name": NAME, "path": "/validate-kubeflow-org-v1-tfjob"}
        },
        "rules": [
            {
                "apiGroups": ["kubeflow.org"],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["tfjobs"],
            }
        ],
    }
    return [
        ("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}),
        (f"{ns}/serviceaccounts", {"metadata": {"name": NAME}}),
        (f"{rbac}/clusterroles", {"metadata": {"name": NAME}, "rules": _rules()}),
        (
            f"{rbac}/clusterrolebindings",
            {
                "metadata": {"name": NAME},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
                "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
            },
        ),
        (f"{ns}/secrets", {"metadata": {"name": f"{NAME}-webhook-cert"}, "type": "Opaque"}),
        (
            f"{ns}/services",
            {
                "metadata": {"name": NAME},
                "spec": {"selector": labels, "ports": [{"name": "webhook", "port": 443, "targetPort": 9443}]},
            },
        ),
        (
            "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
            {"metadata": {"name": WEBHOOK_CONFIG}, "webhooks": [webhook]},
        ),
        (f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", deployment),
    ]


def install(api: KubeAPI, image: str, timeout_s: float = 180) -> None:
    """Create the operator's objects and wait until its Deployment is available (certificates made,
    controllers started)."""
    for collection, body in manifests(image):
        status, reply = api.request("POST", collection, body)
        if status not in (201, 409):
            raise RuntimeError(f"POST {collection}: {status} {reply}")

    def available() -> bool:
        status, reply = api.request("GET", DEPLOYMENT)
        return status == 200 and (reply.get("status") or {}).get("availableReplicas") == 1

    def details() -> str:
        status, pods = api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
        if status != 200:
            return str(pods)
        out = []
        for pod in pods.get("items", []):
            log = api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}/log")[1]
            out.append(
                f"{pod['metadata']['name']}: {pod.get('status', {}).get('phase')}; log: {str(log)[-2500:]}"
            )
        return "\n".join(out)

    wait_until(available, "the training operator available", timeout_s, interval=1, details=details)
