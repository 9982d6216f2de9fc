"""Kubernetes API access: in-cluster or from a kubeconfig, token re-read on use.

Two clients, one set of rules:

- :class:`ApiServer` is a few standard-library HTTP calls, used by every long-running process:
  the device plugin, the DRA plugin and the webhook (its caches, :mod:`.list_watch`, and its
  certificate Secret). Importing the official client would cost the plugin more memory than the
  rest of it together (``kubernetes.client`` and ``kubernetes.config`` take a process from 30.3 to
  54.9 MiB), and the webhook 36 MiB of its 101 MiB at rest; this client and its kubeconfig reader
  (:mod:`.kubeconfig`) add 0.5 MiB. It takes token, tokenFile and client-certificate users and
  refuses the other kubeconfig forms by name.
- :func:`client_configuration` configures the official ``kubernetes`` client for
  ``ix-gpu check-injection``, a command run from an operator's machine, whose kubeconfig may
  well use an exec credential plugin.

Inside a Pod both read the service-account token **on every request**: projected tokens are
rotated by the kubelet (hourly by default), and a process that read the token once fails with 401
after the token expires, while the official in-cluster loader caches it for a minute.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_FILE = SERVICE_ACCOUNT / "token"
CA_FILE = SERVICE_ACCOUNT / "ca.crt"


USER_AGENT = "ix-gpu"
"""What every request says it comes from; :func:`identify` names the command (``ix-gpu-plugin``,
``ix-gpu-dra``, ``ix-gpu-webhook``), so an apiserver's audit log tells the agents apart."""


def identify(command: str) -> None:
    global USER_AGENT
    USER_AGENT = f"ix-gpu-{command}"


class ApiError(OSError):
    """A request to the API server that got no usable answer although the server may be fine: the
    connection broke mid-answer (``http.client.IncompleteRead``, ``BadStatusLine``), the answer was
    not JSON, or it was larger than asked for. An ``OSError``, as urllib's ``URLError`` and
    ``HTTPError`` are, so that every caller handles one family: a node agent that catches
    ``OSError`` around a call keeps running whatever the transport did."""


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
class ClientCertificate:
    """A kubeconfig user's client certificate and key, each a file (re-read on every connection,
    so a rotated pair is used) or the PEM bytes of an inline ``*-data`` field."""

    cert: Path | bytes
    key: Path | bytes

    def load_into(self, context: ssl.SSLContext) -> None:
        """``load_cert_chain`` takes only file names, so inline PEM is written to a file in a
        private temporary directory (mode 0700) that is removed before this returns."""
        if isinstance(self.cert, Path) and isinstance(self.key, Path):
            context.load_cert_chain(self.cert, self.key)
            return
        import tempfile

        pem = b"\n".join(
            part.read_bytes() if isinstance(part, Path) else part for part in (self.cert, self.key)
        )
        with tempfile.TemporaryDirectory(prefix="ix-gpu-client-cert-") as directory:
            pair = Path(directory) / "pair.pem"
            pair.write_bytes(pem)
            context.load_cert_chain(pair)


