"""``ix-gpu plugin`` (run the device plugin), ``ix-gpu devices`` (show what it would advertise) and
``ix-gpu cdi generate`` (write the CDI spec for it).

Registration imports nothing heavy: grpclib, pydantic models and backends are imported by the
handlers, so ``ix-gpu mutate`` never pays for them; and the plugin imports only the backend it runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ix_gpu.plugin.backends import BACKENDS  # light: no backend module is imported here
from ix_gpu.runtime.usage import UsageError, add_log_level, port_number, set_env_name

if TYPE_CHECKING:
    from ix_gpu.devicemodel.plugin_runtime import RuntimeConfig
    from ix_gpu.plugin.backends.base import Backend
    from ix_gpu.plugin.devices.device_list import DeviceList
    from ix_gpu.plugin.server.allocation_gate import DevicePluginGate
    from ix_gpu.plugin.server.node_config import NodeLabelReader
    from ix_gpu.runtime.kube import ApiServer

DEFAULT_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_CONFIG = "/ixconfig/ix-config"  # = ix_gpu.config.plugin_config.DEFAULT_PATH, without pydantic
DEFAULT_METRICS_PORT = 9401


PLUGIN_CONFIG_ENV = "IX_GPU_PLUGIN_CONFIG"
"""``--config`` of the plugin commands: IX_GPU_CONFIG is the webhook's config (``webhook``, ``mutate``)."""


def _add_common(parser: argparse.ArgumentParser) -> None:
    config = parser.add_argument(
        "--config",
        metavar="PATH",
        help=f"the ix-config file (default {DEFAULT_CONFIG} when it exists, else built-in defaults), or "
        "a directory of named configs (a mounted ConfigMap) from which the node label "
        "ix-gpu.io/device-plugin.config picks one",
    )
    set_env_name(config, PLUGIN_CONFIG_ENV)
    parser.add_argument(
        "--default-config",
        metavar="NAME",
        help="with a config directory: the config for nodes without the label (default: the one named "
        "'default', else the only one)",
    )
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="device discovery (default auto)")
    parser.add_argument("--fake-devices", metavar="FILE", help="YAML device description for --backend fake")
    parser.add_argument(
        "--root", metavar="DIR", default="/", help="host root for /dev and /sys (devfs/ixml/nvml), default /"
    )


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    plugin = subparsers.add_parser(
        "plugin",
        help="run the kubelet device plugin",
        description="Serve the kubelet device-plugin API (v1beta1) for Iluvatar or NVIDIA GPUs.",
    )
    _add_common(plugin)
    plugin.add_argument(
        "--device-plugin-dir",
        metavar="DIR",
        default=DEFAULT_DEVICE_PLUGIN_DIR,
        help=f"kubelet device-plugin directory (default {DEFAULT_DEVICE_PLUGIN_DIR})",
    )
    plugin.add_argument(
        "--metrics-port",
        type=port_number,
        default=DEFAULT_METRICS_PORT,
        metavar="N",
        help=f"port for /healthz and /metrics (default {DEFAULT_METRICS_PORT}; 0 disables)",
    )
    plugin.add_argument(
        "--metrics-host",
        default="0.0.0.0",
        metavar="ADDRESS",
        help="address /healthz and /metrics listen on (default 0.0.0.0, every IPv4 address; "
        "e.g. the pod IP from the downward API where pods share a network namespace)",
    )
    plugin.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="for node labels and per-node configs outside a Pod (token users only; default: in-cluster)",
    )
    plugin.add_argument(
        "--node-config-interval",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="with a config directory or --dra-driver: how often the node's labels are re-read (default 60)",
    )
    dra_driver = plugin.add_argument(
        "--dra-driver",
        metavar="NAME",
        help="the DRA driver that may hand out this cluster's GPUs (ix-gpu dra's gpu.iluvatar.com): "
        "advertise devices only while this node is not labelled ix-gpu.io/gpu.allocation=dra and no "
        "ResourceSlice of NAME for it lists a device, and none while that cannot be read. Needs "
        "NODE_NAME and get on nodes, list on resourceslices. Without it, a node labelled dra still "
        "gets no devices when the node can be read (--config DIR)",
    )
    set_env_name(dra_driver, "IX_GPU_DRA_DRIVER")
    add_log_level(plugin)
    plugin.set_defaults(handler=run_plugin)

    devices = subparsers.add_parser(
        "devices",
        help="list the GPU devices the plugin would advertise",
        description="Discover GPUs and print the devices the plugin would advertise, with their chips.",
    )
    _add_common(devices)
    devices.set_defaults(handler=run_devices)

    cdi = subparsers.add_parser("cdi", help="Container Device Interface specs for the advertised devices")
    cdi_sub = cdi.add_subparsers(dest="cdi_command", metavar="SUBCOMMAND")
    cdi_sub.required = True
    generate = cdi_sub.add_parser(
        "generate",
        help="write the CDI spec for the devices the plugin would advertise",
        description=(
            "Discover GPUs and write the CDI spec (kind iluvatar.com/gpu or nvidia.com/gpu): one CDI "
            "device per advertised device, replicas included, each with its chips' device nodes; "
            "shared edits: the control nodes, the driver root mounted read-only and LD_LIBRARY_PATH "
            "(none for NVIDIA, whose toolkit provides the driver). Written atomically to "
            "<cdi.specDir>/<vendor>-<class>.json (default /var/run/cdi); unchanged content is not "
            "rewritten. The plugin writes the same spec itself with deviceListStrategy: cdi."
        ),
    )
    _add_common(generate)
    generate.add_argument(
        "--output", metavar="FILE", help="write here instead (- for stdout) (default: in cdi.specDir)"
    )
    generate.add_argument(
        "--driver-root",
        metavar="DIR",
        help="host driver directory to mount (default: cdi.driverRoot, else the vendor's)",
    )
    generate.set_defaults(handler=run_cdi_generate)

    node_labels = subparsers.add_parser("labels", help="the ix-gpu.io/gpu.* node labels the plugin publishes")
    labels_sub = node_labels.add_subparsers(dest="labels_command", metavar="SUBCOMMAND")
    labels_sub.required = True
    prune = labels_sub.add_parser(
        "prune",
        help="remove the plugin's node labels from every node",
        description=(
            "Remove the labels the plugin publishes (ix-gpu.io/gpu.product, .vendor, .count, .memory, "
            ".replicas) from every Node, keeping labels the operator set (ix-gpu.io/device-plugin.config). "
            "The chart runs it after helm uninstall. Needs list and patch on nodes."
        ),
    )
    prune.add_argument("--kubeconfig", metavar="FILE", help="token kubeconfig (default: in-cluster)")
    prune.add_argument("--dry-run", action="store_true", help="only print what would be removed")
    add_log_level(prune)
    prune.set_defaults(handler=run_labels_prune)


