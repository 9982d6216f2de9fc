"""Namespace facts for the mutation core: a watch-backed cache, or "unknown" without a cluster.

Why the webhook looks Namespaces up itself: the opt-out ``ix-gpu.io/inject: disabled`` may be an
annotation, and neither ``namespaceSelector`` nor CEL ``matchConditions`` can see namespace
annotations. Why a cache: the webhook is on the path of every Pod create, so a request must not
wait on the API server in the common case. A list + watch (resourceVersion continued, re-list on
410 Gone, exponential backoff on errors) keeps an in-memory copy; only a miss (a namespace created
a moment ago) costs a direct GET, tried again with backoff within a budget shorter than the
apiserver's own timeout for the webhook (``--namespace-lookup-budget``): a namespace created while
the API server restarts is then read by a later try, where one try of 2 s had the GPU pod admitted
untouched (docs/design.md, "A namespace the webhook cannot read yet").

The list and watch are :mod:`ix_gpu.kube.list_watch`'s, metadata only and in pages, each
Namespace made its :class:`NamespaceFacts` as its page is parsed. The cache runs in one daemon
thread; readers on the event loop only do ``dict.get`` (atomic under the GIL).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import time
import urllib.error
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import quote

import orjson

from ix_gpu.config.text import one_line
from ix_gpu.devicemodel import labels
from ix_gpu.kube.apiserver import ApiServer
from ix_gpu.kube.kubeconfig import read_kubeconfig
from ix_gpu.kube.list_watch import (
    PAGE_SIZE,
    PARTIAL_METADATA,
    ApiListWatch,
    ListWatchApi,
)
from ix_gpu.kube.watched_cache import WatchedCache
from ix_gpu.webhook.core.decision import NamespaceFacts
from ix_gpu.webhook.service.metrics import ServiceMetrics

log = logging.getLogger("ix_gpu.namespaces")

# The core reads only these keys; keeping just them bounds memory in clusters where every
# namespace carries kilobytes of last-applied-configuration annotations.
_KEPT_PREFIXES = (labels.PREFIX + "/", "pod-security.kubernetes.io/")
LOOKUP_RETRY_FIRST_S = 0.1
LOOKUP_RETRY_MAX_S = 1.0
"""A missed namespace's GET is tried again after 0.1 s, doubling to 1 s, while its budget lasts."""


class NamespaceLookupFailed(Exception):
    """The namespace's facts could not be learned (API server unreachable, timeout, error)."""


class NamespaceSource(Protocol):
    mode: str

    def cached_facts(self, name: str) -> NamespaceFacts | None:
        """Facts without waiting (None: not in memory, ask :meth:`facts`). Touches no lock and
        counts nothing, so a forked child may call it (see :class:`.limits.HeavyLane`)."""

    def count_hit(self) -> None:
        """Count one answer served from :meth:`cached_facts` (the caller counts, in the parent)."""

    async def facts(self, name: str) -> NamespaceFacts:
        """Facts, fetched when not in memory; raises :class:`NamespaceLookupFailed`."""

    def ready(self) -> bool: ...

    def status(self) -> dict[str, Any]: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


class UnknownNamespaces:
    """No cluster access (local runs): every namespace is unknown, and that is not a failure."""

    mode = "unknown"

    def cached_facts(self, name: str) -> NamespaceFacts | None:
        return NamespaceFacts.unknown(name)

    def count_hit(self) -> None:
        pass

    async def facts(self, name: str) -> NamespaceFacts:
        return NamespaceFacts.unknown(name)

    def ready(self) -> bool:
        return True

    def status(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "ready": True,
            "podSecurity": "unchecked: hostPath is injected without reading namespace labels (each "
            "such admission warns and counts in ix_gpu_admission_pod_security_unchecked_total)",
        }

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def _kept(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(v, str) and str(k).startswith(_KEPT_PREFIXES)}


