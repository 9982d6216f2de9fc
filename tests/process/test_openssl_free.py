"""``ix_gpu.process.openssl_free``: the device plugin's event loop, gRPC and hashlib imported
without libcrypto, and HTTPS still there for whatever connects later. Each case runs in a fresh
interpreter: this one has OpenSSL loaded long since."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.support.paths import ROOT

LIBCRYPTO = "any('libcrypto' in line for line in open('/proc/self/maps'))"


def run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_plugins_imports_map_no_libcrypto_and_https_comes_back_on_first_use() -> None:
    out = run(f"""
        import sys
        from ix_gpu.process.openssl_free import import_without_openssl
        print(import_without_openssl("asyncio", "hashlib", "grpclib.client", "grpclib.server"))
        print({LIBCRYPTO}, "ssl" in sys.modules, "_hashlib" in sys.modules)
        import hashlib
        print(hashlib.sha256(b"ix-gpu").hexdigest())
        import asyncio

        async def main():
            return 1

        print(asyncio.run(main()), {LIBCRYPTO})
        import http.client, ssl
        context = ssl.create_default_context()
        print(hasattr(http.client, "HTTPSConnection"), isinstance(context, ssl.SSLContext))
        print({LIBCRYPTO})
    """)
    import hashlib

    digest = hashlib.sha256(b"ix-gpu").hexdigest()
    assert out.splitlines() == ["True", "False False False", digest, "1 False", "True True", "True"]


def test_with_openssl_loaded_already_the_modules_are_imported_as_usual() -> None:
    out = run("""
        import ssl, sys
        from ix_gpu.process.openssl_free import import_without_openssl
        print(import_without_openssl("asyncio"), sys.modules["asyncio.base_events"].ssl is ssl)
    """)
    assert out == "False True"


def test_a_module_that_needs_tls_imported_on_the_way_is_refused_and_imported_afresh_later() -> None:
    out = run("""
        from ix_gpu.process.openssl_free import import_without_openssl
        try:
            import_without_openssl("asyncio", "urllib.request")
        except RuntimeError as exc:
            print(exc)
        import http.client, sys
        print(hasattr(http.client, "HTTPSConnection"), sys.modules.get("ssl") is not None)
    """)
    assert out.splitlines() == [
        "http.client, urllib.request would have been imported without ssl by asyncio, urllib.request",
        "True True",
    ]
