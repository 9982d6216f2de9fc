"""Kubernetes API access for both processes: in-cluster or from a kubeconfig, token re-read on use.

Two clients, one set of rules:

- :class:`ApiServer` is a few standard-library HTTP calls. The device plugin uses it because
  importing the official client would cost the plugin more memory than the rest of it together.
- :func:`client_configuration` configures the official ``kubernetes`` client, which the webhook
  already carries for its namespace watch and its certificate Secret.

Inside a Pod both read the service-account token **on every request**: projected tokens are
rotated by the kubelet (hourly by default), and a process that read the token once fails with 401
after the token expires, while the official in-cluster loader caches it for a minute.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_FILE = SERVICE_ACCOUNT / "token"
CA_FILE = SERVICE_ACCOUNT / "ca.crt"


def in_cluster() -> bool:
    """True inside a Pod with a service-account token (what in-cluster access needs)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and TOKEN_FILE.exists()


def _in_cluster_url() -> str | None:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"https://{host}:{port}"


def read_token(source: str | Path) -> str:
    """The bearer token: ``source`` itself when it is a string, else the file's current content."""
    if isinstance(source, Path):
        return source.read_text(encoding="utf-8").strip()
    return source


@dataclass(frozen=True)
class ApiServer:
    """Where and how to reach the API server with the standard library."""

    base_url: str
    token: str | Path
    """A fixed token, or the file to re-read on every request (the in-cluster case)."""
    ca_file: str | None

    @classmethod
    def in_cluster(cls) -> ApiServer | None:
        url = _in_cluster_url()
        if url is None or not TOKEN_FILE.exists():
            return None
        return cls(url, TOKEN_FILE, str(CA_FILE))

    @classmethod
    def from_kubeconfig(cls, path: str | Path) -> ApiServer:
        """The current context of a kubeconfig that authenticates with a bearer token (``token``
        or ``tokenFile``, re-read on every request) and trusts a CA file. Raises ``ValueError``
        naming what is missing or not supported (client certificates, exec plugins, inline CA
        data: write it to a file)."""
        import yaml

        try:
            doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"kubeconfig {path}: {exc}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"kubeconfig {path}: not a mapping")

        def named(section: str, name: Any) -> dict[str, Any]:
            for item in doc.get(section) or []:
                if isinstance(item, dict) and item.get("name") == name:
                    value = item.get(section.rstrip("s"))
                    if isinstance(value, dict):
                        return value
            raise ValueError(f"kubeconfig {path}: no {section.rstrip('s')} named {name!r}")

        context = named("contexts", doc.get("current-context"))
        cluster, user = named("clusters", context.get("cluster")), named("users", context.get("user"))
        server = cluster.get("server")
        if not isinstance(server, str) or not server:
            raise ValueError(f"kubeconfig {path}: the cluster has no server")
        token: str | Path
        if isinstance(user.get("tokenFile"), str):
            token = Path(user["tokenFile"])
        elif isinstance(user.get("token"), str):
            token = user["token"]
        else:
            raise ValueError(f"kubeconfig {path}: only token or tokenFile users are supported")
        ca = cluster.get("certificate-authority")
        if server.startswith("https") and not isinstance(ca, str):
            raise ValueError(f"kubeconfig {path}: an https server needs certificate-authority (a file)")
        return cls(server.rstrip("/"), token, ca if isinstance(ca, str) else None)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout: float = 10,
        max_bytes: int = 4 << 20,
    ) -> Any:
        """One JSON request; the decoded answer. Raises ``OSError`` (``URLError``/``HTTPError``)."""
        # Imported here: urllib.request brings email and http.client (~2.5 MiB), which a plugin that
        # never talks to the API server (no node labels, no per-node configs) should not hold.
        import ssl
        import urllib.request

        request = urllib.request.Request(
            f"{self.base_url}{path}",
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={
                "Authorization": f"Bearer {read_token(self.token)}",
                "Content-Type": content_type,
                "Accept": "application/json",
            },
        )
        https = self.base_url.startswith("https")
        context = ssl.create_default_context(cafile=self.ca_file) if https else None
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            raw = response.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise OSError(f"{method} {path}: answer larger than {max_bytes} bytes")
        return json.loads(raw) if raw else None


def client_configuration(kubeconfig: str | None) -> Any:
    """A ``kubernetes.client.Configuration`` from ``kubeconfig``, or in-cluster when it is None.

    In-cluster, the token is re-read from its file on every request (the official loader caches it
    for a minute). Raises the client's ``ConfigException`` when neither source is usable.
    """
    from kubernetes import client
    from kubernetes import config as kube_config

    configuration: Any = client.Configuration()
    if kubeconfig is not None:
        loaders: Any = kube_config  # its loaders are untyped
        loaders.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        return configuration
    url = _in_cluster_url()
    if url is None or not TOKEN_FILE.exists():
        raise kube_config.ConfigException(
            "not in a cluster: KUBERNETES_SERVICE_HOST/PORT or the service-account token is missing"
        )
    configuration.host = url
    configuration.ssl_ca_cert = str(CA_FILE)

    def fresh_token(conf: Any) -> None:
        conf.api_key["BearerToken"] = f"Bearer {read_token(TOKEN_FILE)}"

    fresh_token(configuration)
    configuration.refresh_api_key_hook = fresh_token
    return configuration
