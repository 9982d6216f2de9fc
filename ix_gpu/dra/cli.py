"""``ix-gpu dra``: run the DRA kubelet plugin.

Registration imports nothing heavy (the handler imports grpclib, the backend and the config
loader), so ``ix-gpu mutate`` never pays for them. The flags the device plugin takes too
(``--config``, ``--default-config``, ``--backend``, ``--fake-devices``, ``--root``,
``--kubeconfig``) and the start-up both agents share (config, sharing plan, backend, API server)
are :mod:`ix_gpu.node.agent`'s; this module adds DRA's own. The node name comes from
``NODE_NAME``, which a DaemonSet sets from the downward API.

``--config DIR`` is the device plugin's directory of named configs: the node label
``ix-gpu.io/device-plugin.config`` picks one at start (:mod:`ix_gpu.node.node_config`).
Unlike the device plugin, ``ix-gpu dra`` does not switch configs while it runs: a new config can
rename every device of the pool (``splitboard``) under claims already allocated, so it applies on
the next start, and the app warns when the label comes to pick another config.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ix_gpu.node.agent import AgentKind, add_device_flags, add_kubeconfig_flag, check_device_args, start_node
from ix_gpu.process.usage import (
    UsageError,
    add_log_level,
    interval_seconds,
    listen_address,
    port_number,
    set_env_name,
    socket_id,
)

if TYPE_CHECKING:
    from ix_gpu.node.devices.sharing import SharingPlan

DEFAULT_DRIVER = "gpu.iluvatar.com"
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_CDI_DIR = "/var/run/cdi"  # = ix_gpu.node.devices.cdi.DEFAULT_CDI_DIR
DEFAULT_DRA_METRICS_PORT = 9402
"""Not the device plugin's 9401, so that one Service port name and number means one agent (both
run on a DRA node; either may run with the host's network)."""
UNHEALTHY_MODES = ("taint", "remove")  # = ix_gpu.dra.devices.UNHEALTHY_MODES, without the import


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    dra = subparsers.add_parser(
        "dra",
        help="run the DRA (Dynamic Resource Allocation) kubelet plugin",
        description=(
            "Serve the kubelet's DRA node service (v1.DRAPlugin) for Iluvatar or NVIDIA GPUs and publish "
            "this node's GPUs as a resource.k8s.io/v1 ResourceSlice pool: each multi-chip board as the "
            "whole board and each of its chips, with shared counters so no two overlap "
            "(--partitionable), else one device per chip (splitboard: true in the ix-config) or per "
            "board; with vendor, product, uuid, index, board, chips, wholeBoard, defaultForm, PCI bus "
            "ID, NUMA node and driver version attributes and memory capacity. "
            "Registers through <registry-dir>/<driver>-reg.sock; serves <plugins-dir>/<driver>/dra.sock "
            "(with --socket-id, names of the instance's own). "
            "Prepare reads each claim's allocation from the API server and writes one CDI spec per "
            "claim into --cdi-dir; prepared claims are kept in --checkpoint across restarts. "
            "Needs the API server: get on resourceclaims; get, create, update and delete on "
            "resourceslices; get, list and watch on nodes."
        ),
    )
    _add_identity_and_config(dra)
    _add_kubelet_paths(dra)
    _add_publishing(dra)
    _add_serving(dra)
    add_log_level(dra)
    dra.set_defaults(handler=run_dra)


def _add_identity_and_config(dra: argparse.ArgumentParser) -> None:
    """Who this driver is, on which node, from which config and devices."""
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
    add_device_flags(
        dra,
        config_applies="; only flags.splitboard, sharing.timeSlicing (memory shares per device: "
        "replicas, or NVIDIA's resources[] entry for this vendor's resource, as the device plugin "
        "reads them) and cdi.driverRoot apply here",
        picked=" at start; a later change of the label applies on restart",
    )


def _add_kubelet_paths(dra: argparse.ArgumentParser) -> None:
    """Where the kubelet and the container runtime meet the driver on the host."""
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
        "--socket-id",
        type=socket_id,
        metavar="ID",
        help="make this instance's sockets its own, <driver>-<ID>-reg.sock and dra-<ID>.sock (the chart "
        "gives the pod's UID), so that a new instance serves beside the old one during a rolling update; "
        "needs a kubelet of Kubernetes 1.33 or newer. Default none: <driver>-reg.sock and dra.sock",
    )
    dra.add_argument(
        "--cdi-dir",
        metavar="DIR",
        default=DEFAULT_CDI_DIR,
        help=f"CDI spec directory (default {DEFAULT_CDI_DIR})",
    )
    dra.add_argument(
        "--driver-root",
        metavar="DIR",
        help="the host's driver directory, which each claim's CDI spec mounts (default: the ix-config's "
        "cdi.driverRoot, else the vendor's, e.g. /usr/local/corex)",
    )
    dra.add_argument(
        "--checkpoint",
        metavar="FILE",
        help="prepared claims, kept across restarts (default <plugins-dir>/<driver>/checkpoint.json)",
    )


