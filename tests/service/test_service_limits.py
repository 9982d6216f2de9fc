"""Each of the service's limits, over real HTTPS against the real ``ix-gpu webhook``.

One limit per test, each with a small setting so the test is quick: the connection cap; the header
timeout (an idle connection, slow headers, slow headers of a second keep-alive request); the header
size cap; the in-flight body bytes cap (declared and streamed bodies, and the bytes coming back when
clients go away); the request budget of large reviews (with /healthz probed meanwhile); a valid
review just under 3 MiB with default limits; and 300 simultaneous clients each sending ~3 MiB, after
which memory must have stayed under the chart's 256 MiB limit (the unbounded service took 1.1 GiB)
and come back. Raw TLS sockets (:mod:`tests.support.https_client`) send what an HTTP client would not.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from ix_gpu.webhook.service.limit_settings import Limits
from tests.support.adversarial import MAX_BODY, near_limit_body
from tests.support.https_client import (
    KeepAlive,
    closed_by_peer,
    connect_tls,
    drip,
    host_port,
    read_response,
    request_head,
)
from tests.support.monitors import HealthProber, MiB, RssSampler, rss_bytes
from tests.support.objects import pod, review
from tests.support.waiting import wait_until
from tests.support.webhook_process import WebhookProcess, ca_context

SMALL = orjson.dumps(review(pod()))
RSS_LIMIT = 256 * MiB
"""The chart's memory limit for the webhook container."""
HEALTHZ_LIMIT_S = 0.25
"""The slowest /healthz answer allowed while the load runs: a stalled event loop (a review parsed or
mutated on it instead of in the child) takes seconds, and the kubelet's probe gives up after 1 s.
Not tighter: with scripts/test.sh's Go builds beside these tests on 2 cores, a healthy loop
answered in up to 133 ms (74 ms on an idle machine)."""
RSS_RETURN_SLACK = 64 * MiB
"""After a burst, RSS must come back to within this of its level before (allocators keep some)."""


def _valid_review(size: int, uid: str = "limits") -> bytes:
    """A valid GPU pod review of exactly ``size`` bytes: thousands of env entries (the expensive
    kind of JSON to parse), then whitespace."""
    return near_limit_body("big-env", size, uid)


@contextlib.contextmanager
def _webhook(tmp_path: Path, cert_dir: Path, *extra: str) -> Iterator[WebhookProcess]:
    with WebhookProcess(tmp_path, cert_dir, extra=list(extra)).start() as webhook:
        yield webhook


def _ca(webhook: WebhookProcess) -> Path:
    return webhook.cert_dir / "ca.crt"


@contextlib.contextmanager
def _connection(tmp_path: Path, cert_dir: Path, *extra: str) -> Iterator[ssl.SSLSocket]:
    """One TLS connection to a webhook started with ``extra`` flags."""
    with _webhook(tmp_path, cert_dir, *extra) as webhook, connect_tls(webhook.url, _ca(webhook)) as conn:
        yield conn


def _answered(conn: ssl.SSLSocket) -> None:
    """One small review sent on ``conn`` and answered 200."""
    conn.sendall(request_head(length=len(SMALL)) + SMALL)
    assert read_response(conn).status == 200


def _refused(client: KeepAlive, reason: str) -> float:
    """``ix_gpu_connections_refused_total{reason}`` read over ``client``'s connection (a new one
    might itself be refused)."""
    answer = client.get("/metrics")
    assert answer.status == 200
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in answer.body.decode().splitlines()
        if line.startswith("ix_gpu_connections_refused_total{") and f'reason="{reason}"' in line
    )


# ------------------------------------------------------------------------------ connections


def test_connections_past_the_cap_are_closed_at_once(tmp_path: Path, cert_dir: Path) -> None:
    """``--max-connections 4``: with four connections open, three more are each closed right after
    the handshake and counted; the four keep being served; once they close, new ones are served."""
    cap, extra = 4, 3
    with _webhook(tmp_path, cert_dir, "--max-connections", str(cap)) as webhook:
        time.sleep(0.5)  # the start-up health checks' connections are gone
        held = [KeepAlive(webhook.url, _ca(webhook)) for _ in range(cap)]
        try:
            for client in held:
                assert client.get("/healthz").status == 200
            for _ in range(extra):
                started = time.monotonic()
                try:
                    sock = connect_tls(webhook.url, _ca(webhook), timeout=5)
                except (ssl.SSLError, ConnectionError):
                    continue  # closed while the handshake's last flight was on its way: also refused
                with sock:
                    assert closed_by_peer(sock, 2.0), "a connection past the cap stayed open"
                assert time.monotonic() - started < 2.0
            # At the cap, the connections that are in keep being answered.
            assert held[0].post(SMALL).status == 200
            assert _refused(held[1], "connections") == extra
        finally:
            for client in held:
                client.close()
        # Below the cap again: new connections are served.
        wait_until(lambda: webhook.get("/healthz", timeout=2)[0] == 200, "a new connection served", 10)


