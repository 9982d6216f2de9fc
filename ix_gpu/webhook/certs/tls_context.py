"""The server's TLS context, and loading PEM bytes into it.

``ssl.SSLContext.load_cert_chain`` accepts file paths only. The reloader validates the exact bytes
it hashed, so those bytes are written to a private temporary directory and loaded from there —
reading the live paths again could pick up a half-rotated pair (new cert, old key).
"""

from __future__ import annotations

import os
import ssl
import tempfile
from pathlib import Path

ALPN = ["http/1.1"]
"""The apiserver speaks HTTP/1.1 to webhooks; uvicorn serves nothing else here."""


def load_pem_pair(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Load a certificate chain and key from memory; raises ``ssl.SSLError``/``ValueError``."""
    if not cert_pem.strip() or not key_pem.strip():
        raise ValueError("certificate or key file is empty")
    with tempfile.TemporaryDirectory(prefix="ix-gpu-tls-") as tmp:
        os.chmod(tmp, 0o700)
        cert_path, key_path = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        cert_path.write_bytes(cert_pem)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(key_pem)
        context.load_cert_chain(str(cert_path), str(key_path))


def server_context(cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    """A server context: TLS 1.2 or newer, HTTP/1.1 ALPN, the given certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(ALPN)
    load_pem_pair(context, cert_pem, key_pem)
    return context


def check_pair(cert_pem: bytes, key_pem: bytes) -> None:
    """Raise unless the pair loads (parsable PEM, key matches certificate)."""
    load_pem_pair(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), cert_pem, key_pem)
