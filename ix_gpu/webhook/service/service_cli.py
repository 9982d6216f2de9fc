"""``ix-gpu webhook``: the HTTPS admission service.

Registration only declares arguments: FastAPI, uvicorn and the kubernetes client are imported by
the handler, so ``ix-gpu mutate`` and ``--help`` stay fast.
"""

from __future__ import annotations

import argparse
from typing import Any

from ix_gpu.process.usage import (
    UsageError,
    add_log_level,
    interval_seconds,
    interval_seconds_or_off,
    listen_address,
    port_number,
)
from ix_gpu.webhook.service.limit_settings import Limits


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def register_service(subparsers: argparse._SubParsersAction[Any]) -> None:
    webhook = subparsers.add_parser(
        "webhook",
        help="run the mutating admission webhook (HTTPS AdmissionReview v1 on /mutate)",
        description=(
            "Serve POST /mutate (AdmissionReview admission.k8s.io/v1), GET /healthz, /readyz and "
            "/metrics over HTTPS. Without tls.crt/tls.key in --cert-dir, development certificates for "
            "localhost and 127.0.0.1 are generated there (trust ca.crt). Certificate and config files "
            "are re-read when their content changes. Without --kubeconfig and outside a cluster, "
            "namespace annotations and labels are unknown (said at startup)."
        ),
    )
    _add_serving(webhook)
    _add_cluster(webhook)
    add_log_level(webhook, "; info logs one line per admission")
    _add_limits(webhook)
    from ix_gpu.webhook.certs.self_mode_cli import add_arguments as add_self_cert_arguments

    add_self_cert_arguments(webhook)
    webhook.set_defaults(handler=_run_webhook)


def _add_serving(webhook: argparse.ArgumentParser) -> None:
    """Where and how the webhook serves: files, addresses, timeouts, shutdown."""
    webhook.add_argument("--config", metavar="FILE", help="webhook config (default: the built-in one)")
    webhook.add_argument(
        "--cert-dir",
        default="certs",
        metavar="DIR",
        help="directory with tls.crt and tls.key (default: certs)",
    )
    webhook.add_argument(
        "--host",
        default="127.0.0.1",
        type=listen_address,
        metavar="ADDR",
        help="address to listen on: :: is every address of both IP families (0.0.0.0 where the kernel "
        "has no IPv6), as the chart sets it; any other address binds its family only (default: "
        "127.0.0.1, for a local run with the development certificates)",
    )
    webhook.add_argument(
        "--port", default=8443, type=port_number, metavar="N", help="port (default: 8443; 0 picks a free one)"
    )
    webhook.add_argument(
        "--probe-port",
        type=port_number,
        metavar="N",
        help="also serve /healthz and /readyz over plain HTTP on this port of --host, for the "
        "kubelet's probes; its connections are capped apart from the HTTPS port's (default: none; "
        "0 picks a free one)",
    )
    webhook.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig for the namespace and claim caches and self certificates: its user has a "
        "token, tokenFile or client certificate (default: in a Pod its service account, else none)",
    )
    webhook.add_argument(
        "--reload-interval",
        default=5.0,
        type=interval_seconds,
        metavar="SECONDS",
        help="how often cert and config files are checked for new content (default: 5)",
    )
    webhook.add_argument(
        "--request-timeout",
        default=10.0,
        type=interval_seconds,
        metavar="SECONDS",
        help="longest wait for a request body before answering 408 (default: 10)",
    )
    webhook.add_argument(
        "--shutdown-delay",
        default=5.0,
        type=interval_seconds_or_off,
        metavar="SECONDS",
        help="on SIGTERM, go on serving this long with /readyz failing and every answer closing its "
        "connection, so the apiserver moves to the other replicas before this one stops listening; "
        "then finish the reviews in flight and exit 0. 0, a second SIGTERM, or SIGINT: stop at once "
        "(default: 5)",
    )


