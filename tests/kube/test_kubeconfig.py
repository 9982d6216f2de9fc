"""The light API client's kubeconfig forms: token, tokenFile, client certificates (files or inline
data) and CA (file or inline data) reach a real TLS apiserver stand-in that requires what the
kubeconfig says; exec plugins, auth providers and basic auth are refused naming the user and the
form, so ``--kubeconfig`` never fails later with a bare 401."""

from __future__ import annotations

import base64
import datetime as dt
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ix_gpu.kube.apiserver import ApiServer
from ix_gpu.kube.kubeconfig import read_kubeconfig
from ix_gpu.webhook.certs.authority import generate_ca, issue_serving_cert

pytestmark = pytest.mark.timeout(30)

SOME_CA = generate_ca("some-ca")[0]


def client_cert(ca_cert_pem: bytes, ca_key_pem: bytes, user: str) -> tuple[bytes, bytes]:
    """A client certificate for ``user`` (its CN, as the apiserver reads it), signed by the CA."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, user)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


class _Handler(BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str | None, str | None]]] = []
    """(Authorization header, client certificate CN) of each request."""

    def do_GET(self) -> None:
        peer: Any = self.connection.getpeercert()
        subject = dict(part[0] for part in peer["subject"]) if peer else {}
        self.seen.append((self.headers.get("Authorization"), subject.get("commonName")))
        body = json.dumps({"kind": "NodeList", "items": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Apiserver:
    url: str
    ca_pem: bytes
    ca_key_pem: bytes
    seen: list[tuple[str | None, str | None]]


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Apiserver]:
    """HTTPS on 127.0.0.1 with a CA of its own; a client certificate is asked for, not required
    (token users send none), and the handler records what each request authenticated with."""
    ca_pem, ca_key_pem = generate_ca()
    cert_pem, key_pem = issue_serving_cert(ca_pem, ca_key_pem, [], ["127.0.0.1"])
    directory = tmp_path_factory.mktemp("apiserver")
    (directory / "tls.crt").write_bytes(cert_pem + ca_pem)
    (directory / "tls.key").write_bytes(key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "tls.crt", directory / "tls.key")
    context.load_verify_locations(cadata=ca_pem.decode())
    context.verify_mode = ssl.CERT_OPTIONAL
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Apiserver(f"https://127.0.0.1:{server.server_port}", ca_pem, ca_key_pem, _Handler.seen)
    finally:
        server.shutdown()
        server.server_close()


def kubeconfig(path: Path, server: str, user: dict[str, Any], cluster: dict[str, Any] | None = None) -> Path:
    """A kubeconfig as kubectl writes one: one cluster, one user named ``alice``, one context."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": "alice", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "alice"}}],
        "current-context": "ctx",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def authenticated_as(api: ApiServer, apiserver: Apiserver) -> tuple[str | None, str | None]:
    apiserver.seen.clear()
    assert api.request("GET", "/api/v1/nodes") == {"kind": "NodeList", "items": []}
    (seen,) = apiserver.seen
    return seen


def test_token_user_with_a_ca_file(tmp_path: Path, apiserver: Apiserver) -> None:
    (tmp_path / "ca.crt").write_bytes(apiserver.ca_pem)
    path = kubeconfig(
        tmp_path / "config", apiserver.url, {"token": "t0ken"}, {"certificate-authority": "ca.crt"}
    )
    assert authenticated_as(read_kubeconfig(path), apiserver) == ("Bearer t0ken", None)


def test_token_file_is_relative_to_the_kubeconfig_and_re_read(tmp_path: Path, apiserver: Apiserver) -> None:
    """As kubectl resolves it; a rotated token is used on the next request."""
    (tmp_path / "token").write_text("first\n")
    ca = {"certificate-authority-data": b64(apiserver.ca_pem)}
    api = read_kubeconfig(kubeconfig(tmp_path / "config", apiserver.url, {"tokenFile": "token"}, ca))
    assert authenticated_as(api, apiserver) == ("Bearer first", None)
    (tmp_path / "token").write_text("second\n")
    assert authenticated_as(api, apiserver) == ("Bearer second", None)


def test_client_certificate_files(tmp_path: Path, apiserver: Apiserver) -> None:
    cert, key = client_cert(apiserver.ca_pem, apiserver.ca_key_pem, "alice")
    (tmp_path / "alice.crt").write_bytes(cert)
    (tmp_path / "alice.key").write_bytes(key)
    (tmp_path / "ca.crt").write_bytes(apiserver.ca_pem)
    user = {"client-certificate": str(tmp_path / "alice.crt"), "client-key": "alice.key"}
    path = kubeconfig(tmp_path / "config", apiserver.url, user, {"certificate-authority": "ca.crt"})
    assert authenticated_as(read_kubeconfig(path), apiserver) == (None, "alice")


def test_client_certificate_data_as_kubeadm_writes_it(tmp_path: Path, apiserver: Apiserver) -> None:
    """admin.conf: certificate, key and CA all inline, base64."""
    cert, key = client_cert(apiserver.ca_pem, apiserver.ca_key_pem, "kubernetes-admin")
    user = {"client-certificate-data": b64(cert), "client-key-data": b64(key)}
    ca = {"certificate-authority-data": b64(apiserver.ca_pem)}
    api = read_kubeconfig(kubeconfig(tmp_path / "config", apiserver.url, user, ca))
    assert authenticated_as(api, apiserver) == (None, "kubernetes-admin")
    assert list(tmp_path.iterdir()) == [tmp_path / "config"]  # no key material left behind


def test_client_certificate_and_token_together(tmp_path: Path, apiserver: Apiserver) -> None:
    cert, key = client_cert(apiserver.ca_pem, apiserver.ca_key_pem, "bob")
    user = {"client-certificate-data": b64(cert), "client-key-data": b64(key), "token": "t"}
    ca = {"certificate-authority-data": b64(apiserver.ca_pem)}
    api = read_kubeconfig(kubeconfig(tmp_path / "config", apiserver.url, user, ca))
    assert authenticated_as(api, apiserver) == ("Bearer t", "bob")


def test_a_wrong_ca_fails_the_request_not_silently(tmp_path: Path, apiserver: Apiserver) -> None:
    other_ca, _ = generate_ca("someone-else")
    ca = {"certificate-authority-data": b64(other_ca)}
    api = read_kubeconfig(kubeconfig(tmp_path / "config", apiserver.url, {"token": "t"}, ca))
    with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):
        api.request("GET", "/api/v1/nodes")


@pytest.mark.parametrize(
    ("user", "message"),
    [
        (
            {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "/usr/local/bin/aws"}},
            "user 'alice' uses an exec plugin (aws): not supported",
        ),
        (
            {"auth-provider": {"name": "gcp", "config": {}}},
            "user 'alice' uses an auth provider (gcp): not supported",
        ),
        ({"username": "admin", "password": "secret"}, "user 'alice' uses basic auth (username and password)"),
        ({}, "user 'alice' has no credentials"),
        ({"client-certificate-data": b64(b"x")}, "user 'alice' has a client certificate but no client key"),
        ({"client-key": "k.pem"}, "user 'alice' has a client key but no client certificate"),
    ],
    ids=["exec", "auth-provider", "basic", "none", "cert-without-key", "key-without-cert"],
)
def test_other_forms_are_refused_naming_user_and_form(
    tmp_path: Path, user: dict[str, Any], message: str
) -> None:
    path = kubeconfig(
        tmp_path / "config", "https://127.0.0.1:6443", user, {"certificate-authority-data": "eA=="}
    )
    with pytest.raises(ValueError) as caught:
        read_kubeconfig(path)
    text = str(caught.value)
    assert text.startswith(f"kubeconfig {path}: {message}")
    if "not supported" in message:
        assert text.endswith("use a token, tokenFile or client certificate")


@pytest.mark.parametrize(
    ("user", "cluster", "message"),
    [
        ({"token": "t"}, {}, "cluster 'c' has an https server but no certificate-authority"),
        ({"token": "t"}, {"insecure-skip-tls-verify": True}, "insecure-skip-tls-verify is not supported"),
        (
            {"client-certificate-data": "%%", "client-key-data": "eA=="},
            {},
            "client-certificate-data: not base64",
        ),
        (
            {"client-certificate": "missing.crt", "client-key": "missing.key"},
            {"certificate-authority-data": b64(SOME_CA)},
            "user 'alice': client certificate cannot be loaded",
        ),
        (
            {"token": "t"},
            {"certificate-authority-data": b64(b"not a certificate")},
            "cluster 'c': certificate authority cannot be loaded",
        ),
    ],
    ids=["no-ca", "insecure", "bad-base64", "missing-cert-file", "bad-ca"],
)
def test_unusable_material_is_named(
    tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any], message: str
) -> None:
    path = kubeconfig(tmp_path / "config", "https://127.0.0.1:6443", user, cluster)
    with pytest.raises(ValueError, match=f"^kubeconfig {path}: ") as caught:
        read_kubeconfig(path)
    assert message in str(caught.value)


def test_the_kubeconfig_is_read_strictly(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text("current-context: a\ncurrent-context: b\n")
    with pytest.raises(ValueError, match=r"duplicate key 'current-context' \(first on line 1\)"):
        read_kubeconfig(path)