# ------------------------------------------------------------------------------ header timeout


HEADER_TIMEOUT = 1.0
SLACK = 1.0


def test_slow_or_missing_headers_are_a_408(tmp_path: Path, cert_dir: Path) -> None:
    """An idle connection, a request whose headers trickle in, and a keep-alive connection whose
    second request trickles in: each is answered 408 and closed within the header timeout (plus
    slack), while the webhook keeps answering everyone else."""
    with _webhook(tmp_path, cert_dir, "--header-timeout", str(HEADER_TIMEOUT)) as webhook:
        ca = _ca(webhook)
        other = KeepAlive(webhook.url, ca)
        trickle = b"X-Slow: " + b"a" * 200
        head = b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n"
        try:
            with connect_tls(webhook.url, ca) as idle, connect_tls(webhook.url, ca) as slow:
                started = time.monotonic()
                idle.settimeout(HEADER_TIMEOUT + SLACK)
                # Meanwhile, the webhook answers other clients promptly.
                answers = [other.post(SMALL) for _ in range(5)]
                assert all(a.status == 200 and a.seconds < 0.25 for a in answers), answers
                answer, seconds = drip(slow, head, trickle, every=0.1, limit=HEADER_TIMEOUT + SLACK)
                assert answer is not None and answer.status == 408, answer
                assert answer.closed and closed_by_peer(slow, 1.0)
                assert seconds < HEADER_TIMEOUT + SLACK
                idle_answer = read_response(idle)
                assert idle_answer.status == 408 and closed_by_peer(idle, 1.0)
                assert time.monotonic() - started < HEADER_TIMEOUT + SLACK

            # A second request on a kept-alive connection is timed from its own first byte.
            with connect_tls(webhook.url, ca) as keep_alive:
                keep_alive.sendall(request_head(length=len(SMALL)) + SMALL)
                assert read_response(keep_alive).status == 200
                time.sleep(HEADER_TIMEOUT + 0.2)  # idle between requests: the keep-alive timeout's job
                answer, seconds = drip(keep_alive, head, trickle, every=0.1, limit=HEADER_TIMEOUT + SLACK)
                assert answer is not None and answer.status == 408, answer
                assert HEADER_TIMEOUT - 0.3 < seconds < HEADER_TIMEOUT + SLACK, seconds
            assert _refused(other, "header_timeout") == 3
            assert other.post(SMALL).status == 200
        finally:
            other.close()


APISERVER_IDLE_S = 90.0
"""How long the apiserver keeps an idle connection to a webhook (Go's ``http.Transport`` default,
which client-go keeps): the webhook's default idle timeout must be longer."""


def test_an_idle_connection_is_kept_until_the_idle_timeout_then_closed(
    tmp_path: Path, cert_dir: Path
) -> None:
    """A keep-alive connection idle for less than ``--idle-timeout`` is still served (the apiserver
    reuses its connections); once idle longer the server closes it. The default outlasts the
    apiserver's own idle timeout, so that the apiserver ends its idle connections, not we."""
    assert Limits().idle_timeout > APISERVER_IDLE_S
    idle_timeout = 2.0
    with _connection(tmp_path, cert_dir, "--idle-timeout", str(idle_timeout)) as conn:
        _answered(conn)
        time.sleep(idle_timeout / 2)
        _answered(conn)
        idle_from = time.monotonic()
        assert closed_by_peer(conn, idle_timeout + SLACK)
        assert time.monotonic() - idle_from > idle_timeout - 0.3


