"""Bad input over real HTTPS: every answer is a 4xx with a one-line JSON error, never a 5xx, and
the process stays up. Raw TLS sockets cover what an HTTP client will not send: lying
Content-Length, stalled and truncated bodies.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.objects import pod, review
from tests.support.webhook_process import WebhookProcess, ca_context

JSON = {"content-type": "application/json"}
MiB = 1024 * 1024


def _valid() -> dict[str, Any]:
    return review(pod())


def _without(path: tuple[str, ...]) -> dict[str, Any]:
    body = _valid()
    target = body
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return body


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    body = _valid()
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return body


BAD_BODIES: list[tuple[str, bytes, str]] = [
    ("not-json", b"this is not json", "not valid JSON"),
    ("empty", b"", "not valid JSON"),
    ("truncated-json", json.dumps(_valid()).encode()[:-7], "not valid JSON"),
    ("invalid-utf8", b'{"apiVersion": "\xff\xfe"}', "not valid JSON"),
    ("nan", b'{"apiVersion": NaN}', "not valid JSON"),
    ("deep-nesting", b"[" * 5000 + b"]" * 5000, "not valid JSON"),
    ("json-array", b"[]", "must be a JSON object"),
    ("json-string", b'"AdmissionReview"', "must be a JSON object"),
    ("json-null", b"null", "must be a JSON object"),
    ("json-number", b"42", "must be a JSON object"),
    (
        "wrong-apiversion",
        json.dumps(_with(("apiVersion",), "admission.k8s.io/v1beta1")).encode(),
        "apiVersion",
    ),
    ("missing-apiversion", json.dumps(_without(("apiVersion",))).encode(), "apiVersion"),
    ("wrong-kind", json.dumps(_with(("kind",), "Pod")).encode(), "kind must be AdmissionReview"),
    ("missing-request", json.dumps(_without(("request",))).encode(), "request is missing"),
    ("request-not-object", json.dumps(_with(("request",), [1, 2])).encode(), "request is missing or not"),
    ("missing-uid", json.dumps(_without(("request", "uid"))).encode(), "request.uid"),
    ("empty-uid", json.dumps(_with(("request", "uid"), "")).encode(), "request.uid"),
    ("numeric-uid", json.dumps(_with(("request", "uid"), 7)).encode(), "request.uid"),
    ("missing-operation", json.dumps(_without(("request", "operation"))).encode(), "request.operation"),
    ("missing-object", json.dumps(_without(("request", "object"))).encode(), "request.object is required"),
    ("null-object", json.dumps(_with(("request", "object"), None)).encode(), "request.object is required"),
    ("object-is-list", json.dumps(_with(("request", "object"), [pod()])).encode(), "must be an object"),
    ("object-is-string", json.dumps(_with(("request", "object"), "pod")).encode(), "must be an object"),
]


def _assert_one_line_json_error(response: httpx.Response, status: int, says: str = "") -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert b"\n" not in response.content
    error = response.json()["error"]
    assert isinstance(error, str) and error
    assert says in error


@pytest.fixture(autouse=True)
def _server_survives(local_webhook: WebhookProcess, local_client: httpx.Client) -> Iterator[None]:
    yield
    assert local_webhook.alive(), local_webhook.log_tail()
    assert local_client.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("body", "says"), [(b, s) for _, b, s in BAD_BODIES], ids=[i for i, _, _ in BAD_BODIES]
)
def test_malformed_review_is_a_400(body: bytes, says: str, local_client: httpx.Client) -> None:
    _assert_one_line_json_error(local_client.post("/mutate", content=body, headers=JSON), 400, says)


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "application/yaml", ""]
)
def test_wrong_content_type_is_a_415(content_type: str, local_client: httpx.Client) -> None:
    headers = {"content-type": content_type} if content_type else {}
    response = local_client.post("/mutate", content=json.dumps(_valid()), headers=headers)
    _assert_one_line_json_error(response, 415, "application/json")


def test_content_type_parameters_are_accepted(local_client: httpx.Client) -> None:
    response = local_client.post(
        "/mutate", content=json.dumps(_valid()), headers={"content-type": "application/json; charset=utf-8"}
    )
    assert response.status_code == 200


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_other_methods_on_mutate_are_a_405(method: str, local_client: httpx.Client) -> None:
    _assert_one_line_json_error(local_client.request(method, "/mutate"), 405)


def test_unknown_path_is_a_404(local_client: httpx.Client) -> None:
    _assert_one_line_json_error(local_client.post("/validate", content=b"{}", headers=JSON), 404)


def test_streamed_body_over_3_mib_is_a_413(local_client: httpx.Client) -> None:
    """Chunked upload without Content-Length: cut off while streaming."""
    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        piece = b" " * (256 * 1024)
        for _ in range(16):  # 4 MiB
            sent += len(piece)
            yield piece

    try:
        response = local_client.post("/mutate", content=chunks(), headers=JSON)
    except httpx.TransportError:
        pytest.fail("server closed without answering")
    _assert_one_line_json_error(response, 413, "limit")


def test_body_of_exactly_3_mib_is_read(local_client: httpx.Client) -> None:
    body = json.dumps(_valid()).encode()
    body += b" " * (3 * MiB - len(body))
    response = local_client.post("/mutate", content=body, headers=JSON)
    assert response.status_code == 200


# ------------------------------------------------------------------------- raw TLS sockets


def _connect(webhook: WebhookProcess) -> ssl.SSLSocket:
    host, port = webhook.url.removeprefix("https://").rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=10)
    return ca_context(webhook.cert_dir / "ca.crt").wrap_socket(raw, server_hostname=host)


def _request_head(length: int | str) -> bytes:
    return (
        f"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _read_response(sock: ssl.SSLSocket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, rest


def test_declared_length_over_3_mib_is_refused_unread(local_webhook: WebhookProcess) -> None:
    """Only the headers are sent: the 413 must come without the server waiting for 4 MiB."""
    with _connect(local_webhook) as sock:
        started = time.monotonic()
        sock.sendall(_request_head(4 * MiB) + b"{")
        status, body = _read_response(sock)
        assert status == 413
        assert time.monotonic() - started < 0.9  # well under --request-timeout (1 s)
        assert "limit" in json.loads(body)["error"]


def test_stalled_body_is_a_408(local_webhook: WebhookProcess) -> None:
    with _connect(local_webhook) as sock:
        sock.sendall(_request_head(1000) + b'{"apiVersion": "admission')
        status, body = _read_response(sock)
        assert status == 408
        assert "not received within" in json.loads(body)["error"]


def test_headers_then_silence_is_a_408(local_webhook: WebhookProcess) -> None:
    """No body byte at all after the headers: the wait is bounded too (no slowloris)."""
    with _connect(local_webhook) as sock:
        sock.settimeout(5)
        started = time.monotonic()
        sock.sendall(_request_head(1000))
        status, body = _read_response(sock)
        assert status == 408
        assert time.monotonic() - started < 4
        assert "not received within" in json.loads(body)["error"]


def test_slow_but_complete_body_is_answered(local_webhook: WebhookProcess) -> None:
    payload = json.dumps(_valid()).encode()
    with _connect(local_webhook) as sock:
        sock.sendall(_request_head(len(payload)))
        for i in range(0, len(payload), len(payload) // 4 + 1):
            sock.sendall(payload[i : i + len(payload) // 4 + 1])
            time.sleep(0.1)
        status, body = _read_response(sock)
        assert status == 200
        assert json.loads(body)["response"]["allowed"] is True


def test_truncated_body_then_disconnect_is_harmless(
    local_webhook: WebhookProcess, local_client: httpx.Client
) -> None:
    before = local_webhook.metric("ix_gpu_admission_internal_errors_total", local_client)
    for _ in range(5):
        with _connect(local_webhook) as sock:
            sock.sendall(_request_head(5000) + b'{"apiVersion": "admission.k8s.io/v1", "kind"')
    time.sleep(0.2)
    assert local_webhook.metric("ix_gpu_admission_internal_errors_total", local_client) == before


@pytest.mark.parametrize("length", ["abc", "-5", "1e3"])
def test_nonsense_content_length_is_not_a_5xx(length: str, local_webhook: WebhookProcess) -> None:
    with _connect(local_webhook) as sock:
        sock.sendall(_request_head(length) + b"{}")
        try:
            status, _ = _read_response(sock)
        except (ConnectionError, ssl.SSLError, IndexError, ValueError):
            return  # the HTTP parser may drop the connection outright: fine, as long as it is not a 5xx
        assert 400 <= status < 500


def test_plain_http_is_not_served(local_webhook: WebhookProcess) -> None:
    """HTTPS only: a plaintext request gets no HTTP answer."""
    host, port = local_webhook.url.removeprefix("https://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            reply = sock.recv(1024)
        except ConnectionError:
            reply = b""
        assert not reply.startswith(b"HTTP/1.1 200")


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
def test_tls_1_1_is_refused(local_webhook: WebhookProcess) -> None:
    # SECLEVEL=0 lets this client really offer TLS 1.1, so the refusal is the server's.
    context = ca_context(local_webhook.cert_dir / "ca.crt")
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    context.minimum_version = ssl.TLSVersion.TLSv1
    context.maximum_version = ssl.TLSVersion.TLSv1_1
    host, port = local_webhook.url.removeprefix("https://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw, pytest.raises(ssl.SSLError):
        context.wrap_socket(raw, server_hostname=host).close()


def test_tls_1_2_is_served(local_webhook: WebhookProcess) -> None:
    context = ca_context(local_webhook.cert_dir / "ca.crt")
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    host, port = local_webhook.url.removeprefix("https://").rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=host) as sock,
    ):
        assert sock.version() == "TLSv1.2"
        assert sock.selected_alpn_protocol() in (None, "http/1.1")
