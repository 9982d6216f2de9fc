"""The cache a list + watch keeps (as client-go's reflector and informer store): one daemon thread
lists, then watches from the last resourceVersion, backs off on every failure, and says how stale
it is. The HTTP side (pages, watch streams) is :mod:`ix_gpu.kube.list_watch`."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from ix_gpu.config.text import one_line
from ix_gpu.kube.list_watch import ApiGone, ListWatchApi, resource_version

HELD_AFTER_S = 60.0
"""A watch open this long before it failed held: the next failure's backoff starts afresh
(client-go's reflector resets after two minutes without a failure)."""


class WatchEndedEarly(Exception):
    """A watch the server accepted ended before its ``timeoutSeconds`` with nothing on it."""


class WatchedCache:
    """A list + watch of one resource kept in a dict; subclasses say what each object becomes.

    As client-go's reflector: list once, then keep watching from the last resourceVersion, in one
    daemon thread. Readers (on an event loop, in a forked child, in a gRPC handler) only do
    ``dict.get``, atomic under the GIL, and touch no lock. A re-list builds a new dict and swaps it
    in whole, so a reader never sees a half-built one.
    """

    what = "object"
    """What the log lines call the cached objects."""

    log = logging.getLogger("ix_gpu.watch")

    def __init__(
        self,
        api: ListWatchApi,
        *,
        watch_timeout: int = 300,
        backoff: tuple[float, float] = (0.5, 30.0),
        clock: Callable[[], float] = time.monotonic,
        max_staleness: float | None = None,
        held_after: float = HELD_AFTER_S,
    ) -> None:
        self._api = api
        self._watch_timeout = watch_timeout
        self._backoff = backoff
        self._clock = clock
        self._max_staleness = max_staleness
        self._held_after = held_after
        self._opened_at: float | None = None
        """When the running watch opened (None: none is open), so that a failure after a watch
        that held for ``held_after`` seconds starts its backoff afresh."""
        self._items: dict[Any, Any] = {}
        self._resource_version = ""
        self._synced = threading.Event()
        self._stopping = threading.Event()
        self._last_heard: float | None = None
        self._last_error: str | None = None
        self._failing_since: float | None = None
        self._logged_error: str | None = None
        """The failure last logged; forgotten once a list or an event arrives (a watch that opens
        and then breaks, again and again, is one failure)."""
        self._thread: threading.Thread | None = None

    def _entry(self, obj: Any) -> tuple[Any, Any] | None:
        """(key, value) that ``obj`` is kept as; None to leave it out."""
        raise NotImplementedError

    def _relisted(self) -> None:
        """Called after each full list (for metrics)."""

    def _watch_failed(self) -> None:
        """Called after each failed list or watch (for metrics)."""

    def _changed(self) -> None:
        """Called after each list and each event that changed the items (for followers)."""

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the list + watch thread (once: later calls do nothing)."""
        if self._thread is not None:
            return
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
        """Synced, and (with ``max_staleness``) heard from within that bound: a cache whose watch
        went silent or keeps failing answers from an ever older picture, and says so by turning
        not-ready instead of serving it forever."""
        if not self._synced.is_set():
            return False
        return self._max_staleness is None or self.staleness_seconds() <= self._max_staleness

    def stale(self) -> bool:
        """Synced once, but not heard from within ``max_staleness``."""
        return self._synced.is_set() and not self.ready()

    def staleness_seconds(self) -> float:
        heard = self._last_heard
        return 0.0 if heard is None else max(0.0, self._clock() - heard)

    def last_error(self) -> str | None:
        return self._last_error

    def problem(self) -> str | None:
        """``cannot watch <what> for Ns: <error>`` while the list or watch fails (the items are
        then the last ones heard)."""
        error, since = self._last_error, self._failing_since
        if error is None:
            return None
        return f"cannot watch {self.what} for {self._clock() - (since or self._clock()):.0f}s: {error}"

    def status(self) -> dict[str, Any]:
        return {
            "mode": "watch",
            "ready": self.ready(),
            "synced": self._synced.is_set(),
            "size": len(self._items),
            "stalenessSeconds": round(self.staleness_seconds(), 3),
            "maxStalenessSeconds": self._max_staleness,
            "stale": self.stale(),
            "lastError": self._last_error,
        }

    # ---------------------------------------------------------------- list + watch (thread)

    def _run(self) -> None:
        # A transient error (a dropped keep-alive connection, an apiserver restart) resumes the
        # watch after a backoff; only 410 Gone — the history we would resume from is compacted —
        # or having no version yet costs a full re-list. Every failure waits, 410 included: an
        # apiserver (or a proxy) that answers every list with 410 would otherwise be re-listed
        # as fast as it answers. The backoff starts afresh after a watch that held.
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
                continue
            except ApiGone:
                self.log.info(f"{self.what} watch expired (410 Gone); re-listing")
                need_list = True
            except Exception as exc:
                if self._stopping.is_set():
                    break
                self._failed(exc)
                # Resuming the watch would leave the cache stale until the next bookmark (a
                # minute); past half its bound a re-list makes it fresh at once when the server is back.
                need_list = need_list or not self._resource_version or self._half_stale()
            if self._watch_held():
                delay = self._backoff[0]
            self._opened_at = None
            self._stopping.wait(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, self._backoff[1])

    def _half_stale(self) -> bool:
        bound = self._max_staleness
        return bound is not None and self.staleness_seconds() > bound / 2

    def _watch_held(self) -> bool:
        opened = self._opened_at
        return opened is not None and self._clock() - opened >= self._held_after

    def _failed(self, exc: Exception) -> None:
        error = one_line(exc)
        self._last_error = error
        if self._failing_since is None:
            self._failing_since = self._clock()
        self._watch_failed()
        if error != self._logged_error:  # once per distinct error, not once per retry
            self._logged_error = error
            self.log.warning(
                f"{self.what} list/watch failed; retrying (keeping what it last heard): {error}",
                extra={"fields": {"error": error}},
            )

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
            self.log.info(f"{self.what} cache synced", extra={"fields": {"count": len(fresh)}})
        self._synced.set()
        self._changed()

    def _watch_once(self) -> None:
        # Between the timeout and twice it, as client-go's reflector: agents started (or reconnected
        # after an apiserver restart) together must not renew their watches in step ever after.
        timeout = int(self._watch_timeout * random.uniform(1.0, 2.0))
        # Timed from before the request: the server counts its timeout from when it got it, so a
        # watch that the server itself ended is never younger than ``timeout`` here.
        started, opened, delivered = self._clock(), False, False
        for event in self._api.watch(self._resource_version, timeout):
            if self._stopping.is_set():
                return
            kind, obj = event.get("type"), event.get("object")
            if kind == "ERROR":
                code = obj.get("code") if isinstance(obj, dict) else None
                if code == 410:
                    raise ApiGone("watch event: 410 Gone")
                message = obj.get("message") if isinstance(obj, dict) else None
                raise RuntimeError(f"watch error event: {code} {message}")
            if kind == "OPENED":
                self._opened_at = self._clock()
                opened = True
                self._heard(opened=True)
                continue
            delivered = True
            version = resource_version(obj)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                entry = self._entry(obj)
                if entry is not None and kind == "DELETED":
                    self._items.pop(entry[0], None)
                elif entry is not None:
                    self._items[entry[0]] = entry[1]
                if entry is not None:
                    self._changed()
            if version is not None:
                self._resource_version = version
            self._heard()
        if self._stopping.is_set():
            return
        if opened and not delivered and self._clock() - started < timeout:
            # Accepted (HTTP 200), then ended empty before the server's own end: a proxy or an
            # apiserver cutting every watch short. Re-watching at once made 415,825 watches in 2 s,
            # and counting the end as heard kept a cache that learned nothing ready. A failure:
            # it waits its backoff (afresh only if the watch held) and is not heard. Only an
            # opened watch: an API that answers without asking the server (a resource not served,
            # asked again later) has nothing to cut short. One message for every such end, so
            # the failure is logged once, not once per watch.
            raise WatchEndedEarly("watch ended before its timeoutSeconds with no event")
        # The server ended the watch (timeoutSeconds): a healthy, quiet cluster.
        self._heard()

    def _heard(self, *, opened: bool = False) -> None:
        # An opened watch proves the connection, not that anything arrives on it: only a list, an
        # event (bookmarks included: the apiserver sends one a minute) or the server's own end of
        # the watch (at its timeoutSeconds; an empty end before it is WatchEndedEarly) count as
        # heard, so a watch that stays silent, or is cut short again and again, grows stale.
        if not opened:
            self._last_heard = self._clock()
            self._logged_error = None
        if self._last_error is not None:
            failed_for = self._clock() - (self._failing_since or self._clock())
            self.log.info(f"{self.what} list/watch works again (it failed for {failed_for:.0f}s)")
        self._last_error = self._failing_since = None
