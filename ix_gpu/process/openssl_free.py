"""Imports that would load OpenSSL for TLS a process never does, made without it.

Why: asyncio (``base_events``, ``selector_events``, ``sslproto``), grpclib's client and server, and
hashlib each import ``ssl`` or ``_hashlib`` when they are imported, if they can, and either maps
libcrypto: 4.5 MiB of the device plugin's 33 MiB RSS (docs/benchmarks.md, December 5), more than
everything per-chip telemetry added. The plugin's event loop serves plain HTTP and gRPC over unix
sockets; its only TLS is to the API server, through ``http.client`` and ``urllib.request`` in
threads, which import ``ssl`` themselves when first used (:mod:`ix_gpu.kube.apiserver`,
:mod:`ix_gpu.kube.list_watch`), after these imports: a plugin with cluster access loads OpenSSL
then, as before, and one without never does. Each of these modules works without ``ssl`` (they
are written for Pythons built without it): only a TLS connection made through them would fail,
and none is. hashlib falls back to its builtin SHA-256, which gives the same digests.
"""

from __future__ import annotations

import sys

OPENSSL_MODULES = ("ssl", "_ssl", "_hashlib")
"""Either of these loaded means libcrypto is mapped already: there is nothing left to save."""

BLOCKED = ("ssl", "_hashlib")
"""What the modules in question try to import; ``None`` in ``sys.modules`` makes that fail."""

NEED_TLS = ("http.client", "urllib.request", "ix_gpu.kube.apiserver", "ix_gpu.kube.kubeconfig")
"""Modules that must see the real ``ssl`` (without it ``http.client`` has no HTTPSConnection): one
imported in passing would leave the API client without HTTPS for the life of the process."""


def import_without_openssl(*names: str) -> bool:
    """Import ``names`` (and what they import) with ``ssl`` and ``_hashlib`` unimportable, then
    make both importable again. False when OpenSSL is loaded already: the modules are then
    imported as usual. Raises RuntimeError if one of :data:`NEED_TLS` was imported on the way (a
    bug where it is imported: it belongs in the function that connects); it is taken out of
    ``sys.modules`` so that a later import gets ``ssl``. Not thread-safe: call it before other
    threads import anything."""
    if any(sys.modules.get(name) is not None for name in OPENSSL_MODULES):
        for name in names:
            __import__(name)
        return False
    before = set(sys.modules)
    for name in BLOCKED:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        for name in names:
            # Not importlib.import_module, which -X importtime does not log (the plugin's tests
            # read that log for what the process imported).
            __import__(name)
    finally:
        for name in BLOCKED:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
        wrong = sorted(set(NEED_TLS) & (set(sys.modules) - before))
        for name in wrong:
            del sys.modules[name]  # imported without ssl: the next import must start afresh
    if wrong:
        raise RuntimeError(f"{', '.join(wrong)} would have been imported without ssl by {', '.join(names)}")
    return True