def namespace_facts(obj: Any) -> NamespaceFacts | None:
    """Facts from a Namespace object (a plain dict, or facts already made by
    :func:`slim_namespace`), or None when it has no name."""
    if isinstance(obj, NamespaceFacts):
        return obj
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(metadata, dict):
        return None
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        return None
    return NamespaceFacts(name, _kept(metadata.get("labels")), _kept(metadata.get("annotations")))


def slim_namespace(obj: Any) -> Any:
    """A listed Namespace as what the cache keeps of it, its :class:`NamespaceFacts` (the name and
    the labels and annotations under the kept prefixes), made while its page is parsed: nothing of
    the rest (managedFields, a last-applied-configuration) outlives the page."""
    facts = namespace_facts(obj)
    return obj if facts is None else facts


class NamespaceApi(ListWatchApi, Protocol):
    def get(self, name: str, timeout: float) -> dict[str, Any] | None: ...


class NamespaceListWatch(ApiListWatch):
    """Namespaces, metadata only, each listed one made its facts as its page is parsed."""

    def __init__(self, api: ApiServer, list_timeout: float = 15.0, page_size: int = PAGE_SIZE) -> None:
        super().__init__(
            api,
            "/api/v1/namespaces",
            "namespace",
            list_timeout=list_timeout,
            page_size=page_size,
            slim=slim_namespace,
            metadata_only=True,
            parse=orjson.loads,
        )

    def get(self, name: str, timeout: float) -> dict[str, Any] | None:
        """One Namespace's metadata; None when it does not exist."""
        try:
            doc = self.api.request(
                "GET",
                f"{self.path}/{quote(name, safe='')}",
                accept=PARTIAL_METADATA,
                timeout=timeout,
                parse=orjson.loads,
            )
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
        return doc if isinstance(doc, dict) else None


def api_server(kubeconfig: str | None) -> ApiServer:
    """The API server from a kubeconfig file, or in-cluster when ``kubeconfig`` is None. Raises
    ``ValueError`` naming what is missing or what the kubeconfig has that this client cannot use."""
    if kubeconfig is not None:
        return read_kubeconfig(kubeconfig)
    found = ApiServer.in_cluster()
    if found is None:
        raise ValueError(
            "not in a cluster: KUBERNETES_SERVICE_HOST/PORT or the service-account token is missing"
        )
    return found