def test_the_idle_timeout_never_closes_a_connection_with_a_request_on_its_way(
    tmp_path: Path, cert_dir: Path
) -> None:
    """The idle timeout counts from the last answer: a body that takes longer than it to arrive
    (well within the request timeout) is answered, and so is the next request, which comes more
    than an idle timeout after the connection's first answer."""
    idle_timeout = 1.0
    with _connection(tmp_path, cert_dir, "--idle-timeout", str(idle_timeout)) as conn:
        _answered(conn)
        conn.sendall(request_head(length=len(SMALL)) + SMALL[:10])
        time.sleep(idle_timeout * 2.5)
        conn.sendall(SMALL[10:])
        assert read_response(conn).status == 200
        time.sleep(idle_timeout * 0.6)
        _answered(conn)
        assert closed_by_peer(conn, idle_timeout + SLACK)


# ------------------------------------------------------------------------------ header size


def _pad_line(i: int) -> bytes:
    """Header line ``i`` of the padding: exactly 1 KiB."""
    return f"X-Pad-{i}: {'p' * (1014 - len(str(i)))}\r\n".encode()


def _padding(kib: int) -> bytes:
    """``kib`` header lines of 1 KiB each (to go between ``request_head(...)[:-2]``, the head
    without its blank line, and the blank line)."""
    return b"".join(_pad_line(i) for i in range(kib))


def test_headers_over_64_kib_are_a_431(tmp_path: Path, cert_dir: Path) -> None:
    """Headers just under 64 KiB are served; past it the request is answered 431 and the connection
    closed at once — whether the headers trickle in or arrive in one write (one read on the
    server), and whether or not they are ever finished."""
    head = b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n"
    with _webhook(tmp_path, cert_dir, "--header-timeout", "5") as webhook:
        ca = _ca(webhook)
        other = KeepAlive(webhook.url, ca)
        refused = 0
        try:
            with connect_tls(webhook.url, ca) as sock:  # just under the cap, complete: served
                sock.sendall(request_head(length=len(SMALL))[:-2] + _padding(60) + b"\r\n" + SMALL)
                assert read_response(sock).status == 200

            with connect_tls(webhook.url, ca) as sock:  # 80 KiB trickled in 1 KiB writes, unfinished
                started = time.monotonic()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError, ssl.SSLError):
                    sock.sendall(head)
                    for i in range(80):
                        sock.sendall(_pad_line(i))
                        time.sleep(0.002)
                answer = read_response(sock)
                assert answer.status == 431 and answer.closed, ("trickled", answer)
                assert closed_by_peer(sock, 1.0) and time.monotonic() - started < 2.0
                refused += 1

            # In one write the server may read it all at once: the cap must hold for that read too.
            # (Repeated: how the bytes are split into reads varies from try to try.)
            complete = request_head(length=len(SMALL))[:-2] + _padding(100) + b"\r\n" + SMALL
            for name, data, tries in (
                ("80 KiB in one write, unfinished", head + _padding(80), 3),
                ("100 KiB in one write, complete", complete, 10),
            ):
                for _ in range(tries):
                    with connect_tls(webhook.url, ca) as sock:
                        started = time.monotonic()
                        sock.settimeout(8)
                        sock.sendall(data)
                        answer = read_response(sock)
                        seconds = time.monotonic() - started
                        assert answer.status == 431 and answer.closed, (name, answer, f"{seconds:.1f} s")
                        assert seconds < 2.0, (name, seconds)
                        refused += 1
            assert _refused(other, "header_size") == refused
            assert other.post(SMALL).status == 200
        finally:
            other.close()


# ------------------------------------------------------------------------------ in-flight bytes


