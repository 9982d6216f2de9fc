"""The DRA plugin's /healthz and /metrics with the default listen address (``::``): they answer on
``::1`` and on ``127.0.0.1`` from one dual-stack socket; an explicit IPv4 address binds IPv4 only.
(The fallback where the kernel has no IPv6 is in tests/serving/test_listen_socket.py: one function binds
every listener.)"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ix_gpu.dra.app import DraApp
from ix_gpu.kube.apiserver import ApiServer
from tests.dra.dra_testkit import running, settings
from tests.dra.fake_resource_api import FakeResourceApi

pytestmark = pytest.mark.timeout(60)


def status(host: str, port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as err:
        return err.code


def bound(app: DraApp) -> tuple[int, int]:
    """The family and port the app's HTTP server listens on."""
    assert app.http_server is not None
    sock = app.http_server.sockets[0]
    return sock.family, sock.getsockname()[1]


def test_the_default_host_answers_on_both_families(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    _, api = resource_api
    config = dataclasses.replace(settings(short_tmp), metrics_port=0)
    assert config.metrics_host == "::"

    async def scenario() -> list[int]:
        async with running(config, fake_devices, api) as app:
            family, port = bound(app)
            assert family == socket.AF_INET6
            return [
                await asyncio.to_thread(status, host, port, path)
                for host in ("127.0.0.1", "[::1]")
                for path in ("/healthz", "/metrics")
            ]

    assert asyncio.run(scenario()) == [200, 200, 200, 200]


def test_an_explicit_ipv4_host_binds_ipv4_only(
    short_tmp: Path, fake_devices: Path, resource_api: tuple[FakeResourceApi, ApiServer]
) -> None:
    _, api = resource_api
    config = dataclasses.replace(settings(short_tmp), metrics_port=0, metrics_host="0.0.0.0")

    async def scenario() -> None:
        async with running(config, fake_devices, api) as app:
            family, port = bound(app)
            assert family == socket.AF_INET
            assert await asyncio.to_thread(status, "127.0.0.1", port, "/metrics") == 200
            with pytest.raises(urllib.error.URLError):
                await asyncio.to_thread(status, "[::1]", port, "/metrics")

    asyncio.run(scenario())
