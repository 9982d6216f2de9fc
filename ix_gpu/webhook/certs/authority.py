"""TLS material for the webhook: a private CA and a serving certificate signed by it.

Used by ``ix-gpu certs generate`` (local runs, the ``provided`` chart mode and the test tier) and,
later, by the webhook's self-managed certificate mode. ECDSA P-256 keeps handshakes cheap on the
admission hot path; the serving certificate carries the serverAuth EKU and SANs because the
kube-apiserver verifies webhook certificates by SAN only (no CN fallback).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE = "ca.crt"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CA_KEY_FILE = "ca.key"


@dataclass(frozen=True)
class CertificateBundle:
    """PEM bytes of a CA certificate and key and of a serving certificate and key."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def generate_ca(
    common_name: str = "ix-gpu-webhook-ca",
    days: int = 3650,
    *,
    valid_for: dt.timedelta | None = None,
    now: dt.datetime | None = None,
) -> tuple[bytes, bytes]:
    """A self-signed CA certificate and key (PEM).

    ``now``/``valid_for`` let a long-running renewer (self cert mode) issue on its own clock, so
    renewal decisions and validity are measured the same way.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    now = now or dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + (valid_for or dt.timedelta(days=days)))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def issue_serving_cert(
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    dns_names: list[str],
    ip_addresses: list[str],
    days: int = 365,
    *,
    valid_for: dt.timedelta | None = None,
    now: dt.datetime | None = None,
) -> tuple[bytes, bytes]:
    """A serving certificate and key signed by the given CA (PEM), never outliving the CA."""
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key must be an ECDSA key")
    key = ec.generate_private_key(ec.SECP256R1())
    now = now or dt.datetime.now(dt.UTC)
    not_after = min(now + (valid_for or dt.timedelta(days=days)), ca_cert.not_valid_after_utc)
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(dns_names[0] if dns_names else ip_addresses[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def generate_bundle(dns_names: list[str], ip_addresses: list[str], days: int = 365) -> CertificateBundle:
    ca_cert, ca_key = generate_ca(days=max(days, 3650))
    cert, key = issue_serving_cert(ca_cert, ca_key, dns_names, ip_addresses, days)
    return CertificateBundle(ca_cert=ca_cert, ca_key=ca_key, cert=cert, key=key)


def _write(path: Path, data: bytes, mode: int) -> None:
    # Write beside and rename, so a reader polling the directory never sees half a file.
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_bundle(bundle: CertificateBundle, out_dir: str | Path) -> dict[str, Path]:
    """Write ``ca.crt``, ``ca.key``, ``tls.crt`` and ``tls.key`` (keys mode 0600)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        CA_FILE: (bundle.ca_cert, 0o644),
        CA_KEY_FILE: (bundle.ca_key, 0o600),
        CERT_FILE: (bundle.cert, 0o644),
        KEY_FILE: (bundle.key, 0o600),
    }
    written = {}
    for name, (data, mode) in files.items():
        _write(out / name, data, mode)
        written[name] = out / name
    return written


def serving_cert_sans(cert_pem: bytes) -> tuple[list[str], list[str]]:
    """DNS names and IP addresses of a certificate (for checks and messages)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    return san.get_values_for_type(x509.DNSName), [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """Signatures only (TLS with ECDSA keys: no key encipherment); a CA also signs certificates
    and CRLs, which a serving certificate must not."""
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )
