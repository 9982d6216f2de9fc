"""``ix-gpu dra``: run the DRA kubelet plugin.

Registration imports nothing heavy (the handler imports grpclib, the backend and the config
loader), so ``ix-gpu mutate`` never pays for them. Flags follow the device plugin's where they mean
the same (``--config``, ``--backend``, ``--fake-devices``, ``--root``, ``--kubeconfig``); the
node name comes from ``NODE_NAME``, which a DaemonSet sets from the downward API.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ix_gpu.plugin.backends import BACKENDS  # light: no backend module is imported here
from ix_gpu.runtime.usage import UsageError, add_log_level, set_env_name

if TYPE_CHECKING:
    from ix_gpu.devicemodel.plugin_runtime import RuntimeConfig
    from ix_gpu.runtime.kube import ApiServer

DEFAULT_DRIVER = "gpu.iluvatar.com"
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_CDI_DIR = "/var/run/cdi"  # = ix_gpu.plugin.devices.cdi.DEFAULT_CDI_DIR
DEFAULT_CONFIG = "/ixconfig/ix-config"  # the device plugin's
PLUGIN_CONFIG_ENV = "IX_GPU_PLUGIN_CONFIG"  # the device plugin's --config variable: one ix-config
UNHEALTHY_MODES = ("taint", "remove")  # = ix_gpu.dra.devices.UNHEALTHY_MODES, without the import


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 3600, got {text}")
    return value


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    dra = subparsers.add_parser(
        "dra",
        help="run the DRA (Dynamic Resource Allocation) kubelet plugin",
        description=(
            "Serve the kubelet's DRA node service (v1.DRAPlugin) for Iluvatar or NVIDIA GPUs and publish "
            "this node's GPUs as a resource.k8s.io/v1 ResourceSlice: one device per chip "
            "(splitboard: true in the ix-config) or per board, with vendor, product, uuid, index, "
            "board, PCI bus ID, NUMA node and driver version attributes and memory capacity. "
            "Registers through <registry-dir>/<driver>-reg.sock; serves <plugins-dir>/<driver>/dra.sock. "
            "Prepare reads each claim's allocation from the API server and writes one CDI spec per "
            "claim into --cdi-dir; prepared claims are kept in --checkpoint across restarts. "
            "Needs the API server: get on resourceclaims; get, create and update on resourceslices; "
            "get on nodes."
        ),
    )
    dra.add_argument(
        "--driver-name",
        default=DEFAULT_DRIVER,
        metavar="NAME",
        help=f"DRA driver name: the DeviceClass selects it, the pool and CDI names carry it "
        f"(default {DEFAULT_DRIVER})",
    )
    node = dra.add_argument(
        "--node-name", metavar="NAME", help="this node's name, also the pool's name (required)"
    )
    set_env_name(node, "NODE_NAME")
    config = dra.add_argument(
        "--config",
        metavar="FILE",
        help=f"the ix-config file; only flags.splitboard and cdi.driverRoot apply here (default "
        f"{DEFAULT_CONFIG} when it exists, else built-in defaults)",
    )
    set_env_name(config, PLUGIN_CONFIG_ENV)
    dra.add_argument("--backend", choices=BACKENDS, default="auto", help="device discovery (default auto)")
    dra.add_argument("--fake-devices", metavar="FILE", help="YAML device description for --backend fake")
    dra.add_argument("--root", metavar="DIR", default="/", help="host root for /dev and /sys, default /")
    dra.add_argument(
        "--plugins-dir",
        metavar="DIR",
        default=DEFAULT_PLUGINS_DIR,
        help=f"the kubelet's plugins directory; the DRA socket is <DIR>/<driver>/dra.sock, a path the "
        f"kubelet must see the same (default {DEFAULT_PLUGINS_DIR})",
    )
    dra.add_argument(
        "--registry-dir",
        metavar="DIR",
        default=DEFAULT_REGISTRY_DIR,
        help=f"the kubelet's plugin-registration directory (default {DEFAULT_REGISTRY_DIR})",
    )
    dra.add_argument(
        "--cdi-dir",
        metavar="DIR",
        default=DEFAULT_CDI_DIR,
        help=f"CDI spec directory (default {DEFAULT_CDI_DIR})",
    )
    dra.add_argument(
        "--checkpoint",
        metavar="FILE",
        help="prepared claims, kept across restarts (default <plugins-dir>/<driver>/checkpoint.json)",
    )
    dra.add_argument(
        "--unhealthy",
        choices=UNHEALTHY_MODES,
        default="taint",
        help="an unhealthy device keeps its place with a NoSchedule device taint (resource.k8s.io/v1, "
        "DRADeviceTaints, on by default since 1.36), or leaves the slice (default taint)",
    )
    dra.add_argument(
        "--health-interval",
        type=_positive,
        default=5.0,
        metavar="SECONDS",
        help="how often devices are discovered and their health checked (default 5)",
    )
    dra.add_argument(
        "--kubeconfig", metavar="FILE", help="outside a Pod: token kubeconfig (default: in-cluster)"
    )
    add_log_level(dra)
    dra.set_defaults(handler=run_dra)


def _problem(kind: str, value: str, problems: list[str]) -> None:
    if problems:
        raise UsageError(f"{kind} {value!r}: {'; '.join(problems)}")


def run_dra(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from ix_gpu.config.k8s_names import dns1123_subdomain
    from ix_gpu.runtime import json_logging

    json_logging.configure(args.log_level)
    _problem("--driver-name", args.driver_name, dns1123_subdomain(args.driver_name))
    if not args.node_name:
        raise UsageError("--node-name (or NODE_NAME) is required: it names this node's pool")
    _problem("--node-name", args.node_name, dns1123_subdomain(args.node_name))
    if args.backend == "fake" and not args.fake_devices:
        raise UsageError("--backend fake needs --fake-devices FILE")
    if args.fake_devices and args.backend != "fake":
        raise UsageError("--fake-devices only applies to --backend fake")
    if args.fake_devices and not Path(args.fake_devices).is_file():
        raise UsageError(f"--fake-devices {args.fake_devices}: no such file")
    config = _load_config(args.config)
    api = _connect(args.kubeconfig)

    from ix_gpu.dra.app import DraApp, DraSettings
    from ix_gpu.plugin.backends import make_backend
    from ix_gpu.plugin.backends.base import BackendError

    plugins_dir = Path(args.plugins_dir)
    settings = DraSettings(
        driver=args.driver_name,
        node=args.node_name,
        plugins_dir=plugins_dir,
        registry_dir=Path(args.registry_dir),
        cdi_dir=Path(args.cdi_dir),
        checkpoint=Path(args.checkpoint or plugins_dir / args.driver_name / "checkpoint.json"),
        splitboard=config.splitboard,
        driver_root=config.cdi_driver_root,
        unhealthy=args.unhealthy,
        health_interval=args.health_interval,
    )
    if problems := settings.socket_problems():
        raise UsageError(problems[0])
    try:
        backend = make_backend(
            args.backend,
            fake_devices=Path(args.fake_devices) if args.fake_devices else None,
            root=Path(args.root),
        )
    except BackendError as exc:
        logging.getLogger("ix_gpu.dra").error("cannot start: backend %s: %s", args.backend, exc)
        return 1

    async def main() -> int:
        return await DraApp(settings, backend, api).run(handle_signals=True)

    return asyncio.run(main())


def _load_config(path_text: str | None) -> RuntimeConfig:
    """The ix-config's runtime form (validated in a child; see the device plugin's config loader)."""
    from ix_gpu.config.input_files import CONFIG_MAX_BYTES, ConfigError, read_capped
    from ix_gpu.plugin.server.config_loader import DEFAULTS_SOURCE, load_runtime_config

    path = Path(path_text or DEFAULT_CONFIG)
    try:
        if path_text is None and not path.exists():
            return load_runtime_config(None, DEFAULTS_SOURCE)
        if path.is_dir():
            raise UsageError(f"--config {path}: a directory of configs is not supported by ix-gpu dra yet")
        return load_runtime_config(read_capped(path, CONFIG_MAX_BYTES), str(path))
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _connect(kubeconfig: str | None) -> ApiServer:
    from ix_gpu.runtime.kube import ApiServer

    if kubeconfig is not None:
        try:
            return ApiServer.from_kubeconfig(kubeconfig)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    api = ApiServer.in_cluster()
    if api is None:
        raise UsageError("not in a cluster (no KUBERNETES_SERVICE_HOST or token); give --kubeconfig")
    return api
