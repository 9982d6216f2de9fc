"""Claims read over kept-alive connections (:class:`ix_gpu.dra.claims.ClaimReader`): reuse, errors,
a server that drops idle connections, idle expiry, proxies, threads."""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import urllib.error
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from ix_gpu.dra.claims import ClaimError, ClaimReader, ClaimRef
from ix_gpu.kube.apiserver import ApiServer
from tests.dra.fake_resource_api import RESOURCE, FakeResourceApi

REF = ClaimRef("default", "claim", "uid-1")


@pytest.fixture
def api_with_claim(resource_api: tuple[FakeResourceApi, ApiServer]) -> tuple[FakeResourceApi, ApiServer]:
    fake, api = resource_api
    fake.add_claim("default", "claim", "uid-1", [])
    return fake, api


def test_reads_share_one_connection_and_errors_are_oserrors(
    api_with_claim: tuple[FakeResourceApi, ApiServer],
) -> None:
    fake, api = api_with_claim
    reader = ClaimReader(api)
    assert reader.direct
    for _ in range(5):
        assert reader.read(REF)["metadata"]["uid"] == "uid-1"
    with pytest.raises(urllib.error.HTTPError) as missing:
        reader.read(ClaimRef("default", "gone", "uid-2"))
    assert missing.value.code == 404 and isinstance(missing.value, OSError)
    assert reader.read(REF)["metadata"]["name"] == "claim"  # an error answer leaves it usable
    assert reader.opened == 1
    assert fake.count("GET", f"{RESOURCE}/namespaces/default/resourceclaims/") == 7
    reader.close_idle(everything=True)
    reader.read(REF)
    assert reader.opened == 2


def test_an_idle_connection_is_closed_after_idle_s(api_with_claim: tuple[FakeResourceApi, ApiServer]) -> None:
    _, api = api_with_claim
    reader = ClaimReader(api, idle_s=0.0)
    reader.read(REF)
    reader.read(REF)  # the kept one had expired: a new one
    assert reader.opened == 2
    reader.close_idle()
    assert not reader._idle


@contextmanager
def one_answer_per_connection(body: bytes) -> Iterator[str]:
    """An HTTP server that answers one request per connection, then closes it without saying so
    (no ``Connection: close``), as a server dropping an idle keep-alive connection does."""

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            self.wfile.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_connection_the_server_dropped_is_retried_once_on_a_new_one() -> None:
    claim = {"metadata": {"namespace": "default", "name": "claim", "uid": "uid-1"}}
    with one_answer_per_connection(json.dumps(claim).encode()) as url:
        reader = ClaimReader(ApiServer(url, "t0ken", None))
        assert [reader.read(REF) for _ in range(3)] == [claim] * 3
        assert reader.opened == 3


def test_an_answer_that_is_no_object_is_a_claim_error() -> None:
    with one_answer_per_connection(b"[]") as url, pytest.raises(ClaimError, match="answered no object"):
        ClaimReader(ApiServer(url, "t0ken", None)).read(REF)


def test_a_proxy_in_the_environment_is_honoured_through_the_plain_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    api = ApiServer("https://10.0.0.1:6443", "t0ken", None)
    assert ClaimReader(api).direct
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert not ClaimReader(api).direct
    monkeypatch.setenv("NO_PROXY", "10.0.0.1")
    assert ClaimReader(api).direct


def test_threads_each_get_a_connection_and_at_most_keep_stay(
    api_with_claim: tuple[FakeResourceApi, ApiServer],
) -> None:
    _, api = api_with_claim
    reader = ClaimReader(api, keep=2)
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: reader.read(REF)["metadata"]["uid"], range(60)))
    assert answers == ["uid-1"] * 60
    assert 1 <= reader.opened <= 60 and len(reader._idle) <= 2


@pytest.mark.parametrize("direct", [True, False])
def test_a_cut_answer_is_an_oserror_and_one_not_json_a_parse_error_both_ways(
    api_with_claim: tuple[FakeResourceApi, ApiServer], direct: bool
) -> None:
    """Kept-alive or through :meth:`ApiServer.request` (a proxy): ``http.client`` raises no
    ``OSError`` for a body cut short, and ``json`` a ``ValueError``; the preparer counts the first
    as ``read``, the second as ``parse``. Through :meth:`ApiServer.request` a cut body is found
    by what Content-Length still promised (``HTTPResponse.read(amt)`` returns what came without a
    word), so it is a ``read`` failure there too."""
    fake, api = api_with_claim
    reader = ClaimReader(api)
    reader.direct = direct
    path = f"{RESOURCE}/namespaces/default/resourceclaims/claim"
    fake.faults[path] = "cut"
    with pytest.raises(OSError, match="IncompleteRead" if direct else "cut off") as cut:
        reader.read(REF)
    assert not isinstance(cut.value, ClaimError)  # a read failure: the preparer counts it as read
    fake.faults[path] = "junk"
    with pytest.raises(ClaimError, match="not JSON") as junk:
        reader.read(REF)
    assert junk.value.reason == "parse"
    del fake.faults[path]
    assert reader.read(REF)["metadata"]["uid"] == "uid-1"  # and the reader still works
