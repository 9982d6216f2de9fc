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

from ix_gpu.devicemodel import labels
from ix_gpu.devicemodel.text import one_line
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
    """Facts from a Namespace object (a plain dict), or None when it has no name."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(metadata, dict):
        return None
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        return None
    return NamespaceFacts(name, _kept(metadata.get("labels")), _kept(metadata.get("annotations")))


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


class KubernetesNamespaceApi:
    """Namespaces through the kubernetes client, as raw JSON."""

    def __init__(self, api_client: Any, list_timeout: float = 15.0) -> None:
        from kubernetes import client

        self._api_client = api_client
        # Typed as Any: with _preload_content=False the client returns raw urllib3 responses,
        # which its own annotations (written for the deserialised models) do not describe.
        self._core: Any = client.CoreV1Api(api_client)
        self._list_timeout = list_timeout
        self._response: Any = None
        self._lock = threading.Lock()

    def list(self) -> tuple[list[Any], str]:
        resp = self._call(
            self._core.list_namespace, _preload_content=False, _request_timeout=self._list_timeout
        )
        doc = orjson.loads(resp.data)
        items = doc.get("items") if isinstance(doc, dict) else None
        version = _resource_version(doc) if isinstance(doc, dict) else None
        if not isinstance(items, list) or version is None:
            raise ValueError("namespace list without items or metadata.resourceVersion")
        return items, version

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        resp = self._call(
            self._core.list_namespace,
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_seconds,
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

    def get(self, name: str, timeout: float) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self._core.read_namespace(name, _preload_content=False, _request_timeout=timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        doc = orjson.loads(resp.data)
        return doc if isinstance(doc, dict) else None

    def close(self) -> None:
        """Abort a running watch (called from another thread at shutdown)."""
        with self._lock:
            resp = self._response
        if resp is not None:
            # Closing a socket under a reader may raise anything; we are stopping anyway.
            with contextlib.suppress(Exception):
                resp.shutdown() if hasattr(resp, "shutdown") else resp.close()

    def _call(self, method: Callable[..., Any], **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return method(**kwargs)
        except ApiException as exc:
            if exc.status == 410:
                raise ApiGone(str(exc.reason)) from None
            raise


def kubernetes_api(kubeconfig: str | None) -> KubernetesNamespaceApi:
    """The API from a kubeconfig file, or in-cluster when ``kubeconfig`` is None."""
    from kubernetes import client

    configuration = client_configuration(kubeconfig)
    # The client retries failed requests 3 times by default; our loop does its own backoff.
    configuration.retries = False
    return KubernetesNamespaceApi(client.ApiClient(configuration))


class NamespaceCache:
    """List + watch of Namespaces; ``facts()`` answers from memory, GETs on a miss."""

    mode = "watch"

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
        self._api = api
        self._metrics = metrics
        self._lookup_timeout = lookup_timeout
        self._watch_timeout = watch_timeout
        self._backoff = backoff
        self._clock = clock
        self._facts: dict[str, NamespaceFacts] = {}
        self._resource_version = ""
        self._synced = threading.Event()
        self._stopping = threading.Event()
        self._last_heard: float | None = None
        self._last_error: str | None = None
        self._thread: threading.Thread | None = None
        self._inflight: dict[str, asyncio.Future[NamespaceFacts]] = {}
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="ns-get")
        if metrics is not None:
            metrics.namespace_cache_gauges(lambda: float(len(self._facts)), self.staleness_seconds)

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="namespace-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._api.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    # ---------------------------------------------------------------- readers (event loop)

    def ready(self) -> bool:
        return self._synced.is_set()

    def staleness_seconds(self) -> float:
        heard = self._last_heard
        return 0.0 if heard is None else max(0.0, self._clock() - heard)

    def status(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "ready": self.ready(),
            "synced": self._synced.is_set(),
            "size": len(self._facts),
            "stalenessSeconds": round(self.staleness_seconds(), 3),
            "lastError": self._last_error,
        }

    def cached(self, name: str) -> NamespaceFacts | None:
        """What the cache holds for ``name`` (not counted in metrics)."""
        return self._facts.get(name)

    def cached_facts(self, name: str) -> NamespaceFacts | None:
        return self._facts.get(name)

    def count_hit(self) -> None:
        self._count("hit")

    async def facts(self, name: str) -> NamespaceFacts:
        found = self._facts.get(name)
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
            obj = self._api.get(name, self._lookup_timeout)
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
        self._facts.setdefault(name, facts)
        return facts

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.namespace_lookups.labels(result).inc()

    # ---------------------------------------------------------------- list + watch (thread)

    def _run(self) -> None:
        # As client-go's reflector does: list once, then keep watching from the last
        # resourceVersion. A transient error (a dropped keep-alive connection, an apiserver
        # restart) resumes the watch after a backoff; only 410 Gone — the history we would resume
        # from is compacted — or having no version yet costs a full re-list.
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
                log.info("namespace watch expired (410 Gone); re-listing")
                need_list = True
            except Exception as exc:
                if self._stopping.is_set():
                    break
                self._last_error = one_line(exc)
                if self._metrics is not None:
                    self._metrics.namespace_watch_errors.inc()
                wait = delay * random.uniform(0.8, 1.2)
                log.warning(
                    "namespace list/watch failed; retrying",
                    extra={"fields": {"error": self._last_error, "retryInSeconds": round(wait, 2)}},
                )
                self._stopping.wait(wait)
                delay = min(delay * 2, self._backoff[1])
                need_list = need_list or not self._resource_version

    def _relist(self) -> None:
        items, version = self._api.list()
        fresh: dict[str, NamespaceFacts] = {}
        for item in items:
            facts = namespace_facts(item)
            if facts is not None:
                fresh[facts.name] = facts
        self._facts = fresh
        self._resource_version = version
        self._heard()
        if self._metrics is not None:
            self._metrics.namespace_relists.inc()
        if not self._synced.is_set():
            log.info("namespace cache synced", extra={"fields": {"namespaces": len(fresh)}})
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
            if kind in ("ADDED", "MODIFIED"):
                facts = namespace_facts(obj)
                if facts is not None:
                    self._facts[facts.name] = facts
            elif kind == "DELETED":
                facts = namespace_facts(obj)
                if facts is not None:
                    self._facts.pop(facts.name, None)
            if version is not None:
                self._resource_version = version
            self._heard()
        # The server ended the watch (timeoutSeconds): a healthy, quiet cluster.
        self._heard()

    def _heard(self) -> None:
        self._last_heard = self._clock()
        self._last_error = None

