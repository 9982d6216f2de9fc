"""What a ResourceClaim allocated to this driver on this node, read from the API server.

The kubelet's NodePrepareResources carries only references (namespace, name, uid): the plugin
reads ``status.allocation.devices.results`` itself. The uid is compared, because a claim deleted
and created again under the same name is another claim, whose allocation the kubelet did not ask
about. Results for other drivers are someone else's; a result of ours from another pool is an
error, since this node's plugin can only prepare devices of this node's pool.

Claims are read over kept-alive connections (:class:`ClaimReader`): a new TLS connection per
claim, as :meth:`ApiServer.request` opens, cost the plugin 3 ms of CPU and the kubelet 5 ms of
Prepare latency per claim on the benchmark's machine (``bench/dra_bench.py``), against 0.3 ms and
1 ms kept alive. The token is still read on every request and the CA files on every new connection
(:meth:`ApiServer.ssl_context`), and connections idle for ``idle_s`` are closed.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from ix_gpu.runtime.kube import ApiServer

RESOURCE_API = "/apis/resource.k8s.io/v1"


class ClaimError(Exception):
    """The claim cannot be prepared; the message is what the kubelet shows in the pod's events."""


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True)
class Allocated:
    """One allocation result of ours: ``request`` may be ``<request>/<subrequest>``."""

    request: str
    device: str
    share_id: str | None = None
    memory: str | None = None
    """The memory a shared device's allocation consumed (``consumedCapacity.memory``), as the
    scheduler wrote it; None for a device allocated whole."""


def claim_path(ref: ClaimRef) -> str:
    namespace, name = quote(ref.namespace, safe=""), quote(ref.name, safe="")
    return f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}"


def read_claim(api: ApiServer, ref: ClaimRef) -> dict[str, Any]:
    """GET the claim; ``OSError`` when the API server cannot be asked."""
    claim = api.request("GET", claim_path(ref))
    if not isinstance(claim, dict):
        raise ClaimError(f"claim {ref}: the API server answered no object")
    return claim


class ClaimReader:
    """``read(ref)``: GET a claim, as :func:`read_claim`, over at most ``keep`` idle connections
    kept for ``idle_s``. Thread-safe: each request has its connection to itself. Where a proxy
    applies to the API server (``HTTPS_PROXY`` without a ``NO_PROXY`` match), every read goes
    through :meth:`ApiServer.request`, which honours it."""

    def __init__(self, api: ApiServer, *, keep: int = 2, idle_s: float = 30.0, timeout: float = 10.0) -> None:
        self.api, self.keep, self.idle_s, self.timeout = api, keep, idle_s, timeout
        url = urlsplit(api.base_url)
        self._https = url.scheme == "https"
        self._host, self._port = url.hostname or "", url.port
        self._prefix = url.path.rstrip("/")
        proxied = url.scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(self._host)
        self.direct = not proxied
        self._lock = threading.Lock()
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []
        self.opened = 0
        """Connections opened so far."""

    def read(self, ref: ClaimRef) -> dict[str, Any]:
        """The claim; ``OSError`` when the API server cannot be asked or answers an error
        (``urllib.error.HTTPError``, as from :meth:`ApiServer.request`)."""
        if not self.direct:
            return read_claim(self.api, ref)
        path = claim_path(ref)
        for attempt in range(2):
            connection, reused = self._take()
            try:
                status, reason, headers, raw = self._get(connection, self._prefix + path)
            except (ConnectionError, http.client.BadStatusLine):
                connection.close()
                if reused and attempt == 0:
                    continue  # the server closed the idle connection first: a GET may be retried
                raise
            except BaseException:
                connection.close()
                raise
            self._give(connection, reusable=headers.get("Connection", "").lower() != "close")
            if status >= 300:
                url = f"{self.api.base_url}{path}"
                raise urllib.error.HTTPError(url, status, reason, headers, None)
            claim = json.loads(raw) if raw else None
            if not isinstance(claim, dict):
                raise ClaimError(f"claim {ref}: the API server answered no object")
            return claim
        raise AssertionError("unreachable")

    def _get(
        self, connection: http.client.HTTPConnection, path: str
    ) -> tuple[int, str, http.client.HTTPMessage, bytes]:
        connection.request("GET", path, headers=self.api.headers())
        response = connection.getresponse()
        raw = response.read(MAX_CLAIM_BYTES + 1)
        if len(raw) > MAX_CLAIM_BYTES:
            raise OSError(f"GET {path}: answer larger than {MAX_CLAIM_BYTES} bytes")
        if not response.isclosed():  # an unread remainder would poison the connection
            response.read()
        return response.status, response.reason, response.headers, raw

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        now = time.monotonic()
        with self._lock:
            while self._idle:
                connection, since = self._idle.pop()
                if now - since < self.idle_s:
                    return connection, True
                connection.close()
            self.opened += 1
        if self._https:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=self.timeout, context=self.api.ssl_context()
            ), False
        return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout), False

    def _give(self, connection: http.client.HTTPConnection, *, reusable: bool) -> None:
        with self._lock:
            if reusable and len(self._idle) < self.keep:
                self._idle.append((connection, time.monotonic()))
                return
        connection.close()

    def close_idle(self, *, everything: bool = False) -> None:
        """Close the connections idle for ``idle_s`` or more (all of them with ``everything``)."""
        now = time.monotonic()
        with self._lock:
            stale = [c for c, since in self._idle if everything or now - since >= self.idle_s]
            self._idle = [(c, since) for c, since in self._idle if c not in stale]
        for connection in stale:
            connection.close()


MAX_CLAIM_BYTES = 4 << 20  # = ApiServer.request's default cap


def allocated(claim: dict[str, Any], ref: ClaimRef, driver: str, pool: str) -> list[Allocated]:
    """The results of ``claim`` that this driver prepares on this node, in the claim's order."""
    uid = (claim.get("metadata") or {}).get("uid")
    if uid != ref.uid:
        raise ClaimError(f"claim {ref}: the API server has uid {uid!r}, the kubelet asked for another claim")
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, dict):
        raise ClaimError(f"claim {ref} is not allocated")
    results = (allocation.get("devices") or {}).get("results") or []
    found = []
    for result in results:
        if not isinstance(result, dict) or result.get("driver") != driver:
            continue
        device, result_pool = str(result.get("device", "")), str(result.get("pool", ""))
        if result_pool != pool:
            raise ClaimError(
                f"claim {ref}: device {device} is in pool {result_pool!r}, not this node's {pool!r}"
            )
        share = result.get("shareID")
        consumed = result.get("consumedCapacity")
        memory = consumed.get("memory") if isinstance(consumed, dict) else None
        found.append(
            Allocated(
                str(result.get("request", "")),
                device,
                str(share) if share else None,
                str(memory) if memory is not None else None,
            )
        )
    return found
