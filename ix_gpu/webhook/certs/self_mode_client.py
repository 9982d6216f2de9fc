"""Self mode's :class:`~ix_gpu.webhook.certs.self_mode.ClusterApi` over
:class:`~ix_gpu.kube.apiserver.ApiServer` (kubeconfig or in-cluster service account).

The reconcile loop knows only the protocol, so it is tested against a local stand-in; this adapter
is tested against a real apiserver. Every call is one JSON request; an HTTP error status is a
``urllib.error.HTTPError`` whose ``code`` the methods read for 404 and 409.
"""

from __future__ import annotations

import base64
import urllib.error
from typing import Any
from urllib.parse import quote

from ix_gpu.kube.apiserver import ApiServer
from ix_gpu.webhook.certs.self_mode import Owner, StoredSecret

_WEBHOOK_CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def _secrets(namespace: str, name: str | None = None) -> str:
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/secrets"
    return path if name is None else f"{path}/{quote(name, safe='')}"


def _configuration(name: str) -> str:
    return f"{_WEBHOOK_CONFIGURATIONS}/{quote(name, safe='')}"


def _metadata(obj: Any) -> dict[str, Any]:
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    return metadata if isinstance(metadata, dict) else {}


class KubernetesClusterApi:
    """:class:`ClusterApi` over the API server: exactly the calls the chart's RBAC grants."""

    def __init__(self, api: ApiServer) -> None:
        self._api = api

    @classmethod
    def connect(cls, kubeconfig: str | None) -> KubernetesClusterApi:
        from ix_gpu.webhook.service.namespace_cache import api_server

        return cls(api_server(kubeconfig))

    def _answer(self, method: str, path: str, body: Any = None, *, none_on: int) -> Any | None:
        """The decoded answer; None for the status ``none_on`` (404: absent, 409: another writer
        was first), which the callers turn into their results."""
        try:
            return self._api.request(method, path, body)
        except urllib.error.HTTPError as exc:
            if exc.code == none_on:
                return None
            raise

    def read_secret(self, namespace: str, name: str) -> StoredSecret | None:
        secret = self._answer("GET", _secrets(namespace, name), none_on=404)
        if secret is None:
            return None
        data = secret.get("data") or {}
        decoded = {key: base64.b64decode(value) for key, value in data.items()}
        return StoredSecret(decoded, str(_metadata(secret).get("resourceVersion") or ""))

    def _body(
        self, name: str, data: dict[str, bytes], resource_version: str | None, owner: Owner | None
    ) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "ix-gpu-webhook"},
        }
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        if owner is not None:
            reference = {
                "apiVersion": owner.api_version,
                "kind": owner.kind,
                "name": owner.name,
                "uid": owner.uid,
            }
            metadata["ownerReferences"] = [reference]
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,
            "type": "kubernetes.io/tls",
            "data": {key: base64.b64encode(value).decode() for key, value in data.items()},
        }

    def create_secret(self, namespace: str, name: str, data: dict[str, bytes], owner: Owner | None) -> bool:
        body = self._body(name, data, None, owner)
        return self._answer("POST", _secrets(namespace), body, none_on=409) is not None

    def replace_secret(
        self, namespace: str, name: str, data: dict[str, bytes], resource_version: str, owner: Owner | None
    ) -> bool:
        body = self._body(name, data, resource_version, owner)
        return self._answer("PUT", _secrets(namespace, name), body, none_on=409) is not None

    def configuration_uid(self, configuration: str) -> str | None:
        found = self._answer("GET", _configuration(configuration), none_on=404)
        uid = _metadata(found).get("uid")
        return str(uid) if uid else None

    def read_ca_bundles(self, configuration: str) -> list[tuple[str, bytes | None]]:
        found = self._api.request("GET", _configuration(configuration))
        out: list[tuple[str, bytes | None]] = []
        for webhook in (found or {}).get("webhooks") or []:
            bundle = (webhook.get("clientConfig") or {}).get("caBundle")
            out.append((webhook.get("name", ""), base64.b64decode(bundle) if bundle else None))
        return out

    def patch_ca_bundles(self, configuration: str, patch: list[dict[str, Any]]) -> None:
        self._api.request(
            "PATCH", _configuration(configuration), patch, content_type="application/json-patch+json"
        )