def test_body_bytes_in_flight_are_capped(tmp_path: Path, cert_dir: Path) -> None:
    """With ``--max-inflight-mib 4``: two slow clients announcing 1.5 MiB each hold 3 MiB; a third
    announcing 1.5 MiB is answered 503 with Retry-After at once, unread; a small review still fits;
    a body streamed without Content-Length is cut off at the cap too; and when the slow clients go
    away their bytes come back (a 3 MiB review is then served)."""
    announced = 3 * MiB // 2
    with _webhook(tmp_path, cert_dir, "--max-inflight-mib", "4") as webhook:
        ca = _ca(webhook)
        other = KeepAlive(webhook.url, ca)
        slow = [connect_tls(webhook.url, ca) for _ in range(2)]
        try:
            for sock in slow:
                sock.sendall(request_head(length=announced) + b'{"apiVersion":' + b" " * 100_000)
            time.sleep(0.3)  # both reservations made

            with connect_tls(webhook.url, ca) as third:
                started = time.perf_counter()
                third.sendall(request_head(length=announced))
                answer = read_response(third, started)
            assert answer.status == 503, answer
            assert answer.headers.get("retry-after") == "1" and answer.closed
            assert answer.seconds < 0.5
            assert "in flight" in orjson.loads(answer.body)["error"]

            assert other.post(SMALL).status == 200  # 3 MiB + 2 KB: within the cap

            with connect_tls(webhook.url, ca) as streamed:
                streamed.sendall(request_head(chunked=True))
                piece = b" " * (64 * 1024)
                frame = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
                with contextlib.suppress(BrokenPipeError, ConnectionResetError, ssl.SSLError):
                    for _ in range(24):  # 1.5 MiB
                        streamed.sendall(frame)
                answer = read_response(streamed)
            assert answer.status == 503 and answer.headers.get("retry-after") == "1", answer
        finally:
            for sock in slow:
                sock.close()
        # The slow clients' reservations are released when they disconnect.
        whole = _valid_review(3 * MiB)
        wait_until(lambda: other.post(whole).status == 200, "3 MiB to fit again", 10, interval=0.2)
        other.close()


# ------------------------------------------------------------------------------ request budget


def test_large_review_over_the_request_budget_is_a_503(tmp_path: Path, cert_dir: Path) -> None:
    """``--request-budget 0.002``: a 2 MiB review (tens of thousands of env entries: 10-20 ms to
    parse alone) cannot be served within 2 ms, so it is answered 503 with Retry-After and counted;
    small reviews (never in the heavy lane) and /healthz keep being answered promptly meanwhile.
    (At 0.01 s the same review is sometimes served in time: the budget starts after the body is read.)"""
    body = _valid_review(2 * MiB)
    with _webhook(tmp_path, cert_dir, "--request-budget", "0.002") as webhook:
        ca = _ca(webhook)
        heavy, small = KeepAlive(webhook.url, ca), KeepAlive(webhook.url, ca)
        try:
            refused = 0
            with HealthProber(webhook.url, ca, interval=0.02) as prober:
                until = time.monotonic() + 3
                while time.monotonic() < until or refused < 5:
                    answer = heavy.post(body)
                    assert answer.status == 503, answer
                    assert answer.headers.get("retry-after") == "1"
                    assert "budget" in orjson.loads(answer.body)["error"]
                    refused += 1
                    quick = small.post(SMALL)
                    assert quick.status == 200 and quick.seconds < 0.25, quick
            assert webhook.metric("ix_gpu_admission_over_budget_total") == refused
            assert webhook.metric("ix_gpu_admission_internal_errors_total") == 0
        finally:
            heavy.close()
            small.close()
        print(f"\nrequest budget: {refused} reviews refused; {prober.result.summary()}")
        assert not prober.result.failures
        assert prober.result.max < HEALTHZ_LIMIT_S, prober.result.summary()


def test_start_up_objects_are_frozen_out_of_the_collector(tmp_path: Path, cert_dir: Path) -> None:
    """The collector's full pass walked the ~60 000 objects of start-up, 52-61 ms of a stalled loop
    each time (the adversarial test's /healthz reached 111 ms); the server freezes them once it is
    loaded, and says how many in its first log line."""
    with _webhook(tmp_path, cert_dir) as webhook:
        serving = next(e for e in webhook.logs() if e.get("msg") == "serving AdmissionReview v1")
    assert serving["frozenObjects"] >= 30_000, serving


def test_valid_review_just_under_3_mib_succeeds_with_default_limits(tmp_path: Path, cert_dir: Path) -> None:
    """The limits must not cost legitimate users: the largest review the apiserver can send, a
    valid GPU pod, is mutated within the default budget, every time."""
    body = _valid_review(MAX_BODY - 1)
    with _webhook(tmp_path, cert_dir) as webhook:
        client = KeepAlive(webhook.url, _ca(webhook))
        try:
            for _ in range(3):
                answer = client.post(body)
                assert answer.status == 200, answer
                response = orjson.loads(answer.body)["response"]
                assert response["allowed"] is True and response["auditAnnotations"]["decision"] == "mutated"
                assert answer.seconds < 0.75, answer.seconds
        finally:
            client.close()
        assert webhook.metric("ix_gpu_admission_over_budget_total") == 0


# ------------------------------------------------------------------------------ memory under a burst


