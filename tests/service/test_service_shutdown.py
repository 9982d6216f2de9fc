"""SIGTERM drains the webhook before it stops (``--shutdown-delay``, :mod:`ix_gpu.webhook.service.draining`),
over real HTTPS against the real ``ix-gpu webhook`` process.

What the apiserver sees of a replica being stopped: for the delay, reviews are still answered (on
connections it already holds and on new ones), each answer closes its connection, and ``/readyz``
fails so the replica leaves the endpoints; then the listener closes, a review whose body was still
arriving is answered, and the process exits 0.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import orjson

from tests.support.https_client import KeepAlive, connect_tls, host_port, read_response, request_head
from tests.support.objects import pod, review
from tests.support.waiting import wait_until
from tests.support.webhook_process import WebhookProcess

DELAY_S = 3.0
BODY = orjson.dumps(review(pod(), uid="drain"))
DRAINING = "SIGTERM: draining"
DRAIN_OVER = "drain over"


def _logged(webhook: WebhookProcess, prefix: str) -> bool:
    return any(str(entry.get("msg", "")).startswith(prefix) for entry in webhook.logs())


def _mutated(answer_body: bytes) -> bool:
    response = orjson.loads(answer_body)["response"]
    return response["uid"] == "drain" and response["allowed"] is True and "patch" in response


def _refuses_connections(url: str) -> bool:
    try:
        socket.create_connection(host_port(url), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def _exit_status(webhook: WebhookProcess, timeout: float) -> int:
    assert webhook.process is not None
    return webhook.process.popen.wait(timeout)


def test_sigterm_drains_then_finishes_in_flight_and_exits_0(tmp_path: Path, cert_dir: Path) -> None:
    ca = cert_dir / "ca.crt"
    with WebhookProcess(tmp_path, cert_dir, extra=["--shutdown-delay", str(DELAY_S)]).start() as webhook:
        assert webhook.process is not None
        held = KeepAlive(webhook.url, ca)  # the apiserver's keep-alive connection
        first = held.post(BODY)
        assert first.status == 200 and not first.closed and _mutated(first.body)
        assert held.get("/readyz").status == 200
        # A review whose body is still on its way when the listener closes.
        uploading = connect_tls(webhook.url, ca)
        uploading.sendall(request_head(length=len(BODY)) + BODY[:100])

        os.kill(webhook.process.pid, signal.SIGTERM)
        signalled = time.monotonic()
        wait_until(lambda: _logged(webhook, DRAINING), "the drain to start", 10, process=webhook.process)

        # Still serving, on the held connection and on a new one; each answer closes its connection.
        during = held.post(BODY)
        assert during.status == 200 and during.closed and _mutated(during.body), during
        fresh = KeepAlive(webhook.url, ca)
        answer = fresh.post(BODY)
        assert answer.status == 200 and answer.closed and _mutated(answer.body), answer
        readyz = fresh.get("/readyz")
        assert readyz.status == 503, readyz
        assert orjson.loads(readyz.body)["draining"] is True
        assert fresh.get("/healthz").status == 200  # alive: the kubelet must not restart it

        wait_until(
            lambda: _logged(webhook, DRAIN_OVER), "the drain to end", DELAY_S + 10, process=webhook.process
        )
        assert time.monotonic() - signalled >= DELAY_S - 0.2  # (the log line comes after the signal)
        wait_until(lambda: _refuses_connections(webhook.url), "the listener to close", 5)
        # The listener is closed, but the review in flight is answered.
        uploading.sendall(BODY[100:])
        late = read_response(uploading)
        assert late.status == 200 and _mutated(late.body), late
        uploading.close()
        held.close()
        fresh.close()

        assert _exit_status(webhook, 20) == 0, webhook.log_tail()


def test_second_sigterm_stops_at_once(tmp_path: Path, cert_dir: Path) -> None:
    """An operator who wants it gone (``kubectl delete --grace-period``, a second Ctrl-C of a
    supervisor) does not wait for the drain."""
    with WebhookProcess(tmp_path, cert_dir, extra=["--shutdown-delay", "60"]).start() as webhook:
        assert webhook.process is not None
        os.kill(webhook.process.pid, signal.SIGTERM)
        wait_until(lambda: _logged(webhook, DRAINING), "the drain to start", 10, process=webhook.process)
        assert webhook.alive()
        os.kill(webhook.process.pid, signal.SIGTERM)
        assert _exit_status(webhook, 15) == 0, webhook.log_tail()
        assert not _logged(webhook, DRAIN_OVER)


def test_no_delay_stops_at_once_and_exits_0(tmp_path: Path, cert_dir: Path) -> None:
    with WebhookProcess(tmp_path, cert_dir, extra=["--shutdown-delay", "0"]).start() as webhook:
        assert webhook.process is not None
        os.kill(webhook.process.pid, signal.SIGTERM)
        assert _exit_status(webhook, 15) == 0, webhook.log_tail()
        assert not _logged(webhook, DRAINING)
