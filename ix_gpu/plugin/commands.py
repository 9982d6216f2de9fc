"""The one-shot plugin subcommands: ``ix-gpu devices`` (what the plugin would advertise),
``ix-gpu cdi generate`` (the CDI spec for it) and ``ix-gpu labels prune`` (remove its node labels).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ix_gpu.node.agent import (
    NOT_IN_CLUSTER,
    check_device_args,
    chosen_config,
    connect,
    load_config,
    start_backend,
    vendor_overrides,
)
from ix_gpu.process.usage import UsageError

if TYPE_CHECKING:
    from ix_gpu.config.plugin_runtime import RuntimeConfig
    from ix_gpu.node.backends.base import Backend
    from ix_gpu.node.devices.device_list import DeviceList


class Discovered(NamedTuple):
    config: RuntimeConfig
    backend: Backend
    resource: str
    devices: DeviceList


def _discover(args: argparse.Namespace, command: str) -> Discovered | None:
    """Config, backend and the device list the plugin would advertise; None after printing why
    not (the environment, not the command line: exit 1)."""
    from ix_gpu.node.backends.base import BackendError
    from ix_gpu.node.devices.device_list import build_device_list
    from ix_gpu.node.devices.sharing import plan_sharing

    config_dir = check_device_args(args)
    path = Path(args.config) if args.config else None
    if config_dir is not None:  # no node to read a label from: the default config
        path = chosen_config(config_dir, None, args.default_config)
    config = load_config(path, vendor_overrides(args)).config
    try:
        backend = start_backend(args)
    except BackendError as exc:
        print(f"ix-gpu {command}: backend {args.backend}: {exc}", file=sys.stderr)
        return None
    try:
        chips = backend.chips()
    except BackendError as exc:
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


def run_labels_prune(args: argparse.Namespace) -> int:
    from ix_gpu.node.node_labels import prune_node_labels

    api = connect(args.kubeconfig)
    if api is None:
        raise UsageError(NOT_IN_CLUSTER)
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
    from ix_gpu.plugin.offer.device_state import HEALTHY, UNHEALTHY

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
    from ix_gpu.node.devices.cdi import CdiError, cdi_spec, render, spec_path, write_spec

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
