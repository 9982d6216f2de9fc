"""The webhook's namespace cache against an API server whose every watch is answered HTTP 200 and
ends at once with no event (lists as usual): a broken proxy or a misbehaving apiserver.

Each such end used to count as heard and the next watch opened at once: the cache made 415,825
watches in 2 s and its replica stayed ready. The loop's own schedule is tested in
``tests/kube/test_watched_cache.py``; this is the same case end to end, through ``/readyz``.
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from pathlib import Path

from tests.service.conftest import FAST
from tests.service.fake_apiserver import NAMESPACES, FakeApiServer
from tests.support.waiting import wait_until
from tests.support.webhook_process import WebhookProcess


class EndingWatches(FakeApiServer):
    """Answers every watch HTTP 200 and ends it at once with no event; lists as before."""

    def _watch(
        self, handler: BaseHTTPRequestHandler, since: int, timeout: float, path: str = NAMESPACES
    ) -> None:
        with self._cond:
            key = "watch" if path == NAMESPACES else f"watch {path}"
            self.calls[key] = self.calls.get(key, 0) + 1
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(b"0\r\n\r\n")  # the chunked stream's end, with no event before it


def test_the_webhook_is_not_ready_once_its_bound_passes_with_watches_that_end_at_once(
    tmp_path: Path, cert_dir: Path
) -> None:
    """Each end is now a failure that backs off (0.5 s doubling) and is not heard, so past
    ``--cache-max-staleness 1`` /readyz turns 503 naming the stale cache after a handful of
    watches (the old loop: thousands, and never 503); the re-list that the first attempt past
    half the bound makes is heard, and the replica is ready again."""
    api = EndingWatches()
    api.put("team-a")
    api.start()
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    extra = [*FAST, "--cache-max-staleness", "1"]
    webhook = WebhookProcess(tmp_path, cert_dir, kubeconfig=kubeconfig, extra=extra).start()
    try:
        with webhook.client() as client:
            wait_until(lambda: client.get("/readyz").status_code == 200, "synced", 10, interval=0.02)
            wait_until(
                lambda: client.get("/readyz").status_code == 503,
                "not ready: stale",
                10,
                interval=0.05,
                details=lambda: f"{api.count('watch')} watches",
            )
            stale = client.get("/readyz").json()["namespaces"]
            assert stale["stale"] is True and stale["synced"] is True, stale
            assert "ended before its timeoutSeconds" in (stale["lastError"] or ""), stale
            assert stale["stalenessSeconds"] > 1, stale
            assert api.count("watch") <= 6, api.count("watch")
            wait_until(lambda: client.get("/readyz").status_code == 200, "re-listed", 10, interval=0.05)
            assert api.count("list") >= 2, api.count("list")
    finally:
        webhook.stop()
        api.stop()
