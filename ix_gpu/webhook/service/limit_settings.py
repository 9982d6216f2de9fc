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
    evict_idle_after: float = 15.0
    """At a cap, a keep-alive connection that has served a request may be closed to make room once
    it has been idle this long (:mod:`ix_gpu.runtime.connection_slots`). Go's transport, the
    apiserver's, reuses its most recently used connection first, so one idle 15 s is a spare; a
    burst of new connections (300 at once take 3-9 s here) then never costs a connection in use.
    Under uvicorn's 30 s keep-alive timeout, so that a squatter has to keep sending to keep any."""
    header_timeout: float = 10.0
    max_header_bytes: int = 64 << 10
    max_inflight_body_bytes: int = 16 << 20
    offload_bytes: int = 64 << 10
    tls_read_buffer_bytes: int = 64 << 10
    request_budget: float = 0.75
