"""Node labels: values from the device list, published by a merge-patch the API server accepts."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from ix_gpu.devicemodel import labels
from ix_gpu.devicemodel.plugin_config import load_plugin_config
from ix_gpu.plugin.backends.fake import FakeBackend
from ix_gpu.plugin.server.app import PluginApp, PluginSettings
from ix_gpu.runtime.kube import ApiServer
from tests.plugin.plugin_testkit import FAST_HEALTH, write_config

pytestmark = pytest.mark.timeout(30)


class _ApiServer(BaseHTTPRequestHandler):
    patches: ClassVar[list[tuple[str, str, str, Any]]] = []

    def do_PATCH(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.patches.append((self.path, self.headers["Content-Type"], self.headers["Authorization"], body))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api_server() -> Iterator[tuple[ApiServer, list[tuple[str, str, str, Any]]]]:
    server = HTTPServer(("127.0.0.1", 0), _ApiServer)
    _ApiServer.patches = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield ApiServer(f"http://127.0.0.1:{server.server_port}", "t0ken", None), _ApiServer.patches
    finally:
        server.shutdown()


def test_labels_published_once_per_change(
    short_tmp: Path, fake_devices: Path, api_server: tuple[ApiServer, list[Any]]
) -> None:
    api, patches = api_server
    config = write_config(
        short_tmp, FAST_HEALTH + "labels:\n  enabled: true\nsharing:\n  timeSlicing:\n    replicas: 4\n"
    )
    (short_tmp / "dp").mkdir()
    app = PluginApp(
        PluginSettings(short_tmp / "dp", config, node_name="gpu-node-1", api_server=api),
        load_plugin_config(config),
        FakeBackend(fake_devices),
    )

    async def scenario() -> None:
        await app.check_once()
        await app.check_once()

    asyncio.run(scenario())
    assert len(patches) == 1
    path, content_type, auth, body = patches[0]
    assert path == "/api/v1/nodes/gpu-node-1"
    assert content_type == "application/merge-patch+json"
    assert auth == "Bearer t0ken"
    assert body == {
        "metadata": {
            "labels": {
                labels.GPU_PRODUCT: "Iluvatar-BI-V150",
                labels.GPU_COUNT: "8",
                labels.GPU_MEMORY: "65536",
                labels.GPU_REPLICAS: "4",
            }
        }
    }


def test_labels_not_published_when_disabled(
    short_tmp: Path, fake_devices: Path, api_server: tuple[ApiServer, list[Any]]
) -> None:
    api, patches = api_server
    config = write_config(short_tmp, FAST_HEALTH)
    app = PluginApp(
        PluginSettings(short_tmp, config, node_name="n", api_server=api),
        load_plugin_config(config),
        FakeBackend(fake_devices),
    )
    asyncio.run(app.check_once())
    assert patches == []
