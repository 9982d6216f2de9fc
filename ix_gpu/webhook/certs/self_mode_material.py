"""The certificate material of self mode: the Secret's keys, a CA, a serving certificate from it,
and the pair written into ``--cert-dir``.

The PEM work is :mod:`ix_gpu.webhook.certs.authority`; this module adds what self mode keeps
around it (the old CA kept in ``ca-bundle.crt`` while it is still valid, the manager's clock).
cryptography is imported only when a certificate is made or read.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography import x509

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CA_BUNDLE = "ca-bundle.crt"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
SECRET_KEYS = (CA_CERT, CA_KEY, CA_BUNDLE, TLS_CERT, TLS_KEY)


class SelfCertError(Exception):
    """The certificate Secret or the webhook configuration could not be brought into shape."""


@dataclass
class SecretMaterial:
    ca_cert: bytes
    ca_key: bytes
    ca_bundle: bytes
    cert: bytes
    key: bytes

    def secret_data(self) -> dict[str, bytes]:
        return {
            CA_CERT: self.ca_cert,
            CA_KEY: self.ca_key,
            CA_BUNDLE: self.ca_bundle,
            TLS_CERT: self.cert,
            TLS_KEY: self.key,
        }


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def load_cert(pem: bytes) -> x509.Certificate:
    from cryptography import x509

    return x509.load_pem_x509_certificate(pem)


def split_pems(bundle: bytes) -> list[bytes]:
    marker = b"-----END CERTIFICATE-----"
    return [chunk.strip() + b"\n" + marker + b"\n" for chunk in bundle.split(marker)[:-1]]


def new_ca(now: dt.datetime, validity: dt.timedelta) -> tuple[bytes, bytes]:
    """A self-signed CA valid from ``now`` on the manager's clock (PEM cert, PEM key)."""
    from ix_gpu.webhook.certs.authority import generate_ca

    return generate_ca(f"ix-gpu-webhook-ca-{now:%Y%m%d%H%M%S}", valid_for=validity, now=now)


def issue_from_ca(
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    dns_names: tuple[str, ...],
    now: dt.datetime,
    validity: dt.timedelta,
) -> tuple[bytes, bytes]:
    """A serving certificate (serverAuth, DNS SANs) signed by the CA, valid from ``now``."""
    from ix_gpu.webhook.certs.authority import issue_serving_cert

    try:
        return issue_serving_cert(ca_cert_pem, ca_key_pem, list(dns_names), [], valid_for=validity, now=now)
    except ValueError as exc:
        raise SelfCertError(f"cannot issue from the CA in the Secret: {exc}") from None


def write_pair(cert_dir: Path, cert: bytes, key: bytes) -> None:
    """Write tls.key then tls.crt, each atomically (the reloader retries a mismatched pair)."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    for name, data, mode in ((TLS_KEY, key, 0o600), (TLS_CERT, cert, 0o644)):
        path = cert_dir / name
        tmp = path.with_name(f".{name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