def _add_publishing(dra: argparse.ArgumentParser) -> None:
    """What the ResourceSlice holds, and how often it is brought up to date."""
    dra.add_argument(
        "--unhealthy",
        choices=UNHEALTHY_MODES,
        default="taint",
        help="an unhealthy device keeps its place with a NoSchedule device taint (resource.k8s.io/v1, "
        "DRADeviceTaints, on by default since 1.36), or leaves the slice (default taint)",
    )
    dra.add_argument(
        "--partitionable",
        choices=("auto", "with-shares", "off"),
        default="auto",
        help="auto: publish each multi-chip board as the whole board and each of its chips, with shared "
        "counters so that no two overlap, and let each claim pick (DRAPartitionableDevices, on by default "
        "since 1.36; where the API server drops the counters, the plain layout), except where "
        "sharing.timeSlicing.replicas shares the devices; with-shares: there too, every board and chip "
        "shared (needs the kube-scheduler of Kubernetes 1.37 or later: an older one may give a board's "
        "share and one of its chips' shares together); off: only the form splitboard picks (default auto)",
    )
    dra.add_argument(
        "--health-interval",
        type=interval_seconds,
        default=5.0,
        metavar="SECONDS",
        help="how often devices are discovered and their health checked (default 5)",
    )


def _add_serving(dra: argparse.ArgumentParser) -> None:
    """The driver's own endpoint and its way to the API server."""
    dra.add_argument(
        "--metrics-port",
        type=port_number,
        default=DEFAULT_DRA_METRICS_PORT,
        metavar="N",
        help=f"port for /healthz and /metrics: claims prepared and their time, registration, devices by "
        f"health, API failures (default {DEFAULT_DRA_METRICS_PORT}; 0 disables). Per-chip telemetry is "
        "the device plugin's, which runs on DRA nodes too",
    )
    dra.add_argument(
        "--metrics-host",
        default="::",
        type=listen_address,
        metavar="ADDRESS",
        help="address /healthz and /metrics listen on (default ::, every address of both IP families, "
        "or 0.0.0.0 where the kernel has no IPv6; an address such as 0.0.0.0 binds its family only)",
    )
    add_kubeconfig_flag(dra, "outside a Pod")


def _problem(kind: str, value: str, problems: list[str]) -> None:
    if problems:
        raise UsageError(f"{kind} {value!r}: {'; '.join(problems)}")


def _checked_args(args: argparse.Namespace) -> None:
    """DRA's own usage errors (exit 2 with one line) before anything starts; the device flags'
    are :func:`ix_gpu.node.agent.check_device_args`'."""
    from ix_gpu.config.k8s_names import absolute_path, dns1123_subdomain

    _problem("--driver-name", args.driver_name, dns1123_subdomain(args.driver_name))
    if not args.node_name:
        raise UsageError("--node-name (or NODE_NAME) is required: it names this node's pool")
    _problem("--node-name", args.node_name, dns1123_subdomain(args.node_name))
    # The spec's hostPaths are read by the container runtime, relative to nothing we know.
    if args.driver_root is not None:
        _problem("--driver-root", args.driver_root, absolute_path(args.driver_root))
    check_device_args(args)


def run_dra(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from ix_gpu.process import json_logging

    json_logging.configure(args.log_level)
    _checked_args(args)
    started = start_node(args, AgentKind("dra", args.node_name, api_required=True), _import_server)
    if started is None:
        return 1
    config, backend, api = started.loaded.config, started.backend, started.api
    assert api is not None  # api_required
    replicas = _dra_replicas(started.sharing)
    if started.loaded.path is not None:
        logging.getLogger("ix_gpu.dra").info(
            "config %s: splitboard=%s replicas=%d",
            started.loaded.path,
            "true" if config.splitboard else "false",
            replicas,
        )
    from ix_gpu.dra.app import DraApp, DraSettings

    plugins_dir = Path(args.plugins_dir)
    settings = DraSettings(
        driver=args.driver_name,
        node=args.node_name,
        plugins_dir=plugins_dir,
        registry_dir=Path(args.registry_dir),
        cdi_dir=Path(args.cdi_dir),
        checkpoint=Path(args.checkpoint or plugins_dir / args.driver_name / "checkpoint.json"),
        splitboard=config.splitboard,
        replicas=replicas,
        driver_root=args.driver_root or config.cdi_driver_root,
        unhealthy=args.unhealthy,
        partitionable=args.partitionable != "off",
        partitionable_shares=args.partitionable == "with-shares",
        health_interval=args.health_interval,
        config_dir=started.config_dir,
        default_config=args.default_config,
        config_label=started.label,
        metrics_port=args.metrics_port or None,
        metrics_host=args.metrics_host,
        reset_timeout=config.reset_timeout_seconds if config.reset_gpu else None,
        socket_id=args.socket_id,
    )
    if problems := settings.socket_problems():
        backend.close()
        raise UsageError(problems[0])

    async def main() -> int:
        return await DraApp(settings, backend, api, node_reader=started.node_reader).run(handle_signals=True)

    return asyncio.run(main())


def _import_server() -> None:
    """Imported while the child validates the config: the serving side's import time overlaps it."""
    import ix_gpu.dra.app  # noqa: F401


def _dra_replicas(plan: SharingPlan) -> int:
    """Memory shares per device, from the sharing plan the device plugin reads too
    (:func:`ix_gpu.node.devices.sharing.plan_sharing`): the Iluvatar form's
    ``sharing.timeSlicing.replicas``, or the NVIDIA form's entry for this vendor's resource, so
    one ConfigMap shares a node's GPUs alike whichever agent serves them. A DRA device is shared
    in full or not at all, so an entry that selects some devices shares none, and says so; a
    rename means nothing to DRA (claims name DeviceClasses, not resources)."""
    import logging

    log = logging.getLogger("ix_gpu.dra")
    if plan.shared and plan.devices != "all":
        log.warning(
            "config: %s shares only some devices, which DRA cannot: every device is published unshared",
            plan.key,
        )
        return 1
    return plan.replicas
