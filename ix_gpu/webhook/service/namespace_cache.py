"""Namespace facts for the mutation core: a watch-backed cache, or "unknown" without a cluster.

Why the webhook looks Namespaces up itself: the opt-out ``ix-gpu.io/inject: disabled`` may be an
annotation, and neither ``namespaceSelector`` nor CEL ``matchConditions`` can see namespace
annotations. Why a cache: the webhook is on the path of every Pod create, so a request must not
wait on the API server in the common case. A list + watch (resourceVersion continued, re-list on
410 Gone, exponential backoff on errors) keeps an in-memory copy; only a miss (a namespace created
a moment ago) costs a direct GET, bounded by a short timeout.

The kubernetes client is used for what it is good at — kubeconfig/in-cluster auth, TLS, the URL
layout — with ``_preload_content=False``: its model deserialisation would turn every Namespace
into Python objects we immediately throw away. The cache runs in one daemon thread because the
client is synchronous; readers on the event loop only do ``dict.get`` (atomic under the GIL).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import orjson

from ix_gpu.config.text import one_line
from ix_gpu.devicemodel import labels
from ix_gpu.runtime.kube import client_configuration
from ix_gpu.webhook.core.decision import NamespaceFacts
from ix_gpu.webhook.service.metrics import ServiceMetrics

log = logging.getLogger("ix_gpu.namespaces")

# The core reads only these keys; keeping just them bounds memory in clusters where every
# namespace carries kilobytes of last-applied-configuration annotations.
_KEPT_PREFIXES = (labels.PREFIX + "/", "pod-security.kubernetes.io/")


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


def _resource_version(obj: Any) -> str | None:
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    value = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
    return value if isinstance(value, str) and value else None


class ApiGone(Exception):
    """410 Gone: the resourceVersion is too old to watch from; re-list."""


class NamespaceApi(Protocol):
    def list(self) -> tuple[list[Any], str]: ...

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]: ...

    def get(self, name: str, timeout: float) -> dict[str, Any] | None: ...

    def close(self) -> None: ...


class ListWatchApi(Protocol):
    def list(self) -> tuple[list[Any], str]: ...

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]: ...

    def close(self) -> None: ...


PAGE_SIZE = 500
"""Objects per list request. A list is read a page at a time and each page is cut down to what the
cache keeps before the next is read, so the memory a (re-)list needs grows with the page, not
with the cluster: parsed whole, 50,000 namespaces with their managedFields and annotations took
the webhook to 356 MiB after a start, peak 680 MiB, past the chart's 256 MiB limit; in pages, 127
MiB (``bench/namespace_scale.py``, docs/benchmarks.md)."""

PARTIAL_METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
PARTIAL_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
"""What to ask for when only an object's metadata is read: the apiserver leaves out spec and status
(falling back to the whole object where it cannot)."""


class KubernetesListWatch:
    """List and watch of one resource (``list_method``, a kubernetes client list call) as raw JSON.

    ``slim`` cuts each listed object down to what the cache keeps, as its page is parsed (the
    default keeps it whole). ``metadata_only`` asks the apiserver for metadata alone
    (``PartialObjectMetadata``), for caches that read nothing else."""

    def __init__(
        self,
        list_method: Callable[..., Any],
        what: str,
        list_timeout: float = 15.0,
        *,
        page_size: int = PAGE_SIZE,
        slim: Callable[[Any], Any] | None = None,
        metadata_only: bool = False,
    ) -> None:
        self._list_method = list_method
        self._what = what
        self._list_timeout = list_timeout
        self._page_size = page_size
        self._slim = slim
        self._list_headers = {"Accept": PARTIAL_METADATA_LIST} if metadata_only else None
        self._watch_headers = {"Accept": PARTIAL_METADATA} if metadata_only else None
        self._response: Any = None
        self._lock = threading.Lock()
        self.pages = 0
        """List requests made (a page each), for tests and the status."""

    def list(self) -> tuple[list[Any], str]:
        """Every object, a page at a time (``limit``/``continue``), with the resourceVersion of the
        first page: the apiserver serves the pages of one list from one snapshot, so watching from
        that version misses nothing. A continue token that expired mid-list is a 410 (ApiGone),
        and the caller lists again from the start."""
        items: list[Any] = []
        version: str | None = None
        token = ""
        while True:
            kwargs: dict[str, Any] = {"limit": self._page_size}
            if token:
                kwargs["_continue"] = token
            if self._list_headers is not None:
                kwargs["_headers"] = self._list_headers
            resp = self._call(
                self._list_method, _preload_content=False, _request_timeout=self._list_timeout, **kwargs
            )
            self.pages += 1
            doc = orjson.loads(resp.data)
            page = doc.get("items") if isinstance(doc, dict) else None
            metadata = doc.get("metadata") if isinstance(doc, dict) else None
            if not isinstance(page, list) or not isinstance(metadata, dict):
                raise ValueError(f"{self._what} list without items or metadata")
            if version is None:
                version = _resource_version(doc)
                if version is None:
                    raise ValueError(f"{self._what} list without metadata.resourceVersion")
            items.extend(page if self._slim is None else map(self._slim, page))
            del doc, page  # this page's parse is garbage before the next one is read
            token = metadata.get("continue") or ""
            if not isinstance(token, str) or not token:
                return items, version

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        resp = self._call(
            self._list_method,
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_seconds,
            **({"_headers": self._watch_headers} if self._watch_headers is not None else {}),
            _preload_content=False,
            # Connect fast; the read may legitimately idle until the server ends the watch.
            _request_timeout=(self._list_timeout, timeout_seconds + 30),
        )
        with self._lock:
            self._response = resp
        try:
            buffer = b""
            for chunk in resp.stream(amt=None, decode_content=True):
                buffer += chunk
                while (newline := buffer.find(b"\n")) >= 0:
                    line, buffer = buffer[:newline], buffer[newline + 1 :]
                    if line.strip():
                        event = orjson.loads(line)
                        if isinstance(event, dict):
                            yield event
        finally:
            with self._lock:
                self._response = None
            resp.release_conn()

    def close(self) -> None:
        """Abort a running watch (called from another thread at shutdown)."""
        with self._lock:
            resp = self._response
        if resp is not None:
            # Closing a socket under a reader may raise anything; we are stopping anyway.
            with contextlib.suppress(Exception):
                resp.shutdown() if hasattr(resp, "shutdown") else resp.close()

    @staticmethod
    def _call(method: Callable[..., Any], **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return method(**kwargs)
        except ApiException as exc:
            if exc.status == 410:
                raise ApiGone(str(exc.reason)) from None
            raise


class KubernetesNamespaceApi(KubernetesListWatch):
    """Namespaces through the kubernetes client, as raw JSON."""

    def __init__(self, api_client: Any, list_timeout: float = 15.0, page_size: int = PAGE_SIZE) -> None:
        from kubernetes import client

        # Typed as Any: with _preload_content=False the client returns raw urllib3 responses,
        # which its own annotations (written for the deserialised models) do not describe.
        self._core: Any = client.CoreV1Api(api_client)
        super().__init__(
            self._core.list_namespace,
            "namespace",
            list_timeout,
            page_size=page_size,
            slim=slim_namespace,
            metadata_only=True,
        )

    def get(self, name: str, timeout: float) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self._core.read_namespace(
                name, _preload_content=False, _request_timeout=timeout, _headers={"Accept": PARTIAL_METADATA}
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        doc = orjson.loads(resp.data)
        return doc if isinstance(doc, dict) else None


def api_client(kubeconfig: str | None) -> Any:
    """A kubernetes ApiClient from a kubeconfig file, or in-cluster when ``kubeconfig`` is None."""
    from kubernetes import client

    configuration = client_configuration(kubeconfig)
    # The client retries failed requests 3 times by default; our loop does its own backoff.
    configuration.retries = False
    return client.ApiClient(configuration)


def kubernetes_api(kubeconfig: str | None) -> KubernetesNamespaceApi:
    """The Namespace API from a kubeconfig file, or in-cluster when ``kubeconfig`` is None."""
    return KubernetesNamespaceApi(api_client(kubeconfig))


class WatchedCache:
    """A list + watch of one resource kept in a dict; subclasses say what each object becomes.

    As client-go's reflector: list once, then keep watching from the last resourceVersion, in one
    daemon thread. Readers on the event loop (or in a forked child) only do ``dict.get``, atomic
    under the GIL, and touch no lock.
    """

    what = "object"
    """What the log lines call the cached objects."""

    def __init__(
        self,
        api: ListWatchApi,
        *,
        watch_timeout: int = 300,
        backoff: tuple[float, float] = (0.5, 30.0),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._watch_timeout = watch_timeout
        self._backoff = backoff
        self._clock = clock
        self._items: dict[Any, Any] = {}
        self._resource_version = ""
        self._synced = threading.Event()
        self._stopping = threading.Event()
        self._last_heard: float | None = None
        self._last_error: str | None = None
        self._thread: threading.Thread | None = None

    def _entry(self, obj: Any) -> tuple[Any, Any] | None:
        """(key, value) that ``obj`` is kept as; None to leave it out."""
        raise NotImplementedError

    def _relisted(self) -> None:
        """Called after each full list (for metrics)."""

    def _watch_failed(self) -> None:
        """Called after each failed list or watch (for metrics)."""

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"{self.what}-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._api.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    # ---------------------------------------------------------------- readers

    def ready(self) -> bool:
        return self._synced.is_set()

    def staleness_seconds(self) -> float:
        heard = self._last_heard
        return 0.0 if heard is None else max(0.0, self._clock() - heard)

    def status(self) -> dict[str, Any]:
        return {
            "mode": "watch",
            "ready": self.ready(),
            "synced": self._synced.is_set(),
            "size": len(self._items),
            "stalenessSeconds": round(self.staleness_seconds(), 3),
            "lastError": self._last_error,
        }

    # ---------------------------------------------------------------- list + watch (thread)

    def _run(self) -> None:
        # A transient error (a dropped keep-alive connection, an apiserver restart) resumes the
        # watch after a backoff; only 410 Gone — the history we would resume from is compacted —
        # or having no version yet costs a full re-list.
        delay = self._backoff[0]
        need_list = True
        while not self._stopping.is_set():
            try:
                if need_list:
                    self._relist()
                    need_list = False
                while not self._stopping.is_set():
                    self._watch_once()
                    delay = self._backoff[0]
            except ApiGone:
                log.info(f"{self.what} watch expired (410 Gone); re-listing")
                need_list = True
            except Exception as exc:
                if self._stopping.is_set():
                    break
                self._last_error = one_line(exc)
                self._watch_failed()
                wait = delay * random.uniform(0.8, 1.2)
                log.warning(
                    f"{self.what} list/watch failed; retrying",
                    extra={"fields": {"error": self._last_error, "retryInSeconds": round(wait, 2)}},
                )
                self._stopping.wait(wait)
                delay = min(delay * 2, self._backoff[1])
                need_list = need_list or not self._resource_version

    def _relist(self) -> None:
        items, version = self._api.list()
        fresh: dict[Any, Any] = {}
        for item in items:
            entry = self._entry(item)
            if entry is not None:
                fresh[entry[0]] = entry[1]
        self._items = fresh
        self._resource_version = version
        self._heard()
        self._relisted()
        if not self._synced.is_set():
            log.info(f"{self.what} cache synced", extra={"fields": {"count": len(fresh)}})
        self._synced.set()

    def _watch_once(self) -> None:
        for event in self._api.watch(self._resource_version, self._watch_timeout):
            if self._stopping.is_set():
                return
            kind, obj = event.get("type"), event.get("object")
            if kind == "ERROR":
                code = obj.get("code") if isinstance(obj, dict) else None
                if code == 410:
                    raise ApiGone("watch event: 410 Gone")
                message = obj.get("message") if isinstance(obj, dict) else None
                raise RuntimeError(f"watch error event: {code} {message}")
            version = _resource_version(obj)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                entry = self._entry(obj)
                if entry is not None and kind == "DELETED":
                    self._items.pop(entry[0], None)
                elif entry is not None:
                    self._items[entry[0]] = entry[1]
            if version is not None:
                self._resource_version = version
            self._heard()
        # The server ended the watch (timeoutSeconds): a healthy, quiet cluster.
        self._heard()

    def _heard(self) -> None:
        self._last_heard = self._clock()
        self._last_error = None


class NamespaceCache(WatchedCache):
    """List + watch of Namespaces; ``facts()`` answers from memory, GETs on a miss."""

    mode = "watch"
    what = "namespace"

    def __init__(
        self,
        api: NamespaceApi,
        *,
        metrics: ServiceMetrics | None = None,
        lookup_timeout: float = 2.0,
        watch_timeout: int = 300,
        backoff: tuple[float, float] = (0.5, 30.0),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(api, watch_timeout=watch_timeout, backoff=backoff, clock=clock)
        self._namespaces = api
        self._metrics = metrics
        self._counters: dict[str, Any] = {}
        self._lookup_timeout = lookup_timeout
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
            future = asyncio.get_running_loop().run_in_executor(self._executor, self._fetch, name)
            self._inflight[name] = future
            future.add_done_callback(lambda _: self._inflight.pop(name, None))
        return await asyncio.shield(future)

    def _fetch(self, name: str) -> NamespaceFacts:
        try:
            obj = self._namespaces.get(name, self._lookup_timeout)
        except Exception as exc:
            self._count("failed")
            raise NamespaceLookupFailed(f'namespace "{name}" could not be read: {one_line(exc)}') from None
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

    def _count(self, result: str) -> None:
        # The labelled child is looked up once per result: ``labels()`` on every admission (a hit
        # is counted for nearly every review) cost about 7,000 instructions of a 2 KB review's 350,000.
        counter = self._counters.get(result)
        if counter is None and self._metrics is not None:
            counter = self._counters[result] = self._metrics.namespace_lookups.labels(result)
        if counter is not None:
            counter.inc()
