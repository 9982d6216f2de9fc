"""``ix-gpu check-injection``: ask the apiserver to dry-run a GPU pod and check that the webhook
injected it. This is what ``helm test`` runs after an install or upgrade: it proves the whole
path (MutatingWebhookConfiguration → Service → a ready webhook pod → the patch applied), which
no readiness probe sees, and it stores nothing (``dryRun=All``; the webhook declares no side
effects, so the apiserver calls it for dry runs).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import orjson

from ix_gpu.config.text import one_line
from ix_gpu.devicemodel import labels


@dataclass(frozen=True)
class CheckOptions:
    namespace: str
    resource: str
    kubeconfig: str | None
    timeout: float


def check_pod(resource: str) -> dict[str, Any]:
    """The smallest pod the webhook must inject: one container asking for one ``resource``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"ix-gpu-check-{secrets.token_hex(4)}",
            "labels": {"app.kubernetes.io/name": "ix-gpu-check"},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "gpu", "image": "ix-gpu-check", "resources": {"limits": {resource: "1"}}}
            ],
        },
    }


def verdict(created: dict[str, Any]) -> tuple[bool, str]:
    """(injected, what to print) for the pod the apiserver answered with."""
    metadata = created.get("metadata") if isinstance(created, dict) else None
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    annotations = annotations if isinstance(annotations, dict) else {}
    injected = annotations.get(labels.INJECTED)
    if isinstance(injected, str) and injected:
        return True, f"injected: {labels.INJECTED}={injected}"
    decision = {k: v for k, v in annotations.items() if k.startswith(labels.PREFIX)}
    return False, (
        f"the pod came back without {labels.INJECTED}: the webhook did not mutate it "
        f"(ix-gpu annotations: {decision or 'none'}; is the namespace excluded or opted out, or the "
        "resource not in the config's profiles?)"
    )


def run_check(options: CheckOptions) -> int:
    from kubernetes import client

    from ix_gpu.kube.apiserver import client_configuration

    try:
        # Typed as Any: with _preload_content=False the client returns the raw urllib3 response,
        # which its annotations (written for the deserialised models) do not describe.
        api: Any = client.CoreV1Api(client.ApiClient(client_configuration(options.kubeconfig)))
        response = api.create_namespaced_pod(
            options.namespace,
            check_pod(options.resource),
            dry_run="All",
            _preload_content=False,
            _request_timeout=options.timeout,
        )
        created = orjson.loads(response.data)
    except client.ApiException as exc:
        reason = one_line(exc.body or exc.reason, 500)
        print(f"the apiserver refused the dry-run pod: HTTP {exc.status}: {reason}")
        return 1
    except Exception as exc:  # config, network, TLS: say what, in one line
        print(f"cannot dry-run a pod in {options.namespace}: {one_line(exc, 500)}")
        return 1
    injected, message = verdict(created)
    print(message)
    return 0 if injected else 1
