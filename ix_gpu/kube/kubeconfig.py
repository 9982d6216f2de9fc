"""A kubeconfig read for :class:`ix_gpu.kube.apiserver.ApiServer`, the light client of the node agents,
the webhook and ``ix-gpu labels``.

Why the light client does not take every kubeconfig: the official ``kubernetes`` client, which
does, costs a process more memory than the whole device plugin holds at rest, and the plugin runs
on every GPU node. The forms it does take are the ones a node agent is given: a token or tokenFile
(what service accounts and bootstrap kubeconfigs use), a client certificate (kubeadm's admin.conf,
kind, k3s), either as files or inline base64 data, with the CA as a file or inline.

Forms that need more than the standard library are refused when the file is read, naming the
user and the form, rather than turning into a 401 at the first label patch: exec credential
plugins (they run an arbitrary command and cache what it prints), auth providers (removed from
kubectl in 1.26) and basic auth (removed from the apiserver in 1.19). So is
``insecure-skip-tls-verify``: a node agent that patches Nodes should not talk to an unverified
server. In a cluster they all run with their service account's token; a developer who runs the
webhook against an exec-plugin kubeconfig gets the refusal naming the form.

Relative file names are resolved against the kubeconfig's directory, as kubectl does. The file is
read by the strict YAML loader, so a duplicated ``current-context`` is an error, not a guess.
"""

from __future__ import annotations

import base64
import binascii
import ssl
from pathlib import Path
from typing import Any

from ix_gpu.config.input_files import CONFIG_MAX_BYTES, ConfigError, read_capped
from ix_gpu.config.text import shown
from ix_gpu.kube.apiserver import ApiServer, ClientCertificate

SUPPORTED = "use a token, tokenFile or client certificate"


def read_kubeconfig(path: str | Path) -> ApiServer:
    """The API server and credentials of ``path``'s current context; ``ValueError`` naming the file
    (and the user or cluster) for anything this client cannot use."""
    try:
        return _Kubeconfig(path).api_server()
    except ConfigError as exc:  # unreadable, not YAML, over a limit: the loader named the file
        raise ValueError(f"kubeconfig {exc}") from None


