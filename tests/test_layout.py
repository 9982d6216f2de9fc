"""The package layout's import rules, checked by walking every module's AST.

The folders show the layers (``devicemodel`` < ``config`` < ``kube``/``process``/``serving`` <
``webhook``, and those < ``node`` < ``plugin`` / ``dra``; the webhook's pure ``core`` beside its ``service``);
these rules keep the picture true as the code grows. Every import counts, including the lazy ones
inside functions, because a lazy import of fastapi in the core would still make the core impure.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import ROOT

PACKAGE = ROOT / "ix_gpu"

# The pure core may import these and nothing else (standard-library modules without I/O).
CORE_ALLOWED = (
    "__future__",
    "base64",  # the injection record's digests: pure computation
    "collections",
    "copy",
    "dataclasses",
    "enum",
    "fnmatch",
    "fractions",
    "functools",
    "hashlib",
    "itertools",
    "math",
    "orjson",  # serialization in C; no I/O
    "re",
    "typing",
    "ix_gpu.config",
    "ix_gpu.devicemodel",
    "ix_gpu.webhook.core",
)

PLUGIN_API = "ix_gpu.plugin.api"
SUPPORT = ("ix_gpu.kube", "ix_gpu.process", "ix_gpu.serving")
"""The support packages every process stands on: the API client, process plumbing, HTTP serving."""

# (importer prefix, forbidden prefixes, why)
RULES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "ix_gpu.devicemodel",
        (
            "ix_gpu.config",
            "ix_gpu.webhook",
            "ix_gpu.node",
            "ix_gpu.plugin",
            "ix_gpu.dra",
            *SUPPORT,
            "ix_gpu.cli",
        ),
        "the device model is the bottom layer",
    ),
    (
        "ix_gpu.config",
        ("ix_gpu.webhook", "ix_gpu.node", "ix_gpu.plugin", "ix_gpu.dra", *SUPPORT, "ix_gpu.cli"),
        "the config schemas and their loader sit on the device model, below both processes",
    ),
    *(
        (
            support,
            ("ix_gpu.webhook", "ix_gpu.node", "ix_gpu.plugin", "ix_gpu.dra", "ix_gpu.status", "ix_gpu.cli"),
            "the API client, the process plumbing and the HTTP side sit below every process",
        )
        for support in SUPPORT
    ),
    *(
        (
            support,
            tuple(other for other in SUPPORT if other != support),
            "the three support packages are three subjects: none needs another",
        )
        for support in SUPPORT
    ),
    (
        "ix_gpu.webhook",
        ("ix_gpu.node", "ix_gpu.plugin", "ix_gpu.dra", "ix_gpu.cli"),
        "the webhook and the node agents are independent",
    ),
    # The node layer holds what both node agents need: discovery backends, chips and boards,
    # health, CDI, the per-node config choice and node labels. It knows neither agent's API.
    (
        "ix_gpu.node",
        ("ix_gpu.webhook", "ix_gpu.plugin", "ix_gpu.dra", "ix_gpu.cli", "grpc", "grpclib"),
        "the node layer sits below both node agents and speaks neither kubelet API",
    ),
    (
        "ix_gpu.plugin",
        ("ix_gpu.webhook", "ix_gpu.dra", "ix_gpu.cli"),
        "the device plugin and the DRA plugin are two faces of one node: what both need is in ix_gpu.node",
    ),
    (
        "ix_gpu.dra",
        ("ix_gpu.webhook", "ix_gpu.plugin", "ix_gpu.cli", "pynvml", "ctypes"),
        "the device plugin and the DRA plugin are two faces of one node: what both need is in "
        "ix_gpu.node; chips come through a backend, never a library",
    ),
    (
        "ix_gpu.status",
        ("ix_gpu.webhook", "ix_gpu.node", "ix_gpu.plugin", "ix_gpu.dra", "ix_gpu.cli"),
        "ix-gpu status reads the API and the agents' /metrics, never the agents' code",
    ),
    (
        "ix_gpu.dra.devices",
        ("ix_gpu.dra.api", "grpc", "grpclib", "ix_gpu.kube.apiserver"),
        "the DRA device model is pure of gRPC and the API server",
    ),
    (
        "ix_gpu.node.backends",
        ("ix_gpu.node.devices", "ix_gpu.node.node_config", "ix_gpu.node.node_labels"),
        "backends know chips, not the device list or the cluster",
    ),
    (
        "ix_gpu.node.backends",
        ("ix_gpu.process", "ix_gpu.kube", "ix_gpu.serving"),
        "a discovery backend knows devices, not processes: child interpreters and file watching are "
        "the node layer's (ix_gpu.node.fake_devices_file)",
    ),
    (
        "ix_gpu.node.devices",
        (
            "ix_gpu.kube.apiserver",
            "ix_gpu.kube.list_watch",
            "ix_gpu.kube.watched_cache",
            "ix_gpu.node.backends.ixml",
            "ix_gpu.node.backends.nvml",
            "ix_gpu.node.backends.devfs",
            "ix_gpu.node.backends.fake",
            "pynvml",
            "ctypes",
        ),
        "devices are built from what a backend reports (through backends.base): pure of the API "
        "server and of libraries",
    ),
    (
        "ix_gpu.plugin.offer",
        ("ix_gpu.plugin.server", "ix_gpu.plugin.api", "grpc", "grpclib", "pynvml", "ctypes"),
        "the device plugin's allocation is pure of gRPC and of management libraries",
    ),
    # The plugin process serves and registers with grpclib and writes its own metrics text: grpcio
    # and prometheus_client would cost every GPU node about 11 MiB. grpcio (and its generated
    # *_pb2_grpc stubs) remain for the tests and the benchmark, which play the kubelet.
    *(
        (
            importer,
            ("grpc", f"{PLUGIN_API}.deviceplugin_v1beta1_pb2_grpc", "prometheus_client"),
            "the plugin process uses grpclib and its own metrics, not grpcio or prometheus_client",
        )
        for importer in (
            "ix_gpu.plugin.server",
            "ix_gpu.plugin.cli",
            "ix_gpu.plugin.startup",
            "ix_gpu.plugin.commands",
            "ix_gpu.node",
        )
    ),
    *(
        (
            importer,
            (
                "grpc",
                "ix_gpu.dra.api.dra_v1_pb2_grpc",
                "ix_gpu.dra.api.pluginregistration_v1_pb2_grpc",
                "prometheus_client",
            ),
            "the DRA plugin process uses grpclib and its own metrics, not grpcio or prometheus_client",
        )
        for importer in (
            "ix_gpu.dra.app",
            "ix_gpu.dra.servicer",
            "ix_gpu.dra.cli",
            "ix_gpu.dra.prepare",
            "ix_gpu.dra.metrics",
        )
    ),
    (
        "ix_gpu.serving.text_metrics",
        ("prometheus_client",),
        "the node agents' metrics writer is what replaces prometheus_client there",
    ),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(source: str, module: str, is_package: bool) -> Iterator[str]:
    """Every module an import statement in ``source`` names, relative imports resolved."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target
            # "from ix_gpu.webhook import service" imports the submodule ix_gpu.webhook.service
            yield from (f"{target}.{alias.name}" for alias in node.names)


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(module: str, imported: list[str]) -> list[str]:
    found = []
    for importer, forbidden, why in RULES:
        if not under(module, importer):
            continue
        for name in imported:
            for prefix in forbidden:
                if under(name, prefix):
                    found.append(f"{module} imports {name}: {why}")
    if under(module, "ix_gpu.webhook.core"):
        for name in imported:
            top_allowed = any(under(name, allowed) for allowed in CORE_ALLOWED)
            # "from typing import Any" also yields "typing.Any": allowed under its module.
            if not top_allowed:
                found.append(f"{module} imports {name}: the webhook core imports no I/O, only {CORE_ALLOWED}")
    return sorted(set(found))


