"""The burst's pod watch (``pod_watch.py``): how late it saw each pod Running against the pod's own
start time, which tells a startup tail of the cluster from one of the bench's watch."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from tests.k8s.pod_watch import PodWatch


def _pod(name: str, phase: str, started: float | None) -> dict[str, object]:
    status: dict[str, object] = {"phase": phase}
    if started is not None:
        stamp = datetime.fromtimestamp(started, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status["startTime"] = stamp
    return {"metadata": {"namespace": "ns", "name": name}, "spec": {"nodeName": "n"}, "status": status}


def test_a_pod_seen_running_long_after_it_started_counts_as_seen_late_once() -> None:
    watch = PodWatch(api=None)  # type: ignore[arg-type]  # no stream is started here
    now = time.time()
    watch._seen(_pod("prompt", "Running", now), time.monotonic())
    watch._seen(_pod("prompt-too", "Running", now - 0.5), time.monotonic())
    watch._seen(_pod("late", "Pending", None), time.monotonic())
    watch._seen(_pod("late", "Running", now - 30), time.monotonic())
    watch._seen(_pod("late", "Running", now - 60), time.monotonic())  # a later event: not counted again
    figures = watch.figures({"ns/prompt", "ns/prompt-too", "ns/late", "ns/never"})

    assert set(watch.running) == {"ns/prompt", "ns/prompt-too", "ns/late"}
    assert set(watch.bound) == {"ns/prompt", "ns/prompt-too", "ns/late"}
    assert figures["running_seen_late_p50_s"] is not None and figures["running_seen_late_p50_s"] < 2
    assert 29 <= figures["running_seen_late_max_s"] < 32, figures
    assert figures["running_seen_late_p99_s"] == figures["running_seen_late_max_s"]
    assert figures["watch_restarts"] == 0 and figures["watch_relists"] == 0
