"""``ix-gpu webhook --host ::`` (what the chart passes by default): the HTTPS port and the plain-HTTP
probe port both answer on ``::1`` and on ``127.0.0.1``.

The webhook binds its sockets itself (:func:`ix_gpu.serving.guarded_http.listen_socket`) and hands
them to uvicorn, so dual-stack rests on IPV6_V6ONLY being off on that socket, not on uvicorn's
handling of a ``::`` host; this is the test of that, with real reviews over TLS, certificates
verified by IP on both families. An explicit IPv4 ``--host`` (the suites' 127.0.0.1) stays IPv4 only.
"""

from __future__ import annotations

import socket
from pathlib import Path

import orjson
import pytest

from tests.support.cli import ix_gpu
from tests.support.https_client import KeepAlive
from tests.support.objects import pod, review
from tests.support.webhook_process import WebhookProcess

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def both_families_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Serving certificates for 127.0.0.1 and ::1, so both are verified by IP, as the apiserver does."""
    out = tmp_path_factory.mktemp("certs-dual")
    ix_gpu("certs", "generate", "--out", str(out), "--ip", "127.0.0.1", "--ip", "::1", check=True)
    return out


def plain_get(host: str, port: int, path: str) -> int:
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


def test_host_any_serves_reviews_and_probes_on_both_families(
    tmp_path: Path, both_families_certs: Path
) -> None:
    extra = ["--probe-port", "0"]
    with WebhookProcess(tmp_path, both_families_certs, host="::", extra=extra).start() as webhook:
        serving = next(e for e in webhook.logs() if e.get("msg") == "serving AdmissionReview v1")
        port = webhook.port
        assert serving["url"] == f"https://[::]:{port}/mutate"
        probe_port = int(str(serving["probes"]).rsplit(":", 1)[1])
        listening = [e["msg"] for e in webhook.logs() if str(e.get("msg", "")).startswith("listening on")]
        assert listening == [
            f"listening on [::]:{port}, IPv6 and IPv4",
            f"listening on [::]:{probe_port}, IPv6 and IPv4",
        ]
        body = orjson.dumps(review(pod(), namespace="team-a"))
        for host in ("127.0.0.1", "[::1]"):
            client = KeepAlive(f"https://{host}:{port}", both_families_certs / "ca.crt")
            try:
                assert client.get("/healthz").status == 200, host
                answer = client.post(body)
                assert answer.status == 200, host
                assert orjson.loads(answer.body)["response"]["allowed"] is True
            finally:
                client.close()
            assert plain_get(host.strip("[]"), probe_port, "/healthz") == 200, host
        assert not [e for e in webhook.logs() if e.get("level") == "error"]


def test_an_explicit_ipv4_host_is_ipv4_only(local_webhook: WebhookProcess) -> None:
    assert local_webhook.get("/healthz")[0] == 200
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("::1", local_webhook.port), timeout=5).close()
