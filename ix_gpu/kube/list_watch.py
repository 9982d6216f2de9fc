"""List + watch of one API resource over :class:`~ix_gpu.kube.apiserver.ApiServer` (the cache that
keeps it is :mod:`ix_gpu.kube.watched_cache`).

Why here and with the standard library: the webhook's namespace and claim caches and the node
agents' own-Node watches are one idea, and the official ``kubernetes`` client, which the webhook
used for it, cost the webhook process 36 MiB of its 101 MiB at rest: as much as 70,000 cached
namespaces. A list is read a page at a time (``limit``/``continue``) and each page cut down to what
the cache keeps before the next is read; a watch is one long GET whose newline-delimited events are
read as they come, on its own connection, which :meth:`ApiListWatch.close` shuts from another thread.

The watch connection goes straight to the API server; an ``HTTPS_PROXY`` applies only to lists
and single reads (:meth:`ApiServer.request`), as in-cluster clients are not proxied in practice.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import urllib.error
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, urlsplit

from ix_gpu.kube.apiserver import ApiError, ApiServer

if TYPE_CHECKING:
    import http.client

PAGE_SIZE = 500
"""Objects per list request. A list is read a page at a time and each page is cut down to what the
cache keeps before the next is read, so the memory a (re-)list needs grows with the page, not
with the cluster: parsed whole, 50,000 namespaces with their managedFields and annotations took
the webhook to 356 MiB after a start, peak 680 MiB, past the chart's 256 MiB limit; in pages, 127
MiB (``bench/namespace_scale.py``, docs/benchmarks.md)."""

MAX_PAGE_BYTES = 256 << 20
"""The largest list page read: 500 objects at the apiserver's 1.5 MB object limit would be 750 MB,
which no webhook should buffer; a cluster that has such objects needs a smaller ``page_size``."""

MAX_EVENT_BYTES = 16 << 20
"""The longest watch event line: an object is at most 1.5 MiB in etcd, 3 MiB in a request."""

PARTIAL_METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
PARTIAL_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
"""What to ask for when only an object's metadata is read: the apiserver leaves out spec and status
(falling back to the whole object where it cannot)."""


class ApiGone(Exception):
    """410 Gone: the resourceVersion is too old to watch from; re-list."""


class ListWatchApi(Protocol):
    def list(self) -> tuple[list[Any], str]: ...

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]: ...

    def close(self) -> None: ...


def resource_version(obj: Any) -> str | None:
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    value = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
    return value if isinstance(value, str) and value else None


OPENED: dict[str, Any] = {"type": "OPENED"}
"""The first event of every watch (:meth:`ApiListWatch.watch`)."""


def _gone(exc: urllib.error.HTTPError) -> Exception:
    return ApiGone(str(exc.reason)) if exc.code == 410 else exc


class ApiListWatch:
    """List and watch of the collection at ``path`` (``/api/v1/namespaces``,
    ``/apis/resource.k8s.io/v1/resourceclaims``) as plain JSON.

    ``slim`` cuts each listed object down to what the cache keeps, as its page is parsed (the
    default keeps it whole). ``metadata_only`` asks the apiserver for metadata alone
    (``PartialObjectMetadata``), for caches that read nothing else. ``field_selector``
    (``metadata.name=node-1``) narrows both to what one node agent needs."""

    def __init__(
        self,
        api: ApiServer,
        path: str,
        what: str,
        *,
        list_timeout: float = 15.0,
        page_size: int = PAGE_SIZE,
        slim: Callable[[Any], Any] | None = None,
        metadata_only: bool = False,
        field_selector: str | None = None,
        parse: Callable[[bytes], Any] = json.loads,
    ) -> None:
        self.api = api
        self.path = path
        self.what = what
        self._list_timeout = list_timeout
        self._page_size = page_size
        self._slim = slim
        self._list_accept = PARTIAL_METADATA_LIST if metadata_only else "application/json"
        self._watch_accept = PARTIAL_METADATA if metadata_only else "application/json"
        self._selector = "" if field_selector is None else f"&fieldSelector={quote(field_selector, safe='')}"
        self._parse = parse
        self._stream: WatchStream | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.pages = 0
        """List requests made (a page each), for tests and the status."""
        self.watches = 0
        """Watch requests made."""

    def list(self) -> tuple[list[Any], str]:
        """Every object, a page at a time, with the resourceVersion of the first page: the
        apiserver serves the pages of one list from one snapshot, so watching from that version
        misses nothing. A continue token that expired mid-list is a 410 (:class:`ApiGone`), and
        the caller lists again from the start."""
        items: list[Any] = []
        version: str | None = None
        token = ""
        while True:
            query = f"?limit={self._page_size}{self._selector}"
            if token:
                query += f"&continue={quote(token, safe='')}"
            try:
                doc = self.api.request(
                    "GET",
                    self.path + query,
                    accept=self._list_accept,
                    timeout=self._list_timeout,
                    max_bytes=MAX_PAGE_BYTES,
                    parse=self._parse,
                )
            except urllib.error.HTTPError as exc:
                raise _gone(exc) from None
            self.pages += 1
            page = doc.get("items") if isinstance(doc, dict) else None
            metadata = doc.get("metadata") if isinstance(doc, dict) else None
            if not isinstance(page, list) or not isinstance(metadata, dict):
                raise ApiError(f"{self.what} list without items or metadata")
            if version is None:
                version = resource_version(doc)
                if version is None:
                    raise ApiError(f"{self.what} list without metadata.resourceVersion")
            items.extend(page if self._slim is None else map(self._slim, page))
            del doc, page  # this page's parse is garbage before the next one is read
            token = metadata.get("continue") or ""
            if not isinstance(token, str) or not token:
                return items, version

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        """The events after ``resource_version`` until the server ends the watch after
        ``timeout_seconds`` (bookmarks included: they move the version on in a quiet cluster),
        after one ``{"type": "OPENED"}`` of our own once the server accepted the watch: the
        apiserver answers again, even where nothing changes for minutes."""
        query = (
            f"?watch=1&allowWatchBookmarks=true&timeoutSeconds={timeout_seconds}"
            f"&resourceVersion={quote(resource_version, safe='')}{self._selector}"
        )
        with self._lock:
            if self._closed:
                raise ApiError(f"{self.what} watch: closed")
        try:
            # Connect fast; the read may legitimately idle until the server ends the watch.
            stream = WatchStream(
                self.api, self.path + query, self._watch_accept, self._list_timeout, timeout_seconds + 30
            )
        except urllib.error.HTTPError as exc:
            raise _gone(exc) from None
        self.watches += 1
        with self._lock:
            self._stream = stream
            closed = self._closed
        try:
            if closed:
                return
            yield OPENED
            for line in stream.lines():
                event = self._parse(line)
                if isinstance(event, dict):
                    yield event
        finally:
            with self._lock:
                self._stream = None
            stream.close()

    def close(self) -> None:
        """Stop: a running watch is shut (from another thread, at shutdown), no new one opens."""
        with self._lock:
            self._closed = True
            stream = self._stream
        if stream is not None:
            stream.close()


class WatchStream:
    """One open ``?watch=1`` GET: its newline-delimited events as they arrive. An HTTP error
    status raises ``urllib.error.HTTPError`` as :meth:`ApiServer.request` does.

    ``http.client`` is imported here, when a watch opens, not with the module: it imports ``ssl``
    (libcrypto, 4 MiB of RSS), which a device plugin without cluster access, whose node config
    and allocation gate import this module, never needs (:mod:`ix_gpu.process.openssl_free`)."""

    def __init__(
        self, api: ApiServer, path: str, accept: str, connect_timeout: float, read_timeout: float
    ) -> None:
        import http.client

        url = urlsplit(api.base_url)
        host, port = url.hostname or "", url.port
        self._connection: http.client.HTTPConnection = (
            http.client.HTTPSConnection(host, port, timeout=connect_timeout, context=api.ssl_context())
            if url.scheme == "https"
            else http.client.HTTPConnection(host, port, timeout=connect_timeout)
        )
        self._sock: socket.socket | None = None
        try:
            self._connection.request("GET", url.path.rstrip("/") + path, headers=api.headers(accept))
            # Kept here: for an answer that ends with the connection, http.client hands the socket
            # to the response and forgets it, and close() must still be able to shut it.
            self._sock = self._connection.sock
            self._response = self._connection.getresponse()
            if self._response.status != 200:
                body = self._response.read(64 << 10)
                message = body.decode("utf-8", "replace").strip()[:300] or self._response.reason
                raise urllib.error.HTTPError(
                    api.base_url + path, self._response.status, message, self._response.headers, None
                )
            if self._sock is not None:
                self._sock.settimeout(read_timeout)
        except http.client.HTTPException as exc:
            self._connection.close()
            raise ApiError(f"watch {path}: {type(exc).__name__}: {exc!r}"[:500]) from exc
        except BaseException:
            self._connection.close()
            raise

    def lines(self) -> Iterator[bytes]:
        import http.client

        while True:
            try:
                line = self._response.readline(MAX_EVENT_BYTES + 1)
            except http.client.HTTPException as exc:  # IncompleteRead of a chunk: the server went away
                raise ApiError(f"watch broke off: {type(exc).__name__}") from exc
            except ValueError:  # read from a response closed under us: we are stopping
                return
            if not line:
                return
            if len(line) > MAX_EVENT_BYTES:
                raise ApiError(f"watch event longer than {MAX_EVENT_BYTES} bytes")
            if line.strip():
                yield line

    def close(self) -> None:
        """Safe from any thread, also while :meth:`lines` is blocked reading: the socket is shut
        first, which wakes the reader."""
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self._connection.close()
