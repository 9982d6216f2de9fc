"""Claim facts for the mutation core: what the cluster's ResourceClaims and ResourceClaimTemplates
request, from two watch-backed caches (resource.k8s.io/v1), or nothing without a cluster.

Why a watch and no GET on a miss: the webhook is on the path of every Pod create, and a DRA pod
names its claim template a moment after creating it, so a GET per review would be a request per
DRA pod to the API server. That moment is also why a miss is waited on: ``kubectl apply`` of a
claim and its pods sends the pods within milliseconds of the claim, before the watch event, so the
handler gives a synced cache :data:`ARRIVAL_WAIT` seconds for the names a review missed
(:meth:`ClaimCache.arrival`) and then answers again. A claim still missing (or a cache not synced)
is unknown, and ``policy.claimLookupFailure`` decides in the core. Only each request's name and
device class is kept, cut from each list page as it is parsed (:func:`slim_claim`): a claim's
selectors, status and managedFields can be kilobytes, and 20,000 of them must not be parsed whole.

Neither cache gates readiness: on a cluster without resource.k8s.io/v1 (before 1.34, or DRA off)
the lists fail, the caches keep retrying with backoff, and limits-based GPU pods are served as
before; ``/readyz`` details say so.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import orjson

from ix_gpu.kube.apiserver import ApiServer
from ix_gpu.kube.list_watch import ApiListWatch, ListWatchApi
from ix_gpu.kube.watched_cache import WatchedCache
from ix_gpu.webhook.core.claims import (
    RESOURCE_CLAIM,
    RESOURCE_CLAIM_TEMPLATE,
    DeviceRequests,
    claim_key,
    device_requests,
)
from ix_gpu.webhook.service.metrics import ServiceMetrics

ARRIVAL_WAIT = 1.5
"""Seconds a review waits for claims its pod names that a synced cache does not hold yet: a watch
event follows its object's create by milliseconds; well inside the apiserver's webhook timeout."""
ARRIVAL_POLLS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)
"""Pauses between checks, the last repeated: a watch event usually lands within the first few,
and a review waiting for a claim that never comes wakes about ten times, not 150 (a client
sending many such reviews must not turn each into a busy loop)."""

ClaimName = tuple[str, str, str]
"""(kind, namespace, name) of a ResourceClaim or ResourceClaimTemplate."""


class MissRecorder:
    """Claim facts that note each name they could not answer, so the handler knows what to wait for
    without the core reporting it: the core stays the same pure call."""

    def __init__(self, facts: Any) -> None:
        self.facts = facts
        self.missed: list[ClaimName] = []

    def device_requests(self, kind: str, namespace: str, name: str) -> DeviceRequests | None:
        found: DeviceRequests | None = self.facts.device_requests(kind, namespace, name)
        if found is None:
            self.missed.append((kind, namespace, name))
        return found


class ClaimEntry(NamedTuple):
    """What a claim cache keeps of one ResourceClaim or ResourceClaimTemplate."""

    namespace: str
    name: str
    requests: DeviceRequests


def _interned(requests: DeviceRequests) -> DeviceRequests:
    # Thousands of claims name the same few requests and device classes: one string each.
    return tuple((sys.intern(name), sys.intern(device_class)) for name, device_class in requests)


def claim_entry(kind: str, obj: Any) -> ClaimEntry | None:
    """``obj`` (a ResourceClaim or ResourceClaimTemplate of ``kind``, as listed or watched) as
    what the cache keeps of it; None when it has no namespace or name."""
    if isinstance(obj, ClaimEntry):
        return obj
    if isinstance(obj, dict) and "kind" not in obj:
        obj = {**obj, "kind": kind}  # list items and watch events may omit it
    key = claim_key(obj)
    if key is None or key[1] is None:
        return None
    return ClaimEntry(sys.intern(key[1]), key[2], _interned(device_requests(obj)))


def slim_claim(kind: str) -> Callable[[Any], Any]:
    """A listed object of ``kind`` cut to its :class:`ClaimEntry` while its page is parsed, so a
    claim's selectors, status and managedFields (kilobytes) never outlive the page."""

    def slim(obj: Any) -> Any:
        entry = claim_entry(kind, obj)
        return obj if entry is None else entry

    return slim


