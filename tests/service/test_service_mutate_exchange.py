"""``/mutate`` as the connection's protocol serves it (:mod:`ix_gpu.webhook.service.mutate_exchange`),
over raw TLS sockets to the real ``ix-gpu webhook``: what HTTP/1.1 allows a client and no
ordinary client library sends.

- Pipelined requests are answered in order, whatever serves them: reviews answered at once,
  ``/healthz`` (FastAPI's), and a large review whose answer waits for its forked child.
- ``Expect: 100-continue`` gets its interim answer before the body is sent.
- A percent-encoded ``/mutate`` and the apiserver's ``?timeout=`` query reach the lane.
- HTTP/1.0 and ``Connection: close`` are answered, then the connection closes.
- The answer has one head, with ``date`` and ``content-length``, and keep-alive serves many reviews
  on one connection.
"""

from __future__ import annotations

import socket
import ssl

import orjson
import pytest

from tests.support.adversarial import near_limit_body
from tests.support.https_client import Answer, KeepAlive, closed_by_peer, connect_tls, request_head
from tests.support.monitors import HealthProber
from tests.support.objects import pod, review
from tests.support.webhook_process import WebhookProcess

GPU = {"iluvatar.com/gpu": 1}


def _body(uid: str) -> bytes:
    return orjson.dumps(review(pod(limits=GPU), uid=uid))


def _post(
    body: bytes, path: str = "/mutate", *, version: str = "1.1", extra: dict[str, str] | None = None
) -> bytes:
    head = request_head("POST", path, length=len(body), extra=extra)
    if version != "1.1":
        head = head.replace(b"HTTP/1.1\r\n", f"HTTP/{version}\r\n".encode(), 1)
    return head + body


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()


def _read_answers(sock: socket.socket, count: int) -> list[Answer]:
    """Exactly ``count`` answers, split by their Content-Length (a pipelined answer's bytes may
    come in the same read as the one before it)."""
    data = b""
    answers: list[Answer] = []
    while len(answers) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end].decode("latin-1").split("\r\n")
            headers = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            end = head_end + 4 + int(headers.get("content-length", "0"))
            if len(data) >= end:
                status = int(head[0].split(" ", 2)[1])
                close = headers.get("connection", "").lower() == "close"
                answers.append(Answer(status, data[head_end + 4 : end], 0.0, headers, close))
                data = data[end:]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"closed after {len(answers)} of {count} answers; left: {data[:200]!r}"
        data += chunk
    assert not data, f"more than {count} answers: {data[:200]!r}"
    return answers


def _uid(answer: Answer) -> str:
    assert answer.status == 200, answer
    uid: str = orjson.loads(answer.body)["response"]["uid"]
    return uid


@pytest.fixture
def tls(local_webhook: WebhookProcess) -> socket.socket:
    return connect_tls(local_webhook.url, local_webhook.cert_dir / "ca.crt")


def test_pipelined_reviews_and_healthz_are_answered_in_order(tls: ssl.SSLSocket) -> None:
    with tls:
        tls.sendall(_post(_body("first")) + _get("/healthz") + _post(_body("second")) + _get("/nowhere"))
        first, health, second, missing = _read_answers(tls, 4)
    assert _uid(first) == "first" and _uid(second) == "second"
    assert (health.status, health.body) == (200, b'{"status":"ok"}')
    assert missing.status == 404 and orjson.loads(missing.body) == {"error": "Not Found"}
    assert not any(answer.closed for answer in (first, health, second, missing))


def test_a_review_pipelined_behind_one_that_waits_for_its_child_comes_second(
    local_webhook: WebhookProcess,
) -> None:
    """Over ``offload_bytes`` (64 KiB) a review is parsed in a forked child, so its answer comes
    from a task; the small review sent right behind it must still be answered after it."""
    large = near_limit_body("big-env", 200_000, "large")
    with connect_tls(local_webhook.url, local_webhook.cert_dir / "ca.crt") as sock:
        sock.sendall(_post(large) + _post(_body("small")) + _post(large.replace(b'"large"', b'"again"')))
        answers = _read_answers(sock, 3)
    assert [_uid(answer) for answer in answers] == ["large", "small", "again"]


def test_expect_100_continue_gets_its_interim_answer_before_the_body(tls: ssl.SSLSocket) -> None:
    body = _body("continued")
    with tls:
        tls.sendall(request_head("POST", "/mutate", length=len(body), extra={"Expect": "100-continue"}))
        tls.settimeout(5)
        interim = tls.recv(65536)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        tls.sendall(body)
        (answer,) = _read_answers(tls, 1)
    assert _uid(answer) == "continued"


@pytest.mark.parametrize("path", ["/mutate?timeout=10s", "/%6Dutate", "/mut%61te?timeout=5s"])
def test_the_apiservers_query_and_percent_encoding_reach_the_lane(tls: ssl.SSLSocket, path: str) -> None:
    with tls:
        tls.sendall(_post(_body("encoded"), path))
        (answer,) = _read_answers(tls, 1)
    assert _uid(answer) == "encoded"


@pytest.mark.parametrize(
    ("version", "extra"),
    [("1.0", None), ("1.1", {"Connection": "close"})],
    ids=["http-1.0", "connection-close"],
)
def test_a_client_that_asks_for_one_request_gets_the_answer_then_a_close(
    tls: ssl.SSLSocket, version: str, extra: dict[str, str] | None
) -> None:
    with tls:
        tls.sendall(_post(_body("once"), version=version, extra=extra))
        (answer,) = _read_answers(tls, 1)
        assert _uid(answer) == "once" and answer.closed
        assert closed_by_peer(tls, 5)


