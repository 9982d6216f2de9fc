"""``ix-gpu plugin``'s start-up: config, backend and cluster access made ready in parallel, then
the serving process.

The config and the fake backend's devices file are validated in a child interpreter while this
thread imports the server (see :func:`run_plugin`); cluster access is asked for only when the
config or the flags need it. Everything heavy is imported inside the functions, so that
registering the subcommands (:mod:`ix_gpu.plugin.cli`) costs nothing.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ix_gpu.node.agent_flags import DEFAULT_CONFIG
from ix_gpu.runtime.usage import UsageError

if TYPE_CHECKING:
    from ix_gpu.devicemodel.plugin_runtime import RuntimeConfig
    from ix_gpu.node.backends.base import Backend
    from ix_gpu.node.node_config import NodeLabelReader
    from ix_gpu.plugin.server.allocation_gate import DevicePluginGate
    from ix_gpu.runtime.kube import ApiServer


class LoadedConfig(NamedTuple):
    config: RuntimeConfig
    path: Path | None
    content: bytes | None
    """What ``config`` was parsed from, so a reload starts only when the file changes."""


def load_config(args: argparse.Namespace, label: str | None = None) -> LoadedConfig:
    """The config to start with; from a directory, the one ``label`` (the node's config label)
    or the default picks."""
    from ix_gpu.config.input_files import CONFIG_MAX_BYTES, ConfigError, read_capped
    from ix_gpu.node.config_loader import DEFAULTS_SOURCE, load_runtime_config

    path = Path(args.config) if args.config else Path(DEFAULT_CONFIG)
    if not args.config and not path.exists():
        try:
            return LoadedConfig(load_runtime_config(None, DEFAULTS_SOURCE), None, None)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
    if args.default_config and not path.is_dir():
        raise UsageError("--default-config needs --config DIR (a directory of named configs)")
    if path.is_dir():
        from ix_gpu.node.node_config import choose, named_configs

        choice = choose(named_configs(path), label, args.default_config)
        if choice.name is None:
            raise UsageError(f"--config {path}: {choice.reason}")
        path = path / choice.name
    try:
        content = read_capped(path, CONFIG_MAX_BYTES)
        return LoadedConfig(load_runtime_config(content, str(path)), path, content)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def start_backend(args: argparse.Namespace) -> Backend:
    from ix_gpu.node.backends import make_backend
    from ix_gpu.node.backends.base import BackendError

    if args.backend == "fake" and not args.fake_devices:
        raise UsageError("--backend fake needs --fake-devices FILE")
    if args.fake_devices and args.backend != "fake":
        raise UsageError("--fake-devices only applies to --backend fake")
    fake = Path(args.fake_devices) if args.fake_devices else None
    if fake is not None and not fake.is_file():
        raise UsageError(f"--fake-devices {fake}: no such file")
    try:
        return make_backend(args.backend, fake_devices=fake, root=Path(args.root))
    except BackendError as exc:
        raise BackendStartError(f"backend {args.backend}: {exc}") from None


class BackendStartError(Exception):
    """The environment, not the command line, is wrong (e.g. no library): exit 1."""


def run_plugin(args: argparse.Namespace) -> int:
    import logging

    from ix_gpu.runtime import json_logging

    json_logging.configure(args.log_level)
    node_name = os.environ.get("NODE_NAME")
    config_dir = Path(args.config) if args.config and Path(args.config).is_dir() else None
    # The config and the fake backend's devices file are validated in a child interpreter (see
    # ix_gpu.runtime.isolated; it imports pydantic once, about 0.4 s), asked from two threads,
    # while this thread imports the server. The config is loaded once, there: whether the plugin
    # needs cluster access for node labels is read from it afterwards (asking first cost a second
    # child, 0.3-0.5 s of start-up, before this one even started).
    from concurrent.futures import ThreadPoolExecutor

    from ix_gpu.runtime.isolated import shared_child
    from ix_gpu.runtime.openssl_free import import_without_openssl

    with shared_child():
        # While the child starts, and before any thread of ours imports: the event loop, gRPC and
        # hashlib without OpenSSL (4.5 MiB of RSS; ix_gpu.runtime.openssl_free), which a plugin
        # with cluster access loads later, for HTTPS, when it first connects.
        import_without_openssl("asyncio", "hashlib", "grpclib.client", "grpclib.server")
        with ThreadPoolExecutor(2, thread_name_prefix="plugin-start") as pool:
            starting = pool.submit(start_backend, args)
            # A directory of configs needs the Node's label to pick one, so access comes first then.
            early = args.kubeconfig is not None or config_dir is not None or args.dra_driver is not None
            api_server = connect(args.kubeconfig) if early else None
            node_config = node_config_reader(args, api_server, node_name, config_dir)
            allocation = allocation_gate(args, api_server, node_name, node_config)
            loading = pool.submit(load_config, args, node_config.value() if node_config else None)
            from ix_gpu.plugin.server.app import PluginApp, PluginSettings

            config, config_path, config_content = loading.result()
            if api_server is None and config.labels_enabled:
                api_server = connect(None)
            try:
                backend = starting.result()
            except BackendStartError as exc:
                logging.getLogger("ix_gpu.plugin").error("cannot start: %s", exc)
                return 1

    from ix_gpu.node.devices.sharing import plan_sharing

    for note in plan_sharing(config, backend.vendor.resource_name).notes:
        logging.getLogger("ix_gpu.plugin").warning("config %s: %s", config_path, note)

    import asyncio

    from ix_gpu.config.input_files import ConfigError

    directory = Path(args.device_plugin_dir)
    if not directory.is_dir():
        raise UsageError(f"--device-plugin-dir {directory}: not a directory")
    settings = PluginSettings(
        device_plugin_dir=directory,
        config_path=config_path,
        metrics_port=args.metrics_port or None,
        metrics_host=args.metrics_host,
        node_name=node_name,
        api_server=api_server,
        config_dir=config_dir,
        default_config=args.default_config,
        node_config=node_config,
        allocation=allocation,
        telemetry_interval=args.telemetry_interval,
        pod_resources_socket=Path(args.pod_resources_socket) if args.pod_resources_socket else None,
        dra_driver=args.dra_driver,
    )

    async def main() -> int:
        app = PluginApp(settings, config, backend, config_content)
        try:
            app.check_socket_path()
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        return await app.run(handle_signals=True)

    return asyncio.run(main())


def node_config_reader(
    args: argparse.Namespace, api_server: ApiServer | None, node_name: str | None, config_dir: Path | None
) -> NodeLabelReader | None:
    """What follows the node's config label, when ``--config`` is a directory of named configs."""
    import logging

    if config_dir is None:
        return None
    if api_server is None or not node_name:
        logging.getLogger("ix_gpu.plugin").warning(
            "--config %s is a directory of configs, but without NODE_NAME and cluster access the node "
            "label cannot be read: the default config applies",
            config_dir,
        )
        return None
    from ix_gpu.node.node_config import FIRST_ANSWER_WAIT, NodeLabelReader

    return NodeLabelReader(api_server, node_name).start_and_wait(FIRST_ANSWER_WAIT)


def allocation_gate(
    args: argparse.Namespace,
    api_server: ApiServer | None,
    node_name: str | None,
    reader: NodeLabelReader | None,
) -> DevicePluginGate | None:
    """What decides whether this node's GPUs are advertised (:mod:`ix_gpu.devicemodel.allocation`):
    with ``--dra-driver``, the node's label and the driver's slices; else, where the node is read
    anyway for its config, its label."""
    if args.dra_driver is not None:
        from ix_gpu.config.k8s_names import dns1123_subdomain

        if problems := dns1123_subdomain(args.dra_driver):
            raise UsageError(f"--dra-driver {args.dra_driver!r}: {'; '.join(problems)}")
        if api_server is None or not node_name:
            raise UsageError(
                "--dra-driver needs NODE_NAME and cluster access (in a Pod, or --kubeconfig): the node's "
                "allocation label and the driver's ResourceSlices decide what is advertised"
            )
        if reader is None:
            from ix_gpu.node.node_config import NodeLabelReader

            reader = NodeLabelReader(api_server, node_name)
    if reader is None:
        return None
    from ix_gpu.plugin.server.allocation_gate import DevicePluginGate

    return DevicePluginGate(reader, args.dra_driver)


def connect(kubeconfig: str | None) -> ApiServer | None:
    """``kubeconfig``'s apiserver, else the in-cluster one, else None. Imported only when needed:
    urllib.request and ssl cost the plugin memory."""
    from ix_gpu.runtime.kube import ApiServer
    from ix_gpu.runtime.kubeconfig import read_kubeconfig

    if kubeconfig is not None:
        try:
            return read_kubeconfig(kubeconfig)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return ApiServer.in_cluster()