class _Kubeconfig:
    def __init__(self, path: str | Path) -> None:
        from ix_gpu.config.yaml_input import load_yaml

        self.path = Path(path)
        self.directory = self.path.parent
        doc = load_yaml(read_capped(self.path, CONFIG_MAX_BYTES), str(self.path))
        if not isinstance(doc, dict):
            raise self.error("not a mapping")
        self.doc: dict[str, Any] = doc

    def error(self, message: str) -> ValueError:
        return ValueError(f"kubeconfig {self.path}: {message}")

    def named(self, section: str, name: Any) -> dict[str, Any]:
        kind = section.removesuffix("s")
        for item in self.doc.get(section) or []:
            if isinstance(item, dict) and item.get("name") == name:
                value = item.get(kind)
                if isinstance(value, dict):
                    return value
        raise self.error(f"no {kind} named {shown(name)}")

    def file(self, value: Any, key: str, owner: str) -> Path:
        if not isinstance(value, str) or not value:
            raise self.error(f"{owner}: {key} must be a file name")
        return self.directory / value  # an absolute value replaces the directory

    def data(self, value: Any, key: str, owner: str) -> bytes:
        try:
            return base64.b64decode(value, validate=True) if isinstance(value, str) else b""
        except binascii.Error:
            raise self.error(f"{owner}: {key}: not base64") from None

    def api_server(self) -> ApiServer:
        current = self.named("contexts", self.doc.get("current-context"))
        cluster_name, user_name = current.get("cluster"), current.get("user")
        cluster, user = self.named("clusters", cluster_name), self.named("users", user_name)
        server = cluster.get("server")
        if not isinstance(server, str) or not server:
            raise self.error(f"cluster {shown(cluster_name)} has no server")
        owner = f"user {shown(user_name)}"
        token = self.token(user, owner)
        certificate = self.client_certificate(user, owner)
        if token is None and certificate is None:
            raise self.error(f"{owner} has no credentials: {SUPPORTED}")
        cluster_owner = f"cluster {shown(cluster_name)}"
        ca_file, ca_data = self.authority(cluster, cluster_owner, server)
        if server.startswith("https"):
            # Loaded once now, so a bad file or key is named at start-up, not at the first request.
            try:
                context = ssl.create_default_context(
                    cafile=ca_file, cadata=None if ca_data is None else ca_data.decode("ascii", "replace")
                )
            except (OSError, ValueError) as exc:
                raise self.error(f"{cluster_owner}: certificate authority cannot be loaded: {exc}") from None
            if certificate is not None:
                try:
                    certificate.load_into(context)
                except OSError as exc:
                    raise self.error(f"{owner}: client certificate cannot be loaded: {exc}") from None
        return ApiServer(server.rstrip("/"), token, ca_file, ca_data, certificate)

    def token(self, user: dict[str, Any], owner: str) -> str | Path | None:
        self.refuse_other_forms(user, owner)
        if user.get("tokenFile") is not None:
            return self.file(user["tokenFile"], "tokenFile", owner)
        token = user.get("token")
        return token if isinstance(token, str) and token else None

    def refuse_other_forms(self, user: dict[str, Any], owner: str) -> None:
        exec_plugin = user.get("exec")
        if exec_plugin is not None:
            command = exec_plugin.get("command") if isinstance(exec_plugin, dict) else None
            name = Path(command).name if isinstance(command, str) and command else "no command"
            raise self.error(
                f"{owner} uses an exec plugin ({name}): not supported by the device plugin's API "
                f"client; {SUPPORTED}"
            )
        provider = user.get("auth-provider")
        if provider is not None:
            provider_name = provider.get("name") if isinstance(provider, dict) else None
            shown_name = provider_name if isinstance(provider_name, str) else "unnamed"
            raise self.error(
                f"{owner} uses an auth provider ({shown_name}): not "
                f"supported by the device plugin's API client; {SUPPORTED}"
            )
        if user.get("username") is not None or user.get("password") is not None:
            raise self.error(
                f"{owner} uses basic auth (username and password), which the apiserver no longer "
                f"accepts: not supported by the device plugin's API client; {SUPPORTED}"
            )

    def client_certificate(self, user: dict[str, Any], owner: str) -> ClientCertificate | None:
        cert = self.pem(user, "client-certificate", owner)
        key = self.pem(user, "client-key", owner)
        if cert is None and key is None:
            return None
        if key is None:
            raise self.error(f"{owner} has a client certificate but no client key")
        if cert is None:
            raise self.error(f"{owner} has a client key but no client certificate")
        return ClientCertificate(cert, key)

    def pem(self, user: dict[str, Any], key: str, owner: str) -> Path | bytes | None:
        """``<key>-data`` (inline, base64) wins over ``<key>`` (a file), as in kubectl."""
        if user.get(f"{key}-data") is not None:
            return self.data(user[f"{key}-data"], f"{key}-data", owner)
        if user.get(key) is not None:
            return self.file(user[key], key, owner)
        return None

    def authority(self, cluster: dict[str, Any], owner: str, server: str) -> tuple[str | None, bytes | None]:
        if cluster.get("insecure-skip-tls-verify"):
            raise self.error(
                f"{owner}: insecure-skip-tls-verify is not supported: a node agent that patches "
                "Nodes must verify the server; give certificate-authority or certificate-authority-data"
            )
        if cluster.get("certificate-authority-data") is not None:
            return None, self.data(cluster["certificate-authority-data"], "certificate-authority-data", owner)
        if cluster.get("certificate-authority") is not None:
            return str(self.file(cluster["certificate-authority"], "certificate-authority", owner)), None
        if server.startswith("https"):
            raise self.error(
                f"{owner} has an https server but no certificate-authority or certificate-authority-data"
            )
        return None, None


__all__ = ["SUPPORTED", "read_kubeconfig"]
