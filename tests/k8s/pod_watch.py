"""When each pod of a burst was first bound and first Running, from a watch of all pods."""

from __future__ import annotations

import json
import threading
import time
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
        if (obj.get("status") or {}).get("phase") == "Running":
            self.running.setdefault(key, now)

    def _relist(self) -> str:
        """Every pod as it is now (the first time, and after a watch too old to resume, 410, as
        after an apiserver restart): what changed in the gap is seen at the list, late rather than
        never, as an informer's re-list does. Returns the list's resourceVersion."""
        token, version = "", ""
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

    def stop(self) -> None:
        self._stop.set()
        if self._stream is not None:
            self._stream.close()