class LoadedConfig(NamedTuple):
    config: RuntimeConfig
    path: Path | None
    content: bytes | None
    """What ``config`` was parsed from, so a reload starts only when the file changes."""


def _load_config(args: argparse.Namespace, label: str | None = None) -> LoadedConfig:
    """The config to start with; from a directory, the one ``label`` (the node's config label)
    or the default picks."""
    from ix_gpu.config.input_files import CONFIG_MAX_BYTES, ConfigError, read_capped
    from ix_gpu.plugin.server.config_loader import DEFAULTS_SOURCE, load_runtime_config

    path = Path(args.config) if args.config else Path(DEFAULT_CONFIG)
    if not args.config and not path.exists():
        try:
            return LoadedConfig(load_runtime_config(None, DEFAULTS_SOURCE), None, None)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
    if args.default_config and not path.is_dir():
        raise UsageError("--default-config needs --config DIR (a directory of named configs)")
    if path.is_dir():
        from ix_gpu.plugin.server.node_config import choose, named_configs

        choice = choose(named_configs(path), label, args.default_config)
        if choice.name is None:
            raise UsageError(f"--config {path}: {choice.reason}")
        path = path / choice.name
    try:
        content = read_capped(path, CONFIG_MAX_BYTES)
        return LoadedConfig(load_runtime_config(content, str(path)), path, content)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _make_backend(args: argparse.Namespace) -> Backend:
    from ix_gpu.plugin.backends import make_backend
    from ix_gpu.plugin.backends.base import BackendError

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
    import asyncio
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

    with shared_child(), ThreadPoolExecutor(2, thread_name_prefix="plugin-start") as pool:
        starting = pool.submit(_make_backend, args)
        # A directory of configs needs the Node's label to pick one, so access comes first then.
        early = args.kubeconfig is not None or config_dir is not None or args.dra_driver is not None
        api_server = _connect(args.kubeconfig) if early else None
        node_config = _node_config_reader(args, api_server, node_name, config_dir)
        allocation = _allocation_gate(args, api_server, node_name, node_config)
        loading = pool.submit(_load_config, args, node_config.value() if node_config else None)
        from ix_gpu.plugin.server.app import PluginApp, PluginSettings

        config, config_path, config_content = loading.result()
        if api_server is None and config.labels_enabled:
            api_server = _connect(None)
        try:
            backend = starting.result()
        except BackendStartError as exc:
            logging.getLogger("ix_gpu.plugin").error("cannot start: %s", exc)
            return 1

    from ix_gpu.plugin.devices.sharing import plan_sharing

    for note in plan_sharing(config, backend.vendor.resource_name).notes:
        logging.getLogger("ix_gpu.plugin").warning("config %s: %s", config_path, note)

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
    )

    async def main() -> int:
        app = PluginApp(settings, config, backend, config_content)
        try:
            app.check_socket_path()
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        return await app.run(handle_signals=True)

    return asyncio.run(main())


class Discovered(NamedTuple):
    config: RuntimeConfig
    backend: Backend
    resource: str
    devices: DeviceList


