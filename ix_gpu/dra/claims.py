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

Each claim of a NodePrepareResources call stands alone: whatever one claim's read or parse does,
it ends in a :class:`ClaimError` for that claim, with a reason from :data:`FAILURE_REASONS`, and
the other claims of the call are prepared. The reason is the label the failure is counted under
(``ix_gpu_dra_prepare_failures_total``), a small fixed set so that an alert can name one.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Literal, get_args
from urllib.parse import quote, urlsplit

from ix_gpu.kube.apiserver import ApiError, ApiServer

RESOURCE_API = "/apis/resource.k8s.io/v1"

FailureReason = Literal[
    "invalid",
    "refused",
    "read",
    "parse",
    "replaced",
    "not_allocated",
    "other_pool",
    "no_device",
    "cdi",
    "reset",
    "write",
    "internal",
]
"""Why a claim was not prepared (or unprepared):

* ``invalid``: the kubelet's reference is no claim (a uid that cannot name a file);
* ``refused``: this node's GPUs are not the driver's to hand out now (its allocation label);
* ``read``: the API server could not be asked, answered an error, or its answer broke off;
* ``parse``: the answer is not JSON, or not a claim's shape;
* ``replaced``: the claim under that name has another uid (deleted and created again);
* ``not_allocated``: the claim has no allocation yet;
* ``other_pool``: a device of ours allocated from another node's pool;
* ``no_device``: an allocated device this node does not have now;
* ``cdi``: the devices make no valid CDI spec;
* ``reset``: ``flags.reset_gpu`` is on and the chips' reset failed, or a chip came back with another
  UUID, or a chip is prepared for another claim;
* ``write``: the CDI spec or the checkpoint could not be written (or removed);
* ``internal``: anything else, a bug: logged with its traceback.
"""
FAILURE_REASONS: tuple[FailureReason, ...] = get_args(FailureReason)
UNPREPARE_FAILURE_REASONS: tuple[FailureReason, ...] = ("invalid", "write", "internal")
"""The reasons NodeUnprepareResources can meet: it reads nothing."""


class ClaimError(Exception):
    """The claim cannot be prepared; the message is what the kubelet shows in the pod's events,
    ``reason`` what it is counted as."""

    def __init__(self, message: str, reason: FailureReason) -> None:
        super().__init__(message)
        self.reason: FailureReason = reason


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
    """GET the claim, as :meth:`ClaimReader.read` does, through :meth:`ApiServer.request`."""
    try:
        claim = api.request("GET", claim_path(ref))
    except ApiError as exc:
        if isinstance(exc.__cause__, ValueError):  # the request's own parse failed
            raise _not_json(ref, exc.__cause__) from None
        raise
    except RecursionError:
        raise ClaimError(f"claim {ref}: the API server's answer is nested too deep", "parse") from None
    if not isinstance(claim, dict):
        raise ClaimError(f"claim {ref}: the API server answered no object", "parse")
    return claim


def _not_json(ref: ClaimRef, exc: ValueError) -> ClaimError:
    return ClaimError(f"claim {ref}: the API server's answer is not JSON: {exc}"[:500], "parse")


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
        """The claim. ``OSError`` when the API server cannot be asked, answers an error
        (``urllib.error.HTTPError``) or its answer breaks off (:class:`ApiError`, as from
        :meth:`ApiServer.request`: ``http.client`` raises no ``OSError`` for a cut body);
        :class:`ClaimError` (``parse``) when the answer is no JSON object."""
        if not self.direct:
            return read_claim(self.api, ref)
        path = claim_path(ref)
        for attempt in range(2):
            connection, reused = self._take()
            try:
                status, reason, headers, raw = self._get(connection, self._prefix + path)
            except (ConnectionError, http.client.HTTPException) as exc:
                connection.close()
                if reused and attempt == 0 and isinstance(exc, (ConnectionError, http.client.BadStatusLine)):
                    continue  # the server closed the idle connection first: a GET may be retried
                if isinstance(exc, OSError):
                    raise
                raise ApiError(f"GET {path}: {type(exc).__name__}: {exc!r}"[:500]) from exc
            except BaseException:
                connection.close()
                raise
            self._give(connection, reusable=headers.get("Connection", "").lower() != "close")
            if status >= 300:
                url = f"{self.api.base_url}{path}"
                raise urllib.error.HTTPError(url, status, reason, headers, None)
            try:
                claim = json.loads(raw) if raw else None
            except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
                raise _not_json(ref, exc) from None
            except RecursionError:  # nested deeper than any claim (the parser stops, not the plugin)
                raise ClaimError(
                    f"claim {ref}: the API server's answer is nested too deep", "parse"
                ) from None
            if not isinstance(claim, dict):
                raise ClaimError(f"claim {ref}: the API server answered no object", "parse")
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


def _object(value: Any, ref: ClaimRef, where: str) -> dict[str, Any]:
    """What the claim holds at ``where``, where an object belongs (absent: empty). Anything else
    is a claim this code cannot read, said as such rather than failing with an AttributeError."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ClaimError(f"claim {ref}: its {where} is a {type(value).__name__}, not an object", "parse")
    return value


def allocated(claim: dict[str, Any], ref: ClaimRef, driver: str, pool: str) -> list[Allocated]:
    """The results of ``claim`` that this driver prepares on this node, in the claim's order."""
    uid = _object(claim.get("metadata"), ref, "metadata").get("uid")
    if uid != ref.uid:
        raise ClaimError(
            f"claim {ref}: the API server has uid {uid!r}, the kubelet asked for another claim", "replaced"
        )
    allocation = _object(claim.get("status"), ref, "status").get("allocation")
    if allocation is None:
        raise ClaimError(f"claim {ref} is not allocated", "not_allocated")
    devices = _object(allocation, ref, "status.allocation").get("devices")
    results = _object(devices, ref, "status.allocation.devices").get("results") or []
    if not isinstance(results, list):
        raise ClaimError(f"claim {ref}: its allocation results are not a list", "parse")
    found = []
    for result in results:
        if not isinstance(result, dict) or result.get("driver") != driver:
            continue
        device, result_pool = str(result.get("device", "")), str(result.get("pool", ""))
        if result_pool != pool:
            raise ClaimError(
                f"claim {ref}: device {device} is in pool {result_pool!r}, not this node's {pool!r}",
                "other_pool",
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