CLIENTS = 300


async def _one_big_client(url: str, context: ssl.SSLContext, body: bytes, start: asyncio.Event) -> str:
    """Send ``body`` (no Expect: 100-continue, like the apiserver) and read the answer concurrently,
    so a 503 sent before the body was read is seen even when the server then closes mid-upload.

    Returns ``HTTP 200``, ``HTTP 503 busy`` (bytes in flight) or ``HTTP 503 budget`` (each only with
    Retry-After), another ``HTTP <status>``, or ``reset`` when the connection ended unanswered."""
    host, port = host_port(url)
    await start.wait()
    reader, writer = await asyncio.open_connection(host, port, ssl=context, server_hostname=host)

    async def answer() -> str:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        status = int(head.split(" ", 2)[1])
        length = (
            int(head.split("content-length:", 1)[1].split("\r\n", 1)[0]) if "content-length:" in head else 0
        )
        text = (await reader.readexactly(length)).decode(errors="replace")
        if status != 503 or "\r\nretry-after: 1\r\n" not in head:
            return f"HTTP {status}"
        return (
            "HTTP 503 busy" if "in flight" in text else "HTTP 503 budget" if "budget" in text else "HTTP 503"
        )

    reading = asyncio.create_task(answer())
    try:
        writer.write(request_head(length=len(body)))
        view = memoryview(body)
        for at in range(0, len(body), 256 * 1024):
            if reading.done():
                break
            writer.write(view[at : at + 256 * 1024])
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    try:
        return await asyncio.wait_for(reading, 60)
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        return "reset"
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


async def _burst(url: str, ca: Path, body: bytes, clients: int) -> Counter[str]:
    """``clients`` connections at once, each sending ``body``; what each got."""
    context = ca_context(ca)
    start = asyncio.Event()
    tasks = [asyncio.create_task(_one_big_client(url, context, body, start)) for _ in range(clients)]
    start.set()
    return Counter(await asyncio.gather(*tasks))


@pytest.mark.timeout(300)
def test_300_clients_sending_3_mib_each_stay_under_256_mib(tmp_path: Path, cert_dir: Path) -> None:
    """300 clients at once, each sending a valid review just under 3 MiB. The in-flight cap admits
    about 8 bodies at a time and answers the rest 503 + Retry-After; the webhook's RSS (sampled
    every 10 ms) must stay under 256 MiB throughout, and come back to near its level before."""
    body = _valid_review(MAX_BODY - 1)
    with _webhook(tmp_path, cert_dir) as webhook:
        assert webhook.process is not None
        pid, ca = webhook.process.pid, _ca(webhook)
        client = KeepAlive(webhook.url, ca)
        assert client.post(body).status == 200  # warm: the first large review's allocations
        baseline = rss_bytes(pid)
        with RssSampler(pid, 0.01) as rss:
            started = time.monotonic()
            outcomes = asyncio.run(_burst(webhook.url, ca, body, CLIENTS))
            burst_seconds = time.monotonic() - started
        print(
            f"\n{CLIENTS} clients, {len(body)} B each, in {burst_seconds:.1f} s: {dict(outcomes)}; "
            f"{rss.summary()}; baseline {baseline / MiB:.1f} MiB"
        )
        settled = (
            wait_until(
                lambda: rss_bytes(pid) < baseline + RSS_RETURN_SLACK,
                "RSS to come back",
                30,
                interval=0.5,
                details=lambda: f"RSS {rss_bytes(pid) / MiB:.1f} MiB, baseline {baseline / MiB:.1f} MiB",
            )
            if rss.max < RSS_LIMIT
            else None
        )
        # The warm-up connection sat idle through the burst, and the server may have closed it (the
        # connection cap closes an address's idle keep-alives; --idle-timeout closes the rest): what
        # is checked is that the server answers afterwards, so ask on a fresh connection.
        client.reconnect()
        assert client.post(SMALL).status == 200
        assert client.post(body).status == 200
        assert webhook.metric("ix_gpu_admission_internal_errors_total") == 0
        client.close()
    assert rss.max < RSS_LIMIT, rss.summary()
    assert settled
    assert set(outcomes) <= {"HTTP 200", "HTTP 503 busy", "HTTP 503 budget", "reset"}, outcomes
    # Large reviews are served one at a time within the request budget; the rest are told to retry.
    assert outcomes["HTTP 200"] >= 1, outcomes