class NamespaceCache(WatchedCache):
    """List + watch of Namespaces; ``facts()`` answers from memory, GETs on a miss."""

    mode = "watch"
    what = "namespace"
    log = log

    def __init__(
        self,
        api: NamespaceApi,
        *,
        metrics: ServiceMetrics | None = None,
        lookup_timeout: float = 2.0,
        lookup_budget: float = 3.0,
        watch_timeout: int = 300,
        backoff: tuple[float, float] = (0.5, 30.0),
        clock: Callable[[], float] = time.monotonic,
        max_staleness: float | None = None,
    ) -> None:
        super().__init__(
            api, watch_timeout=watch_timeout, backoff=backoff, clock=clock, max_staleness=max_staleness
        )
        self._namespaces = api
        self._metrics = metrics
        self._counters: dict[str, Any] = {}
        self._lookup_timeout = lookup_timeout
        self._lookup_budget = lookup_budget
        self._inflight: dict[str, asyncio.Future[NamespaceFacts]] = {}
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="ns-get")
        if metrics is not None:
            metrics.namespace_cache_gauges(lambda: float(len(self._items)), self.staleness_seconds)

    def _entry(self, obj: Any) -> tuple[str, NamespaceFacts] | None:
        facts = namespace_facts(obj)
        return None if facts is None else (facts.name, facts)

    def _relisted(self) -> None:
        if self._metrics is not None:
            self._metrics.namespace_relists.inc()

    def _watch_failed(self) -> None:
        if self._metrics is not None:
            self._metrics.namespace_watch_errors.inc()

    def stop(self) -> None:
        super().stop()
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ---------------------------------------------------------------- readers (event loop)

    def cached(self, name: str) -> NamespaceFacts | None:
        """What the cache holds for ``name`` (not counted in metrics)."""
        found: NamespaceFacts | None = self._items.get(name)
        return found

    def cached_facts(self, name: str) -> NamespaceFacts | None:
        found: NamespaceFacts | None = self._items.get(name)
        return found

    def count_hit(self) -> None:
        self._count("hit")

    async def facts(self, name: str) -> NamespaceFacts:
        found: NamespaceFacts | None = self._items.get(name)
        if found is not None:
            self._count("hit")
            return found
        future = self._inflight.get(name)
        if future is None:
            # One GET per missing name, however many requests for it arrive meanwhile.
            # The budget runs from now, not from when a worker is free: lookups queued behind
            # others that retry (the API server down, many new namespaces) wait no longer for it.
            deadline = time.monotonic() + self._lookup_budget
            future = asyncio.get_running_loop().run_in_executor(self._executor, self._fetch, name, deadline)
            self._inflight[name] = future
            future.add_done_callback(lambda _: self._inflight.pop(name, None))
        return await asyncio.shield(future)

    def _fetch(self, name: str, deadline: float) -> NamespaceFacts:
        obj = self._get_within_budget(name, deadline)
        if isinstance(obj, NamespaceFacts):
            return obj  # the watch brought it while the GET was retried
        if obj is None:
            # NamespaceLifecycle rejects objects in absent namespaces before webhooks see them,
            # so this is a race with a deletion; there is nothing to opt out with.
            self._count("absent")
            return NamespaceFacts(name)
        facts = namespace_facts(obj)
        if facts is None or facts.name != name:
            self._count("failed")
            raise NamespaceLookupFailed(f'namespace "{name}": the API server answered with something else')
        self._count("fetched")
        self._items.setdefault(name, facts)
        return facts

    def _get_within_budget(self, name: str, deadline: float) -> dict[str, Any] | NamespaceFacts | None:
        """The namespace's GET, tried again with backoff while the lookup budget lasts: a namespace
        created a moment ago, asked for while the API server restarts (or the webhook's
        connection to it is new), is refused by one try and read by the next. Only errors that
        may pass are retried (no answer, a 5xx, 429); a 403 says the same again. Raises
        :class:`NamespaceLookupFailed` naming the tries."""
        delay, tries = LOOKUP_RETRY_FIRST_S, 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:  # spent queued behind other lookups: no try would be answered in time
                self._count("failed")
                raise NamespaceLookupFailed(
                    f'namespace "{name}" could not be read within {self._lookup_budget:g} s '
                    "(the lookups before it took the time)"
                )
            tries += 1
            try:
                return self._namespaces.get(name, max(0.1, min(self._lookup_timeout, left)))
            except Exception as exc:
                error = exc
            left = deadline - time.monotonic()
            code = getattr(error, "code", None)
            if left <= delay or (isinstance(code, int) and 400 <= code < 500 and code != 429):
                self._count("failed")
                raise NamespaceLookupFailed(
                    f'namespace "{name}" could not be read ({tries} tries in {self._lookup_budget:g} s): '
                    f"{one_line(error)}"
                ) from None
            self._count("retried")
            time.sleep(delay * random.uniform(0.8, 1.2))
            found: NamespaceFacts | None = self._items.get(name)
            if found is not None:
                return found
            delay = min(delay * 2, LOOKUP_RETRY_MAX_S)

    def _count(self, result: str) -> None:
        # The labelled child is looked up once per result: ``labels()`` on every admission (a hit
        # is counted for nearly every review) cost about 7,000 instructions of a 2 KB review's 350,000.
        counter = self._counters.get(result)
        if counter is None and self._metrics is not None:
            counter = self._counters[result] = self._metrics.namespace_lookups.labels(result)
        if counter is not None:
            counter.inc()
