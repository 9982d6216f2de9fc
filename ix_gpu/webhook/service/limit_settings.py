"""The webhook's limits as plain settings (see :mod:`.limits` for what each bounds and how).

Apart from the machinery, so that registering ``ix-gpu webhook``'s flags, which every ``ix-gpu``
command does (the device plugin too), imports no asyncio, ctypes or signal handling.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_connections: int = 128
    max_connections_per_address: int = 64
    keep_idle_per_address: int = 8
    """At a cap, each address keeps this many of its most recently used idle keep-alive
    connections; older idle ones may be closed to make room (:mod:`ix_gpu.serving.connection_slots`).
    The apiserver's Go transport reuses its most recently used connection first."""
    idle_timeout: float = 120.0
    """Seconds a keep-alive connection may sit idle before the server closes it. Longer than the
    apiserver's own idle timeout (90 s: Go's ``http.Transport`` default, which client-go keeps),
    so that the apiserver, not the webhook, ends its idle connections: the pool it grew in a
    burst (up to 25 connections, each to a replica kube-proxy picked) stays for the next one
    instead of being redialled, a TLS handshake each while creates wait, and no connection is
    closed just as the apiserver sends on it. Idle connections stay bounded by the caps above."""
    header_timeout: float = 10.0
    max_header_bytes: int = 64 << 10
    max_inflight_body_bytes: int = 16 << 20
    offload_bytes: int = 64 << 10
    tls_read_buffer_bytes: int = 64 << 10
    request_budget: float = 0.75