@dataclass(frozen=True)
class ApiServer:
    """Where and how to reach the API server with the standard library."""

    base_url: str
    token: str | Path | None
    """A fixed token, the file to re-read on every request (the in-cluster case), or none (a
    client-certificate user)."""
    ca_file: str | None
    ca_data: bytes | None = None
    """PEM of a kubeconfig's inline ``certificate-authority-data``, trusted besides ``ca_file``."""
    client_certificate: ClientCertificate | None = None

    @classmethod
    def in_cluster(cls) -> ApiServer | None:
        url = _in_cluster_url()
        if url is None or not TOKEN_FILE.exists():
            return None
        return cls(url, TOKEN_FILE, str(CA_FILE))

    def ssl_context(self) -> ssl.SSLContext:
        """A fresh context per connection: CA and certificate files are read again, so rotated ones
        are used without a restart (the agents open a connection per write, per list page and per
        watch, so a handshake's cost is rare)."""
        import ssl  # with urllib.request, only in a plugin that talks to the API server

        context = ssl.create_default_context(
            cafile=self.ca_file, cadata=None if self.ca_data is None else self.ca_data.decode("ascii")
        )
        if self.client_certificate is not None:
            self.client_certificate.load_into(context)
        return context

    def headers(self, accept: str = "application/json") -> dict[str, str]:
        """What every request carries: ``Accept``, ``User-Agent`` and the bearer token as it is now."""
        headers = {"Accept": accept, "User-Agent": USER_AGENT}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {read_token(self.token)}"
        return headers

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        accept: str = "application/json",
        timeout: float = 10,
        max_bytes: int = 4 << 20,
        parse: Callable[[bytes], Any] = json.loads,
    ) -> Any:
        """One JSON request; the answer decoded by ``parse``. Raises ``OSError`` and nothing else:
        ``HTTPError`` for an HTTP error status (its ``code`` says which), ``URLError`` for a
        connection that failed, ``ssl.SSLError`` for a certificate that cannot be loaded,
        :class:`ApiError` for an answer that broke off, was not JSON or was too large."""
        # Imported here: urllib.request brings email and http.client (~2.5 MiB), which a plugin that
        # never talks to the API server (no node labels, no per-node configs) should not hold.
        import http.client
        import urllib.request

        headers = self.headers(accept)
        headers["Content-Type"] = content_type
        request = urllib.request.Request(
            f"{self.base_url}{path}",
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers=headers,
        )
        context = self.ssl_context() if self.base_url.startswith("https") else None
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
                raw = response.read(max_bytes + 1)
                # read(n) returns what came before the connection closed without a word (only
                # read() raises IncompleteRead): what Content-Length still promised was cut off,
                # and a cut answer that happens to parse must not pass for the whole one.
                short = response.length
        except http.client.HTTPException as exc:  # not an OSError: IncompleteRead, BadStatusLine, ...
            raise ApiError(f"{method} {path}: {type(exc).__name__}: {exc!r}"[:500]) from exc
        if len(raw) > max_bytes:
            raise ApiError(f"{method} {path}: answer larger than {max_bytes} bytes")
        if short:
            raise ApiError(
                f"{method} {path}: the answer was cut off {short} bytes short of its Content-Length"
            )
        try:
            return parse(raw) if raw else None
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise ApiError(f"{method} {path}: the answer is not JSON: {exc}"[:500]) from exc
        except RecursionError:  # nested deeper than the parser follows: refused, not a crash
            raise ApiError(f"{method} {path}: the answer is nested too deep") from None


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


def user_api_server(kubeconfig: str | None) -> ApiServer:
    """The API server as a person's kubeconfig reaches it, for commands run on an operator's machine
    (``ix-gpu status``): loaded by the official client (exec plugins and auth providers, as cloud
    clusters use; ``$KUBECONFIG``, then ``~/.kube/config``, then in-cluster), then used through
    :class:`ApiServer`. Raises ``ValueError`` with the loader's reason when nothing is usable."""
    from kubernetes.config.config_exception import ConfigException

    if kubeconfig is None:
        candidates = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
        candidates.append(os.path.expanduser("~/.kube/config"))
        kubeconfig = next((p for p in candidates if Path(p).is_file()), None)
    try:
        conf = client_configuration(kubeconfig)
    except (ConfigException, OSError) as exc:
        raise ValueError(str(exc)) from None
    if conf.refresh_api_key_hook is not None:
        conf.refresh_api_key_hook(conf)
    if not conf.verify_ssl:
        raise ValueError("the kubeconfig turns TLS verification off (insecure-skip-tls-verify): not followed")
    header = str(conf.api_key.get("authorization") or conf.api_key.get("BearerToken") or "")
    token = header.removeprefix("Bearer ").strip() or None
    certificate = (
        ClientCertificate(Path(conf.cert_file), Path(conf.key_file))
        if conf.cert_file and conf.key_file
        else None
    )
    return ApiServer(str(conf.host).rstrip("/"), token, conf.ssl_ca_cert, client_certificate=certificate)