def _add_cluster(webhook: argparse.ArgumentParser) -> None:
    """How the webhook reads the cluster: the namespace cache's staleness and lookups."""
    webhook.add_argument(
        "--cache-max-staleness",
        default=300.0,
        type=interval_seconds_or_off,
        metavar="SECONDS",
        help="/readyz fails while the namespace cache has heard nothing from the API server (no "
        "list, no watch event, no bookmark, which the API server sends once a minute on a quiet "
        "watch) for longer than this, so the apiserver stops sending reviews this replica would "
        "answer from an old picture; 0: never (default: 300)",
    )
    webhook.add_argument(
        "--namespace-lookup-budget",
        default=3.0,
        type=interval_seconds,
        metavar="SECONDS",
        help="a namespace not yet in the cache (created a moment ago) is read with a GET, tried "
        "again with backoff for this long; past it policy.namespaceLookupFailure decides. Keep it "
        "below the webhook registration's timeoutSeconds (chart: webhook.namespaceLookupBudgetSeconds) "
        "(default: 3)",
    )


def _add_limits(webhook: argparse.ArgumentParser) -> None:
    """What one client can make the webhook hold."""
    defaults = Limits()
    limits = webhook.add_argument_group(
        "limits", "what one client can make the webhook hold (connections, header and body bytes, CPU time)"
    )
    limits.add_argument(
        "--max-connections",
        type=_positive_int,
        default=defaults.max_connections,
        metavar="N",
        help="open connections at most; at the cap the connection idle longest is closed to make room "
        f"(each client address keeps its {defaults.keep_idle_per_address} most recently used), and a new "
        f"one is closed at once only when none is idle (default: {defaults.max_connections})",
    )
    limits.add_argument(
        "--max-connections-per-address",
        type=_positive_int,
        default=defaults.max_connections_per_address,
        metavar="N",
        help="open connections from one client address at most, with the same rule "
        f"(default: {defaults.max_connections_per_address})",
    )
    limits.add_argument(
        "--idle-timeout",
        type=interval_seconds,
        default=defaults.idle_timeout,
        metavar="SECONDS",
        help="a keep-alive connection idle this long is closed; keep it above the apiserver's own "
        "90 s, so that the apiserver keeps the connections it opened to the replicas for the next "
        f"burst (default: {defaults.idle_timeout:g})",
    )
    limits.add_argument(
        "--header-timeout",
        type=interval_seconds,
        default=defaults.header_timeout,
        metavar="SECONDS",
        help="request headers must arrive within this time, else the connection is closed "
        f"(default: {defaults.header_timeout:g})",
    )
    limits.add_argument(
        "--max-inflight-mib",
        type=_positive_int,
        default=defaults.max_inflight_body_bytes >> 20,
        metavar="MIB",
        help="request body bytes held across all connections; past it a review is answered 503 with "
        f"Retry-After before it is read (default: {defaults.max_inflight_body_bytes >> 20})",
    )
    limits.add_argument(
        "--request-budget",
        type=interval_seconds,
        default=defaults.request_budget,
        metavar="SECONDS",
        help=f"reviews over {defaults.offload_bytes >> 10} KiB are parsed and mutated in a child process, "
        "one at a time; one not answered within this budget (counted from its last body byte) "
        f"gets 503 with Retry-After and its child is killed (default: {defaults.request_budget:g})",
    )


def _run_webhook(args: argparse.Namespace) -> int:
    from ix_gpu.webhook.certs.self_mode_cli import start_from_args
    from ix_gpu.webhook.service.server import ServiceOptions, StartupError, run_service

    start_from_args(args)

    options = ServiceOptions(
        config_path=args.config,
        cert_dir=args.cert_dir,
        host=args.host,
        port=args.port,
        kubeconfig=args.kubeconfig,
        reload_interval=args.reload_interval,
        request_timeout=args.request_timeout,
        log_level=args.log_level,
        shutdown_delay=args.shutdown_delay,
        cache_max_staleness=args.cache_max_staleness or None,
        namespace_lookup_budget=args.namespace_lookup_budget,
        probe_port=args.probe_port,
        limits=Limits(
            max_connections=args.max_connections,
            max_connections_per_address=args.max_connections_per_address,
            idle_timeout=args.idle_timeout,
            header_timeout=args.header_timeout,
            max_inflight_body_bytes=args.max_inflight_mib << 20,
            request_budget=args.request_budget,
        ),
    )
    try:
        return run_service(options)
    except StartupError as exc:
        raise UsageError(str(exc)) from None
