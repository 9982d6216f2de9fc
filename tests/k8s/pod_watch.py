"""When each pod of a burst was first bound and first Running, from a watch of all pods; and how
late the watch saw it, against the time the pod's status says it started."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from typing import Any

from ix_gpu.kube.apiserver import ApiServer
from ix_gpu.kube.list_watch import WatchStream


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class PodWatch:
    """Every pod's first bound and first Running moment, from a watch of all pods (as the SLO's
    watch-based measurement does)."""

    def __init__(self, api: ApiServer) -> None:
        self.api = api
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        # Seconds from the pod's status.startTime (set by whatever ran it, 1 s resolution) to the
        # moment this watch saw it Running: a startup tail the watch's own lag would make.
        self.seen_late: dict[str, float] = {}
        self.streams = 0
        self.lists = 0
        self._stop = threading.Event()
        self._stream: WatchStream | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PodWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    version = self._relist()
                path = f"/api/v1/pods?watch=1&allowWatchBookmarks=true&resourceVersion={version}"
                self._stream = WatchStream(self.api, path, "application/json", 10, 600)
                self.streams += 1
                for line in self._stream.lines():
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    meta = obj.get("metadata") or {}
                    if event.get("type") == "ERROR":
                        version = ""
                        break
                    version = meta.get("resourceVersion") or version
                    self._seen(obj, time.monotonic())
            except Exception:
                if not self._stop.is_set():
                    time.sleep(0.5)  # an apiserver restart: watch again from where it was

    def _seen(self, obj: dict[str, Any], now: float) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if (obj.get("spec") or {}).get("nodeName"):
            self.bound.setdefault(key, now)
        status = obj.get("status") or {}
        if status.get("phase") == "Running" and key not in self.running:
            self.running[key] = now
            started = status.get("startTime")
            if started:
                self.seen_late[key] = time.time() - datetime.fromisoformat(started).timestamp()

    def _relist(self) -> str:
        """Every pod as it is now (the first time, and after a watch too old to resume, 410, as
        after an apiserver restart): what changed in the gap is seen at the list, late rather than
        never, as an informer's re-list does. Returns the list's resourceVersion."""
        token, version = "", ""
        self.lists += 1
        while True:
            query = "?limit=500" + (f"&continue={token}" if token else "")
            listed = self.api.request("GET", f"/api/v1/pods{query}")
            version = version or listed["metadata"]["resourceVersion"]
            now = time.monotonic()
            for pod in listed.get("items") or []:
                self._seen(pod, now)
            token = listed["metadata"].get("continue") or ""
            if not token:
                return version

    def figures(self, keys: set[str]) -> dict[str, Any]:
        """How the watch went, for ``keys`` (the burst's pods): its streams and lists after the
        first (timeouts, a 410, a broken connection) and how late it saw pods Running, p50/p99/max
        in seconds (the start time has 1 s resolution: up to about 1 s is no lag at all)."""
        late = [self.seen_late[k] for k in keys if k in self.seen_late]

        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 1)

        return {
            "watch_restarts": max(self.streams - 1, 0),
            "watch_relists": max(self.lists - 1, 0),
            "running_seen_late_p50_s": rounded(quantile(late, 0.5)),
            "running_seen_late_p99_s": rounded(quantile(late, 0.99)),
            "running_seen_late_max_s": rounded(max(late, default=None)),
        }

    def stop(self) -> None:
        self._stop.set()
        if self._stream is not None:
            self._stream.close()