class _ClaimKindCache(WatchedCache):
    """One kind's (namespace, name) → device requests."""

    log = logging.getLogger("ix_gpu.claims")

    def __init__(self, kind: str, api: ListWatchApi, **options: Any) -> None:
        super().__init__(api, **options)
        self.kind = kind
        self.what = kind

    def _entry(self, obj: Any) -> tuple[tuple[str, str], DeviceRequests] | None:
        entry = claim_entry(self.kind, obj)
        return None if entry is None else ((entry.namespace, entry.name), entry.requests)

    def size(self) -> float:
        return float(len(self._items))

    def requests(self, namespace: str, name: str) -> DeviceRequests | None:
        found: DeviceRequests | None = self._items.get((namespace, name))
        return found


class ClaimCache:
    """ResourceClaims and ResourceClaimTemplates, cluster-wide, kept as their device requests."""

    mode = "watch"

    def __init__(self, claims: ListWatchApi, templates: ListWatchApi, **options: Any) -> None:
        self._kinds = {
            RESOURCE_CLAIM: _ClaimKindCache(RESOURCE_CLAIM, claims, **options),
            RESOURCE_CLAIM_TEMPLATE: _ClaimKindCache(RESOURCE_CLAIM_TEMPLATE, templates, **options),
        }

    def device_requests(self, kind: str, namespace: str, name: str) -> DeviceRequests | None:
        cache = self._kinds.get(kind)
        if cache is None or not cache.ready():
            return None
        return cache.requests(namespace, name)

    async def arrival(self, names: Iterable[ClaimName], timeout: float = ARRIVAL_WAIT) -> bool:
        """Whether every one of ``names`` is held within ``timeout`` seconds. False at once while a
        cache is not synced: then nothing says the name exists, and a resync is not milliseconds."""
        wanted = tuple(dict.fromkeys(names))
        deadline = time.monotonic() + timeout
        pauses = iter(ARRIVAL_POLLS)
        while True:
            if all(self.device_requests(*name) is not None for name in wanted):
                return True
            left = deadline - time.monotonic()
            if not all(cache.ready() for cache in self._kinds.values()) or left <= 0:
                return False
            await asyncio.sleep(min(next(pauses, ARRIVAL_POLLS[-1]), left))

    def export_sizes(self, metrics: ServiceMetrics) -> None:
        """``ix_gpu_claim_cache_size{kind}``, computed at scrape time."""
        for kind, cache in self._kinds.items():
            metrics.claim_cache_size.labels(kind).set_function(cache.size)

    def start(self) -> None:
        for cache in self._kinds.values():
            cache.start()

    def stop(self) -> None:
        for cache in self._kinds.values():
            cache.stop()

    def wait_synced(self, timeout: float) -> bool:
        return all(cache.wait_synced(timeout) for cache in self._kinds.values())

    def status(self) -> dict[str, Any]:
        return {kind: cache.status() for kind, cache in self._kinds.items()}


CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"
TEMPLATES_PATH = "/apis/resource.k8s.io/v1/resourceclaimtemplates"


def claim_cache(api: ApiServer, **options: Any) -> ClaimCache:
    """Both caches, cluster-wide, through resource.k8s.io/v1."""
    return ClaimCache(
        ApiListWatch(api, CLAIMS_PATH, "resourceclaim", slim=slim_claim(RESOURCE_CLAIM), parse=orjson.loads),
        ApiListWatch(
            api,
            TEMPLATES_PATH,
            "resourceclaimtemplate",
            slim=slim_claim(RESOURCE_CLAIM_TEMPLATE),
            parse=orjson.loads,
        ),
        **options,
    )