def package_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_package_obeys_the_import_rules() -> None:
    problems = []
    for path in package_modules():
        module = module_name(path)
        found = list(imports(path.read_text(), module, path.name == "__init__.py"))
        problems += violations(module, found)
    assert not problems, "\n".join(problems)


def test_the_walk_sees_every_layer() -> None:
    names = {module_name(p) for p in package_modules()}
    for layer in (
        "ix_gpu.devicemodel",
        "ix_gpu.config",
        *SUPPORT,
        "ix_gpu.webhook.core",
        "ix_gpu.webhook.certs",
        "ix_gpu.webhook.service",
        "ix_gpu.node",
        "ix_gpu.node.backends",
        "ix_gpu.node.devices",
        "ix_gpu.plugin.offer",
        "ix_gpu.plugin.server",
        "ix_gpu.plugin.api",
        "ix_gpu.dra",
        "ix_gpu.dra.api",
        "ix_gpu.status",
    ):
        assert layer in names, f"{layer} is missing: the rules would check nothing"
        doc = ast.get_docstring(ast.parse((ROOT / layer.replace(".", "/") / "__init__.py").read_text()))
        assert doc, f"{layer}/__init__.py says what the folder holds and may import"


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("ix_gpu.webhook.core.mutation", "import fastapi", "fastapi"),
        ("ix_gpu.webhook.core.mutation", "def f():\n    import socket\n", "socket"),
        ("ix_gpu.webhook.core.mutation", "from ix_gpu.kube import apiserver", "ix_gpu.kube"),
        ("ix_gpu.webhook.core.mutation", "from ..service import app", "ix_gpu.webhook.service"),
        ("ix_gpu.webhook.service.app", "from ix_gpu.plugin.server import app", "ix_gpu.plugin"),
        ("ix_gpu.plugin.server.app", "import ix_gpu.webhook.core.mutation", "ix_gpu.webhook"),
        ("ix_gpu.devicemodel.labels", "from ix_gpu import webhook", "ix_gpu.webhook"),
        ("ix_gpu.devicemodel.labels", "from ix_gpu.kube.apiserver import ApiServer", "ix_gpu.kube"),
        ("ix_gpu.devicemodel.labels", "from ix_gpu.config import text", "ix_gpu.config"),
        ("ix_gpu.config.webhook_config", "from ix_gpu.kube import apiserver", "ix_gpu.kube"),
        ("ix_gpu.config.plugin_config", "from ix_gpu.plugin.server import app", "ix_gpu.plugin"),
        ("ix_gpu.kube.apiserver", "from ix_gpu.cli import UsageError", "ix_gpu.cli"),
        ("ix_gpu.kube.list_watch", "from ix_gpu.node import node_config", "ix_gpu.node"),
        ("ix_gpu.config.plugin_config", "from ix_gpu.node.devices import sharing", "ix_gpu.node"),
        ("ix_gpu.plugin.offer.allocation", "import grpc", "grpc"),
        ("ix_gpu.plugin.offer.allocation", "from grpclib.const import Status", "grpclib"),
        ("ix_gpu.plugin.server.servicer", "import grpc", "grpc"),
        ("ix_gpu.plugin.server.registration", "def f():\n    import grpc.aio\n", "grpc.aio"),
        (
            "ix_gpu.plugin.server.app",
            "from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2_grpc",
            "pb2_grpc",
        ),
        ("ix_gpu.plugin.server.metrics", "from prometheus_client import Counter", "prometheus_client"),
        ("ix_gpu.serving.text_metrics", "import prometheus_client", "prometheus_client"),
        ("ix_gpu.dra.metrics", "from prometheus_client import Gauge", "prometheus_client"),
        ("ix_gpu.plugin.cli", "import prometheus_client", "prometheus_client"),
        ("ix_gpu.node.backends.fake", "from ix_gpu.node.devices import device_list", "devices"),
        ("ix_gpu.node.devices.cdi", "from ix_gpu.node.backends import ixml", "ixml"),
        ("ix_gpu.node.devices.health", "import ctypes", "ctypes"),
        ("ix_gpu.node.node_config", "from ix_gpu.plugin.server import app", "ix_gpu.plugin"),
        ("ix_gpu.node.cdi", "from ix_gpu.dra.prepare import Preparer", "ix_gpu.dra"),
        ("ix_gpu.node.node_labels", "from grpclib.server import Server", "grpclib"),
        ("ix_gpu.plugin.server.app", "from ix_gpu.dra import devices", "ix_gpu.dra"),
        ("ix_gpu.dra.app", "from ix_gpu.plugin.server.registration import Registrar", "registration"),
        ("ix_gpu.dra.prepare", "from ix_gpu.plugin.offer.allocation import allocate", "ix_gpu.plugin"),
        ("ix_gpu.dra.app", "def f():\n    from ix_gpu.plugin import cli\n", "ix_gpu.plugin"),
        ("ix_gpu.dra.servicer", "import grpc", "grpc"),
        ("ix_gpu.dra.app", "from ix_gpu.dra.api import dra_v1_pb2_grpc", "pb2_grpc"),
        ("ix_gpu.dra.devices", "from ix_gpu.kube.apiserver import ApiServer", "ix_gpu.kube.apiserver"),
        ("ix_gpu.dra.slices", "from ix_gpu.webhook.core import mutation", "ix_gpu.webhook"),
    ],
)
def test_each_rule_catches_a_violation(module: str, source: str, expected: str) -> None:
    """The checker itself can fail: each forbidden import, written the way code writes it, is found."""
    found = violations(module, list(imports(source, module, is_package=False)))
    assert any(expected in line for line in found), found


def test_allowed_imports_pass() -> None:
    source = (
        "from __future__ import annotations\nimport re\nfrom typing import Any\n"
        "from ix_gpu.devicemodel import labels\nfrom .patch_ops import Op\n"
    )
    module = "ix_gpu.webhook.core.mutation"
    assert violations(module, list(imports(source, module, is_package=False))) == []