def test_one_head_with_date_and_length_and_many_reviews_on_one_connection(
    local_webhook: WebhookProcess,
) -> None:
    client = KeepAlive(local_webhook.url, local_webhook.cert_dir / "ca.crt")
    try:
        for i in range(200):
            answer = client.post(_body(f"review-{i}"))
            assert _uid(answer) == f"review-{i}"
        assert client.connections == 1
        assert answer.headers["content-type"] == "application/json"
        assert int(answer.headers["content-length"]) == len(answer.body)
        assert answer.headers["date"].endswith(" GMT")
        refused = client.request("GET", "/mutate")
        assert (refused.status, refused.headers["allow"]) == (405, "POST")
        assert orjson.loads(refused.body) == {"error": "Method Not Allowed"}
        assert _uid(client.post(_body("after-405"))) == "after-405" and client.connections == 1
    finally:
        client.close()


def test_a_refusal_queued_behind_a_waiting_review_keeps_its_place(local_webhook: WebhookProcess) -> None:
    """A 415 for the second request is only sent after the first (slow) answer; a 413 (Content-Length
    over 3 MiB) third, which closes the connection."""
    large = near_limit_body("big-env", 200_000, "slow")
    unsupported = (
        request_head("POST", "/mutate", length=2).replace(b"application/json", b"text/plain") + b"{}"
    )
    too_large = request_head("POST", "/mutate", length=4 << 20)
    with connect_tls(local_webhook.url, local_webhook.cert_dir / "ca.crt") as sock:
        sock.sendall(_post(large) + unsupported + too_large)
        slow, media, size = _read_answers(sock, 3)
        assert _uid(slow) == "slow"
        assert media.status == 415 and not media.closed
        assert size.status == 413 and size.closed
        assert closed_by_peer(sock, 5)


def test_a_pipelined_body_that_stalls_after_its_turn_comes_is_a_408(local_webhook: WebhookProcess) -> None:
    """Its turn comes when the review before it is answered (from a task, not a read): the body's
    ``--request-timeout`` (1 s here) must run from then, or the connection would be held for ever."""
    large = near_limit_body("big-env", 200_000, "ahead")
    stalled = request_head("POST", "/mutate", length=100) + b'{"apiVersion"'
    with connect_tls(local_webhook.url, local_webhook.cert_dir / "ca.crt") as sock:
        sock.sendall(_post(large) + stalled)
        sock.settimeout(10)
        ahead, late = _read_answers(sock, 2)
        assert _uid(ahead) == "ahead"
        assert late.status == 408 and late.closed
        assert orjson.loads(late.body) == {"error": "body not received within 1 s"}
        assert closed_by_peer(sock, 5)


def _tiny(uid: str) -> bytes:
    """A GPU pod review of about 250 bytes: as many as fit in one read."""
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": GPU}}]},
    }
    envelope = {"uid": uid, "operation": "CREATE", "namespace": "ns", "object": obj}
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": envelope})


def test_thousands_of_reviews_pipelined_behind_a_waiting_one_are_answered_in_order(
    local_webhook: WebhookProcess,
) -> None:
    """What a client can put in one stream: a review whose answer waits for its child, then 2,000
    small ones (about 750 to a read). They are served one per turn of the loop, in order: not by
    a recursion through the queue, which ran out of stack, and not all in one callback, which
    would stall the loop for every other client."""
    large = near_limit_body("big-env", 100_000, "first")
    small = b"".join(_post(_tiny(f"r{i}")) for i in range(2000))
    with connect_tls(local_webhook.url, local_webhook.cert_dir / "ca.crt") as sock:
        sock.settimeout(60)
        sock.sendall(_post(large) + small)
        answers = _read_answers(sock, 2001)
    assert [_uid(answer) for answer in answers] == ["first", *(f"r{i}" for i in range(2000))]
    errors = [entry for entry in local_webhook.logs() if entry.get("level") == "error"]
    assert not errors, errors[:3]


def test_a_read_full_of_pipelined_reviews_does_not_stall_the_loop(local_webhook: WebhookProcess) -> None:
    """About 750 small reviews fit in one read; answered all in that read's callback they would
    hold the loop for as long as 750 reviews take. Served one per turn, /healthz (probed from
    another connection meanwhile) waits for at most a few of them."""
    ca = local_webhook.cert_dir / "ca.crt"
    stream = b"".join(_post(_tiny(f"r{i}")) for i in range(3000))
    with (
        HealthProber(local_webhook.url, ca, interval=0.01) as prober,
        connect_tls(local_webhook.url, ca) as sock,
    ):
        sock.settimeout(60)
        sock.sendall(stream)
        answers = _read_answers(sock, 3000)
    assert [_uid(answer) for answer in answers] == [f"r{i}" for i in range(3000)]
    print(f"\n3,000 pipelined reviews: {prober.result.summary()}")
    assert not prober.result.failures
    assert prober.result.max < 0.1, prober.result.summary()


def test_a_review_pipelined_behind_one_answered_in_the_same_read_gets_the_rest_of_its_body(
    local_webhook: WebhookProcess,
) -> None:
    """The second review's head comes in the read that answered the first, its 200 KB body in
    the reads after: queued for the next turn, it must still be read (not left paused until its
    body's timeout answers 408)."""
    large = near_limit_body("big-env", 200_000, "second")
    with connect_tls(local_webhook.url, local_webhook.cert_dir / "ca.crt") as sock:
        sock.settimeout(10)
        sock.sendall(_post(_tiny("first")) + _post(large))
        first, second = _read_answers(sock, 2)
    assert (_uid(first), _uid(second)) == ("first", "second")
