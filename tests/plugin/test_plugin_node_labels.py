"""Node labels: values from the device list, published by a merge-patch the API server accepts."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import jsonpatch
import pytest

from ix_gpu.config.plugin_config import load_plugin_config
from ix_gpu.config.webhook_config import default_config
from ix_gpu.devicemodel import labels
from ix_gpu.kube.apiserver import ApiServer
from ix_gpu.node.backends.base import Chip
from ix_gpu.node.devices.device_list import build_device_list
from ix_gpu.node.fake_devices_file import fake_backend
from ix_gpu.node.node_labels import node_labels, prune_node_labels
from ix_gpu.plugin.server.app import PluginApp
from ix_gpu.plugin.server.settings import PluginSettings
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import NamespaceFacts
from ix_gpu.webhook.core.mutation import mutate
from tests.plugin.plugin_testkit import FAST_HEALTH, write_config
from tests.support.objects import pod

pytestmark = pytest.mark.timeout(30)


class _ApiServer(BaseHTTPRequestHandler):
    patches: ClassVar[list[tuple[str, str, str, Any]]] = []
    nodes: ClassVar[list[dict[str, Any]]] = []
    """What GET /api/v1/nodes lists, ``limit`` at a time (``continue`` = the next index)."""

    def do_GET(self) -> None:
        query = dict(part.split("=", 1) for part in self.path.partition("?")[2].split("&") if part)
        start, limit = int(query.get("continue", "0")), int(query.get("limit", "500"))
        page = self.nodes[start : start + limit]
        more = str(start + limit) if start + limit < len(self.nodes) else ""
        body = json.dumps({"items": page, "metadata": {"continue": more}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

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
    _ApiServer.nodes = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield ApiServer(f"http://127.0.0.1:{server.server_port}", "t0ken", None), _ApiServer.patches
    finally:
        server.shutdown()


def labelling_app(base: Path, devices: Path, api: ApiServer, extra: str = "") -> PluginApp:
    """A plugin on the fake devices with ``labels.enabled`` (and ``extra`` config), node gpu-node-1."""
    config = write_config(base, FAST_HEALTH + "labels:\n  enabled: true\n" + extra)
    (base / "dp").mkdir()
    return PluginApp(
        PluginSettings(base / "dp", config, node_name="gpu-node-1", api_server=api),
        load_plugin_config(config).runtime(),
        fake_backend(devices),
    )


def test_labels_published_once_per_change(
    short_tmp: Path, fake_devices: Path, api_server: tuple[ApiServer, list[Any]]
) -> None:
    api, patches = api_server
    app = labelling_app(short_tmp, fake_devices, api, "sharing:\n  timeSlicing:\n    replicas: 4\n")

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
                labels.GPU_PRODUCT: "BI-V150",  # the model the README's gpu-type example names
                labels.GPU_VENDOR: "iluvatar",
                labels.GPU_COUNT: "8",
                labels.GPU_MEMORY: "65536",
                labels.GPU_REPLICAS: "4",
            }
        }
    }


def test_labels_are_written_again_after_each_registration_with_the_kubelet(
    short_tmp: Path, fake_devices: Path, api_server: tuple[ApiServer, list[Any]]
) -> None:
    """A kubelet that restarts may register its Node anew (the Node was deleted meanwhile), and
    the new object has none of the labels: the plugin registers again, then labels again."""
    api, patches = api_server
    app = labelling_app(short_tmp, fake_devices, api)

    async def scenario() -> None:
        await app.check_once()
        await app.check_once()
        assert app.registrar.on_registered is not None
        app.registrar.on_registered()  # what a registration with a restarted kubelet calls
        await app.check_once()

    asyncio.run(scenario())
    assert len(patches) == 2 and patches[0][3] == patches[1][3]


def test_a_node_whose_devices_all_disappear_loses_its_labels(
    short_tmp: Path, fake_devices: Path, api_server: tuple[ApiServer, list[Any]]
) -> None:
    # Stale labels would keep gpu-type affinity sending pods to a node without GPUs.
    api, patches = api_server
    app = labelling_app(short_tmp, fake_devices, api)

    async def scenario() -> None:
        await app.check_once()
        fake_devices.write_text("vendor: iluvatar\nboards: []\n")
        await app.check_once()
        await app.check_once()

    asyncio.run(scenario())
    assert [body["metadata"]["labels"][labels.GPU_PRODUCT] for _, _, _, body in patches] == ["BI-V150", None]
    assert patches[1][3] == {"metadata": {"labels": dict.fromkeys(labels.PUBLISHED)}}


def test_a_plugin_starting_without_devices_removes_labels_left_from_before(
    short_tmp: Path, api_server: tuple[ApiServer, list[Any]]
) -> None:
    api, patches = api_server
    empty = short_tmp / "devices.yaml"
    empty.write_text("vendor: iluvatar\nboards: []\n")
    app = labelling_app(short_tmp, empty, api)
    asyncio.run(app.check_once())
    assert [body for _, _, _, body in patches] == [{"metadata": {"labels": dict.fromkeys(labels.PUBLISHED)}}]


def test_labels_not_published_when_disabled(
    short_tmp: Path, fake_devices: Path, api_server: tuple[ApiServer, list[Any]]
) -> None:
    api, patches = api_server
    config = write_config(short_tmp, FAST_HEALTH)
    app = PluginApp(
        PluginSettings(short_tmp, config, node_name="n", api_server=api),
        load_plugin_config(config).runtime(),
        fake_backend(fake_devices),
    )
    asyncio.run(app.check_once())
    assert patches == []


# Model names as libixml / NVML / the devfs backend report them, and as users write them.
MODEL_NAMES = [
    "Iluvatar BI-V150",
    "Iluvatar MR-V100",
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA H200 (141GB)",
    "Tesla V100-SXM2-16GB",
    "iluvatar 0x0001",
    "  BI-V150  ",
    "GPU model: x/y@z",
    "Ω " + "x" * 90,
]


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_the_webhook_selects_exactly_the_product_label_the_plugin_publishes(name: str) -> None:
    """A pod annotated with the product name a node reports lands on that node: the webhook's
    required node affinity names the very value the plugin writes into the node label."""
    chip = Chip(
        uuid="GPU-0",
        index=0,
        minor=0,
        board_id="b0",
        board_position=0,
        product=name,
        memory_mib=32768,
        numa_node=None,
    )
    published = node_labels(build_device_list([chip], splitboard=False, replicas=1))[labels.GPU_PRODUCT]
    assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", published)
    for written in (name, published, f"{published}, other-model"):
        obj = pod(limits={"iluvatar.com/gpu": 1}, annotations={labels.GPU_TYPE: written})
        result = mutate(obj, "CREATE", NamespaceFacts("team"), CompiledConfig(default_config()))
        requirement = next(
            expression
            for term in jsonpatch.apply_patch(obj, result.ops)["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]["nodeSelectorTerms"]
            for expression in term["matchExpressions"]
            if expression["key"] == labels.GPU_PRODUCT
        )
        assert requirement["operator"] == "In"
        assert requirement["values"][0] == published, written


def test_prune_removes_only_the_published_labels_from_every_node_page_by_page(
    api_server: tuple[ApiServer, list[Any]],
) -> None:
    api, patches = api_server
    published = {key: "x" for key in labels.PUBLISHED}
    _ApiServer.nodes = [
        {"metadata": {"name": "gpu-1", "labels": {**published, "kubernetes.io/os": "linux"}}},
        {"metadata": {"name": "cpu-1", "labels": {"kubernetes.io/os": "linux"}}},
        {
            "metadata": {
                "name": "gpu-2",
                "labels": {labels.GPU_PRODUCT: "BI-V100", labels.DEVICE_PLUGIN_CONFIG: "a"},
            }
        },
    ]
    assert prune_node_labels(api, dry_run=True, page_size=2) == {
        "gpu-1": sorted(labels.PUBLISHED),
        "gpu-2": [labels.GPU_PRODUCT],
    }
    assert patches == []
    removed = prune_node_labels(api, page_size=2)  # the third node is on the second page
    assert set(removed) == {"gpu-1", "gpu-2"}
    assert [(path, body) for path, _, _, body in patches] == [
        ("/api/v1/nodes/gpu-1", {"metadata": {"labels": dict.fromkeys(sorted(labels.PUBLISHED))}}),
        # The operator's config label stays.
        ("/api/v1/nodes/gpu-2", {"metadata": {"labels": {labels.GPU_PRODUCT: None}}}),
    ]
