"""``ix-gpu plugin``'s start-up: the node agents' common start (:func:`ix_gpu.node.agent.start_node`:
config, sharing plan, backend and cluster access, side by side), then what is the device plugin's
own: which node label gates its devices, and the serving process.

Everything heavy is imported inside the functions, so that registering the subcommands
(:mod:`ix_gpu.plugin.cli`) costs nothing.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ix_gpu.node.agent import AgentKind, NodeStart, start_node, vendor_overrides
from ix_gpu.process.usage import UsageError

if TYPE_CHECKING:
    from ix_gpu.plugin.server.allocation_gate import DevicePluginGate

DRA_DRIVER_NEEDS = (
    "--dra-driver needs NODE_NAME and cluster access (in a Pod, or --kubeconfig): the node's "
    "allocation label and the driver's ResourceSlices decide what is advertised"
)
USEVOLCANO_NEEDS = (
    "--usevolcano (USE_VOLCANO) needs NODE_NAME and cluster access (in a Pod, or --kubeconfig): the "
    "pods on this node say which devices Volcano chose"
)


def run_plugin(args: argparse.Namespace) -> int:
    from ix_gpu.process import json_logging

    json_logging.configure(args.log_level)
    node_name = os.environ.get("NODE_NAME")
    _check_dra_driver(args.dra_driver, node_name)
    kind = AgentKind(
        "plugin",
        node_name,
        api_early=args.kubeconfig is not None or args.dra_driver is not None,
        # usevolcano: the watch of this node's pods (ix_gpu.plugin.server.volcano).
        api_for=lambda config: config.labels_enabled or config.usevolcano,
        # Before any thread of ours imports them: the event loop, gRPC and hashlib without OpenSSL
        # (4.5 MiB of RSS), which a plugin with cluster access loads later, for HTTPS.
        preload=("asyncio", "hashlib", "grpclib.client", "grpclib.server"),
    )
    started = start_node(args, kind, _import_server)
    if started is None:
        return 1
    if args.dra_driver is not None and started.api is None:
        started.backend.close()
        raise UsageError(DRA_DRIVER_NEEDS)
    # Asked for on the command line or in the environment, as --dra-driver is: refused without
    # what it needs. From the ix-config (one file for every node and for DRA, and reloaded) it is
    # a warning instead, and Allocate binds the kubelet's choice (server/volcano.py).
    if args.usevolcano and (started.api is None or not node_name):
        started.backend.close()
        raise UsageError(USEVOLCANO_NEEDS)
    directory = Path(args.device_plugin_dir)
    if not directory.is_dir():
        raise UsageError(f"--device-plugin-dir {directory}: not a directory")
    return _serve(args, started, directory, node_name)


def _import_server() -> None:
    """Imported while the child validates the config: the serving side's import time overlaps it."""
    import ix_gpu.plugin.server.app  # noqa: F401


def _serve(args: argparse.Namespace, started: NodeStart, directory: Path, node_name: str | None) -> int:
    import asyncio

    from ix_gpu.config.input_files import ConfigError
    from ix_gpu.plugin.server.app import PluginApp
    from ix_gpu.plugin.server.settings import PluginSettings

    settings = PluginSettings(
        device_plugin_dir=directory,
        config_path=started.loaded.path,
        metrics_port=args.metrics_port or None,
        metrics_host=args.metrics_host,
        node_name=node_name,
        api_server=started.api,
        config_dir=started.config_dir,
        default_config=args.default_config,
        node_config=started.node_reader,
        allocation=_allocation_gate(args.dra_driver, started, node_name),
        telemetry_interval=args.telemetry_interval,
        pod_resources_socket=Path(args.pod_resources_socket) if args.pod_resources_socket else None,
        dra_driver=args.dra_driver,
        vendor_overrides=vendor_overrides(args),
        socket_id=args.socket_id,
    )

    async def main() -> int:
        app = PluginApp(
            settings, started.loaded.config, started.backend, started.loaded.content, started.sharing
        )
        try:
            app.check_socket_path()
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        return await app.run(handle_signals=True)

    return asyncio.run(main())


def _check_dra_driver(dra_driver: str | None, node_name: str | None) -> None:
    if dra_driver is None:
        return
    from ix_gpu.config.k8s_names import dns1123_subdomain

    if problems := dns1123_subdomain(dra_driver):
        raise UsageError(f"--dra-driver {dra_driver!r}: {'; '.join(problems)}")
    if not node_name:
        raise UsageError(DRA_DRIVER_NEEDS)


def _allocation_gate(
    dra_driver: str | None, started: NodeStart, node_name: str | None
) -> DevicePluginGate | None:
    """What decides whether this node's GPUs are advertised (:mod:`ix_gpu.node.allocator`):
    with ``--dra-driver``, the node's label and the driver's slices; else, where the node is read
    anyway for its config, its label."""
    reader = started.node_reader
    if dra_driver is not None and reader is None and started.api is not None and node_name:
        from ix_gpu.node.node_config import NodeLabelReader

        reader = NodeLabelReader(started.api, node_name)
    if reader is None:
        return None
    from ix_gpu.plugin.server.allocation_gate import DevicePluginGate

    return DevicePluginGate(reader, dra_driver)
