"""The ``status`` subcommand."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ix_gpu.runtime.usage import UsageError

DEFAULT_RESOURCE = "iluvatar.com/gpu"
DEFAULT_DRIVER = "gpu.iluvatar.com"


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    status = subparsers.add_parser(
        "status",
        help="the cluster's GPUs: nodes, chips, health, who holds each, what is free",
        description=(
            "Show the cluster's GPU nodes (device plugin, DRA or mixed), each with its GPUs in use and "
            "free, its chips (board, product, health) and the pod or claim holding each. Read with your "
            "kubeconfig: nodes, pods, ResourceSlices and ResourceClaims, and each device plugin's /metrics "
            "through the API server's pod proxy (needs get on pods/proxy in the chart's namespace; "
            "--no-chips skips it). Exit 0, or 1 when the API server cannot be read."
        ),
    )
    status.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="text tables or JSON (default text)"
    )
    status.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="default: $KUBECONFIG, then ~/.kube/config, then in-cluster (exec plugins work)",
    )
    status.add_argument(
        "--resource",
        default=DEFAULT_RESOURCE,
        help=f"the device plugin's resource (default {DEFAULT_RESOURCE})",
    )
    status.add_argument(
        "--driver", default=DEFAULT_DRIVER, help=f"the DRA driver's name (default {DEFAULT_DRIVER})"
    )
    status.add_argument(
        "--no-chips",
        action="store_true",
        help="counts only: do not read the device plugins' /metrics (chips, health, holders)",
    )
    status.set_defaults(handler=run_status)


def run_status(args: argparse.Namespace) -> int:
    import json
    import logging
    import sys

    from ix_gpu.runtime.kube import user_api_server
    from ix_gpu.status.read import read_cluster
    from ix_gpu.status.view import cluster_status, render_text

    logging.basicConfig(level=logging.WARNING, format="ix-gpu status: %(message)s")
    if args.kubeconfig is not None and not Path(args.kubeconfig).is_file():
        raise UsageError(f"--kubeconfig {args.kubeconfig}: no such file")
    try:
        api = user_api_server(args.kubeconfig)
    except ValueError as exc:
        raise UsageError(f"--kubeconfig: {exc}") from None
    try:
        found = read_cluster(api, chips=not args.no_chips)
    except OSError as exc:
        print(f"ix-gpu status: cannot read the cluster at {api.base_url}: {exc}", file=sys.stderr)
        return 1
    status = cluster_status(resource=args.resource, driver=args.driver, **found)
    if args.output == "json":
        print(json.dumps(status.as_json(), indent=2))
    else:
        sys.stdout.write(render_text(status))
    return 0
