"""The ``status`` subcommand."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ix_gpu.process.usage import UsageError, interval_seconds, set_env_name
from ix_gpu.status import DEFAULT_DRIVER, DEFAULT_NAMESPACE, DEFAULT_RESOURCE, DEFAULT_SELECTOR

if TYPE_CHECKING:
    from ix_gpu.status.read import Deadline


DEFAULT_TIMEOUT = 60.0


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    status = subparsers.add_parser(
        "status",
        help="the cluster's GPUs: nodes, chips, health, who holds each, what is free",
        description=(
            "Show the cluster's GPU nodes (device plugin, DRA or mixed), each with its GPUs in use and "
            "free, its chips (board, product, health) and the pod or claim holding each. Read with your "
            "kubeconfig: nodes, pods, ResourceSlices and ResourceClaims, and each device plugin's /metrics "
            "through the API server's pod proxy (needs get on pods/proxy in the chart's namespace; "
            "--no-chips skips it). Only the pods of --namespace that match --selector are read as "
            "device plugins: a pod elsewhere with the same labels is not believed; nor is one there "
            "unless a DaemonSet of the namespace with those labels controls it (by UID) and a "
            "ClusterRoleBinding with those labels binds its ServiceAccount (needs list on daemonsets "
            "and clusterrolebindings); any other is reported. Exit 0; 1, with one line on stderr, "
            "when the API server cannot be read or the read outlasts --timeout; 2 on a usage error."
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
    namespace = status.add_argument(
        "-n",
        "--namespace",
        default=DEFAULT_NAMESPACE,
        metavar="NAME",
        help=(
            f"the chart's namespace: the device-plugin pods are looked for there, and only there "
            f"(default {DEFAULT_NAMESPACE}, as the README installs it)"
        ),
    )
    selector = status.add_argument(
        "-l",
        "--selector",
        default=DEFAULT_SELECTOR,
        metavar="LABELS",
        help=(
            "the device-plugin pods' labels, as kubectl's -l takes them (default: the chart's, "
            f"{DEFAULT_SELECTOR}; with two releases in the namespace, add "
            "app.kubernetes.io/instance=RELEASE, and with the chart's nameOverride, change "
            "app.kubernetes.io/name)"
        ),
    )
    timeout = status.add_argument(
        "--timeout",
        type=interval_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=(
            f"give up after this long, all reads together (default {DEFAULT_TIMEOUT:g}): each request "
            "waits at most the time left"
        ),
    )
    # Not IX_GPU_NAMESPACE / IX_GPU_TIMEOUT: check-injection's and mutate's options of those names
    # mean something else, and a variable exported for one must not reach the other.
    set_env_name(namespace, "IX_GPU_STATUS_NAMESPACE")
    set_env_name(selector, "IX_GPU_STATUS_SELECTOR")
    set_env_name(timeout, "IX_GPU_STATUS_TIMEOUT")
    status.set_defaults(handler=run_status)


def run_status(args: argparse.Namespace) -> int:
    import json
    import logging
    import sys

    from ix_gpu.kube.apiserver import user_api_server
    from ix_gpu.status.read import Deadline, read_cluster, within
    from ix_gpu.status.view import cluster_status, render_text

    logging.basicConfig(level=logging.WARNING, format="ix-gpu status: %(message)s")
    if args.kubeconfig is not None and not Path(args.kubeconfig).is_file():
        raise UsageError(f"--kubeconfig {args.kubeconfig}: no such file")
    if not args.namespace.strip() or not args.selector.strip():
        raise UsageError("--namespace and --selector must not be empty (every pod would be a device plugin)")
    # The deadline starts here: an exec credential plugin (a cloud's login) is part of the read.
    deadline = Deadline(args.timeout)
    deadline.doing = "loading the kubeconfig"
    try:
        api = within(deadline, lambda: user_api_server(args.kubeconfig))
    except ValueError as exc:  # the loader's reason
        raise UsageError(f"--kubeconfig: {exc}") from None
    except Exception as exc:
        return _failed(exc, deadline, "the kubeconfig's cluster")
    try:
        found = within(
            deadline,
            lambda: read_cluster(
                api,
                resource=args.resource,
                driver=args.driver,
                chips=not args.no_chips,
                namespace=args.namespace,
                selector=args.selector,
                deadline=deadline,
            ),
        )
        status = cluster_status(resource=args.resource, driver=args.driver, **found)
    except Exception as exc:
        return _failed(exc, deadline, f"the cluster at {api.base_url}")
    if args.output == "json":
        print(json.dumps(status.as_json(), indent=2))
    else:
        sys.stdout.write(render_text(status))
    return 0


def _failed(exc: Exception, deadline: Deadline, where: str) -> int:
    """One line on stderr and exit 1, whatever broke: an operator gets no traceback. An error that
    came from running out of time (a socket timeout cut to the time left) says so."""
    import sys

    from ix_gpu.status.read import DeadlineExceeded, error_text

    if isinstance(exc, DeadlineExceeded):
        message = str(exc)
    elif deadline.passed():
        message = str(deadline.exceeded())
    else:
        message = f"cannot read {where}: {error_text(exc)}"
    print(f"ix-gpu status: {message}", file=sys.stderr)
    return 1
