"""The flags of ``ix-gpu plugin`` (run the device plugin), ``ix-gpu devices`` (show what it would
advertise), ``ix-gpu cdi generate`` (write the CDI spec for it) and ``ix-gpu labels prune``.

The handlers are :mod:`ix_gpu.plugin.startup` (the serving process) and :mod:`ix_gpu.plugin.commands`
(the one-shot subcommands). Registration imports nothing heavy: grpclib, pydantic models and
backends are imported by the handlers, so ``ix-gpu mutate`` never pays for them; and the plugin
imports only the backend it runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from ix_gpu.node.agent import add_device_flags, add_kubeconfig_flag
from ix_gpu.process.usage import (
    add_log_level,
    interval_seconds_or_off,
    listen_address,
    port_number,
    set_env_name,
    socket_id,
)

DEFAULT_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_METRICS_PORT = 9401


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """The device plugin's commands, in the order ``ix-gpu --help`` lists them. Each handler is
    imported where its command is added, not at the top: the handlers' modules read this
    module's defaults."""
    for add in (_add_plugin, _add_devices, _add_cdi, _add_labels):
        add(subparsers)


def _add_plugin(subparsers: argparse._SubParsersAction[Any]) -> None:
    from ix_gpu.plugin.startup import run_plugin

    plugin = subparsers.add_parser(
        "plugin",
        help="run the kubelet device plugin",
        description="Serve the kubelet device-plugin API (v1beta1) for Iluvatar or NVIDIA GPUs.",
    )
    add_device_flags(plugin)
    plugin.add_argument(
        "--device-plugin-dir",
        metavar="DIR",
        default=DEFAULT_DEVICE_PLUGIN_DIR,
        help=f"kubelet device-plugin directory (default {DEFAULT_DEVICE_PLUGIN_DIR})",
    )
    plugin.add_argument(
        "--socket-id",
        type=socket_id,
        metavar="ID",
        help="make the plugin's socket its own, <resource>-<ID>.sock (the chart gives the pod's UID), so "
        "that a new instance can serve and register beside the old one during a rolling update; default "
        "none: the vendor plugin's name, iluvatar-gpu.sock",
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
        default="::",
        type=listen_address,
        metavar="ADDRESS",
        help="address /healthz and /metrics listen on (default ::, every address of both IP families, "
        "or 0.0.0.0 where the kernel has no IPv6; an address such as 0.0.0.0 binds its family only, "
        "e.g. the pod IP from the downward API where pods share a network namespace)",
    )
    plugin.add_argument(
        "--telemetry-interval",
        type=interval_seconds_or_off,
        default=10.0,
        metavar="SECONDS",
        help="per-chip figures on /metrics (utilization, memory, temperature, power, clocks, ECC counts, "
        "health bits) are read this often, in a thread of their own, with the kubelet's PodResources; "
        "a scrape is answered from the last read and never waits on the library (default 10; 0 disables)",
    )
    plugin.add_argument(
        "--pod-resources-socket",
        metavar="PATH",
        default="/var/lib/kubelet/pod-resources/kubelet.sock",
        help="the kubelet's PodResources API, read with the telemetry to label each chip with the "
        "containers holding it (device plugin and DRA); '' disables (default "
        "/var/lib/kubelet/pod-resources/kubelet.sock)",
    )
    add_kubeconfig_flag(plugin, "for node labels and per-node configs outside a Pod")
    dra_driver = plugin.add_argument(
        "--dra-driver",
        metavar="NAME",
        help="the DRA driver that may hand out this cluster's GPUs (ix-gpu dra's gpu.iluvatar.com): "
        "advertise devices only while this node is not labelled ix-gpu.io/gpu.allocation=dra and no "
        "ResourceSlice of NAME for it lists a device, and none while that cannot be read. Needs "
        "NODE_NAME and list and watch on nodes and resourceslices. Without it, a node labelled dra still "
        "gets no devices when the node can be read (--config DIR)",
    )
    set_env_name(dra_driver, "IX_GPU_DRA_DRIVER")
    add_log_level(plugin)
    plugin.set_defaults(handler=run_plugin)


def _add_devices(subparsers: argparse._SubParsersAction[Any]) -> None:
    from ix_gpu.plugin.commands import run_devices

    devices = subparsers.add_parser(
        "devices",
        help="list the GPU devices the plugin would advertise",
        description="Discover GPUs and print the devices the plugin would advertise, with their chips.",
    )
    add_device_flags(devices)
    devices.set_defaults(handler=run_devices)


def _add_cdi(subparsers: argparse._SubParsersAction[Any]) -> None:
    from ix_gpu.plugin.commands import run_cdi_generate

    cdi = subparsers.add_parser("cdi", help="Container Device Interface specs for the advertised devices")
    cdi_sub = cdi.add_subparsers(dest="cdi_command", metavar="SUBCOMMAND")
    cdi_sub.required = True
    generate = cdi_sub.add_parser(
        "generate",
        help="write the CDI spec for the devices the plugin would advertise",
        description=(
            "Discover GPUs and write the CDI spec (kind iluvatar.com/gpu or nvidia.com/gpu): one CDI "
            "device per advertised device, replicas included, each with its chips' device nodes; "
            "shared edits: the control nodes, the driver root mounted read-only and a createContainer "
            "hook that adds its library directory to the container's linker cache; no environment "
            "variable, which would replace the image's and the pod's (no driver edits for NVIDIA, "
            "whose toolkit provides the driver). Written atomically to "
            "<cdi.specDir>/<vendor>-<class>.json (default /var/run/cdi); unchanged content is not "
            "rewritten. The plugin writes the same spec itself with deviceListStrategy: cdi."
        ),
    )
    add_device_flags(generate)
    generate.add_argument(
        "--output", metavar="FILE", help="write here instead (- for stdout) (default: in cdi.specDir)"
    )
    generate.add_argument(
        "--driver-root",
        metavar="DIR",
        help="host driver directory to mount (default: cdi.driverRoot, else the vendor's)",
    )
    generate.set_defaults(handler=run_cdi_generate)


def _add_labels(subparsers: argparse._SubParsersAction[Any]) -> None:
    from ix_gpu.plugin.commands import run_labels_prune

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
    add_kubeconfig_flag(prune, "outside a Pod")
    prune.add_argument("--dry-run", action="store_true", help="only print what would be removed")
    add_log_level(prune)
    prune.set_defaults(handler=run_labels_prune)