def _discover(args: argparse.Namespace, command: str) -> Discovered | None:
    """Config, backend and the device list the plugin would advertise; None after printing why
    not (the environment, not the command line: exit 1)."""
    from ix_gpu.plugin.backends.base import BackendError
    from ix_gpu.plugin.devices.device_list import build_device_list
    from ix_gpu.plugin.devices.sharing import plan_sharing

    config = _load_config(args).config
    try:
        backend = _make_backend(args)
        chips = backend.chips()
    except (BackendStartError, BackendError) as exc:
        print(f"ix-gpu {command}: {exc}", file=sys.stderr)
        return None
    plan = plan_sharing(config, backend.vendor.resource_name)
    for note in plan.notes:
        print(f"ix-gpu {command}: note: {note}", file=sys.stderr)
    try:
        devices = build_device_list(
            chips,
            splitboard=config.splitboard,
            replicas=plan.replicas,
            shared=plan.devices,
            key=plan.key,
        )
    except ValueError as exc:
        print(f"ix-gpu {command}: {exc}", file=sys.stderr)
        return None
    return Discovered(config, backend, plan.resource, devices)


def _node_config_reader(
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
    from ix_gpu.plugin.server.node_config import NodeLabelReader

    return NodeLabelReader(api_server, node_name, args.node_config_interval)


def _allocation_gate(
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
            from ix_gpu.plugin.server.node_config import NodeLabelReader

            reader = NodeLabelReader(api_server, node_name, args.node_config_interval)
    if reader is None:
        return None
    from ix_gpu.plugin.server.allocation_gate import DevicePluginGate

    return DevicePluginGate(reader, args.dra_driver)


def _connect(kubeconfig: str | None) -> ApiServer | None:
    """``kubeconfig``'s apiserver, else the in-cluster one, else None. Imported only when needed:
    urllib.request and ssl cost the plugin memory."""
    from ix_gpu.runtime.kube import ApiServer

    if kubeconfig is not None:
        try:
            return ApiServer.from_kubeconfig(kubeconfig)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return ApiServer.in_cluster()


def run_labels_prune(args: argparse.Namespace) -> int:
    from ix_gpu.plugin.server.node_labels import prune_node_labels

    api = _connect(args.kubeconfig)
    if api is None:
        raise UsageError("not in a cluster (no KUBERNETES_SERVICE_HOST or token); give --kubeconfig")
    try:
        removed = prune_node_labels(api, dry_run=args.dry_run)
    except OSError as exc:
        print(f"cannot prune node labels: {exc}", file=sys.stderr)
        return 1
    verb = "would remove" if args.dry_run else "removed"
    for node, keys in sorted(removed.items()):
        print(f"{verb} {', '.join(keys)} from node {node}")
    if not removed:
        print("no node carries labels the plugin publishes")
    return 0


def run_devices(args: argparse.Namespace) -> int:
    from ix_gpu.plugin.devices.device_state import HEALTHY, UNHEALTHY

    found = _discover(args, "devices")
    if found is None:
        return 1
    backend, devices = found.backend, found.devices
    plan_resource = found.resource
    print(f"# backend {backend.name}, resource {plan_resource}, {len(devices.devices)} devices")
    rows = [("ID", "CHIPS", "BOARD", "MINOR", "NUMA", "MEMORY", "HEALTH")]
    for device in devices.devices:
        phys = device.physical
        reasons = [c.unhealthy_reason for c in phys.chips if c.unhealthy_reason]
        rows.append(
            (
                device.id,
                ",".join(c.uuid for c in phys.chips),
                phys.board_id,
                ",".join(str(m) for m in phys.minors),
                "-" if phys.numa_node is None else str(phys.numa_node),
                f"{phys.memory_mib}MiB",
                HEALTHY if not reasons else f"{UNHEALTHY}: " + "; ".join(reasons),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    backend.close()
    return 0


def run_cdi_generate(args: argparse.Namespace) -> int:
    from ix_gpu.config.k8s_names import absolute_path
    from ix_gpu.plugin.devices.cdi import CdiError, cdi_spec, render, spec_path, write_spec

    # The spec's hostPaths are read by the container runtime, relative to nothing we know.
    if args.driver_root is not None and (problems := absolute_path(args.driver_root)):
        raise UsageError(f"--driver-root {args.driver_root!r}: {'; '.join(problems)}")
    found = _discover(args, "cdi generate")
    if found is None:
        return 1
    vendor = found.backend.vendor
    driver_root = args.driver_root or found.config.cdi_driver_root
    try:
        spec = cdi_spec(found.devices, vendor, found.backend.control_nodes(), driver_root=driver_root)
    except CdiError as exc:
        print(f"ix-gpu cdi generate: {exc}", file=sys.stderr)
        return 1
    finally:
        found.backend.close()
    if args.output == "-":
        sys.stdout.write(render(spec).decode())
        return 0
    path = Path(args.output) if args.output else spec_path(found.config.cdi_spec_dir, vendor)
    try:
        changed = write_spec(spec, path)
    except OSError as exc:
        print(f"ix-gpu cdi generate: cannot write {path}: {exc}", file=sys.stderr)
        return 1
    what = f"{len(spec['devices'])} {vendor.resource_name} devices"
    print(f"{'wrote' if changed else 'unchanged:'} {path} ({what})")
    return 0
