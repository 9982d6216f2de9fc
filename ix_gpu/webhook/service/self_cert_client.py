"""Self mode's :class:`~ix_gpu.webhook.service.self_certs.ClusterApi` over the official kubernetes
client (kubeconfig or in-cluster service account).

The reconcile loop knows only the protocol, so it is tested against a local stand-in; this adapter
is tested against a real apiserver. The kubernetes client is imported when it is first used.
"""

from __future__ import annotations

import base64
from typing import Any

from ix_gpu.runtime.kube import client_configuration
from ix_gpu.webhook.service.self_certs import Owner, StoredSecret


class KubernetesClusterApi:
    """:class:`ClusterApi` over the official client (kubeconfig or in-cluster service account)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._client = client
        self._core = client.CoreV1Api(api_client)
        self._admission = client.AdmissionregistrationV1Api(api_client)

    @classmethod
    def connect(cls, kubeconfig: str | None) -> KubernetesClusterApi:
        from kubernetes import client

        return cls(client.ApiClient(client_configuration(kubeconfig)))

    def _status(self, exc: Exception) -> int | None:
        status = getattr(exc, "status", None)
        return status if isinstance(status, int) else None

    def read_secret(self, namespace: str, name: str) -> StoredSecret | None:
        from kubernetes.client.exceptions import ApiException

        try:
            secret = self._core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if self._status(exc) == 404:
                return None
            raise
        data = {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}
        version = secret.metadata.resource_version if secret.metadata is not None else None
        return StoredSecret(data, str(version or ""))

    def _body(
        self, name: str, data: dict[str, bytes], resource_version: str | None, owner: Owner | None
    ) -> Any:
        c = self._client
        owners = None
        if owner is not None:
            reference = c.V1OwnerReference(
                api_version=owner.api_version, kind=owner.kind, name=owner.name, uid=owner.uid
            )
            owners = [reference]
        return c.V1Secret(
            metadata=c.V1ObjectMeta(
                name=name,
                resource_version=resource_version,
                labels={"app.kubernetes.io/managed-by": "ix-gpu-webhook"},
                owner_references=owners,
            ),
            type="kubernetes.io/tls",
            data={key: base64.b64encode(value).decode() for key, value in data.items()},
        )

    def create_secret(self, namespace: str, name: str, data: dict[str, bytes], owner: Owner | None) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            self._core.create_namespaced_secret(namespace, self._body(name, data, None, owner))
        except ApiException as exc:
            if self._status(exc) == 409:
                return False
            raise
        return True

    def replace_secret(
        self, namespace: str, name: str, data: dict[str, bytes], resource_version: str, owner: Owner | None
    ) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            body = self._body(name, data, resource_version, owner)
            self._core.replace_namespaced_secret(name, namespace, body)
        except ApiException as exc:
            if self._status(exc) == 409:
                return False
            raise
        return True

    def configuration_uid(self, configuration: str) -> str | None:
        from kubernetes.client.exceptions import ApiException

        try:
            mwc = self._admission.read_mutating_webhook_configuration(configuration)
        except ApiException as exc:
            if self._status(exc) == 404:
                return None
            raise
        return str(mwc.metadata.uid) if mwc.metadata is not None and mwc.metadata.uid else None

    def read_ca_bundles(self, configuration: str) -> list[tuple[str, bytes | None]]:
        mwc = self._admission.read_mutating_webhook_configuration(configuration)
        out: list[tuple[str, bytes | None]] = []
        for webhook in mwc.webhooks or []:
            bundle = webhook.client_config.ca_bundle
            out.append((webhook.name, base64.b64decode(bundle) if bundle else None))
        return out

    def patch_ca_bundles(self, configuration: str, patch: list[dict[str, Any]]) -> None:
        # A list body makes the client send application/json-patch+json.
        self._admission.patch_mutating_webhook_configuration(configuration, patch)
