"""``ix-gpu webhook --probe-port``: plain-HTTP ``/healthz`` and ``/readyz`` for the kubelet.

The answers are the HTTPS port's (same status and JSON); nothing else is served there (``/mutate``
and ``/metrics`` are 404); ``HEAD`` has no body; and a port already taken is a one-line start-up
error. The probe port's limits are :mod:`ix_gpu.serving.guarded_http`'s, tested with the plugin's
endpoint (tests/plugin/test_plugin_http_endpoints.py, on uvloop as here); its use under squatting
is in test_service_squatting.py.
"""

from __future__ import annotations

import socket
from pathlib import Path

import orjson

from tests.support.cli import ix_gpu
from tests.support.https_client import host_port, read_response
from tests.support.webhook_process import WebhookProcess


def _request(url: str, head: bytes) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(host_port(url), timeout=5) as sock:
        sock.sendall(head)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head_bytes, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head_bytes.decode("latin-1").split("\r\n")
    headers = {n.strip().lower(): v.strip() for n, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split(" ")[1]), headers, body


def test_probe_port_answers_as_the_https_port(tmp_path: Path, cert_dir: Path) -> None:
    with WebhookProcess(tmp_path, cert_dir, extra=["--probe-port", "0"]).start() as webhook:
        probes = webhook.probe_url
        assert probes.startswith("http://127.0.0.1:")
        for path in ("/healthz", "/readyz"):
            status, headers, body = _request(probes, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            https_status, https_body = webhook.get(path)
            assert status == https_status and headers["content-type"] == "application/json"
            assert orjson.loads(body).keys() == orjson.loads(https_body).keys()
            status, headers, body = _request(probes, f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert status == https_status and body == b"" and int(headers["content-length"]) > 0
        for path in ("/mutate", "/metrics"):
            assert _request(probes, f"GET {path} HTTP/1.1\r\n\r\n".encode())[0] == 404
        with socket.create_connection(host_port(probes), timeout=5) as sock:
            sock.sendall(b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n")
            assert read_response(sock).status == 414
        assert webhook.metric("ix_gpu_connections_refused_total", reason="request_line") == 1
        assert not [e for e in webhook.logs() if e.get("level") == "error"]


def test_probe_port_taken_is_one_line(tmp_path: Path, cert_dir: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = ix_gpu(
            "webhook", "--port", "0", "--cert-dir", str(cert_dir), "--probe-port", str(port), timeout=30
        )
    assert result.returncode == 2, result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr
