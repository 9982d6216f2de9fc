"""``ix-gpu webhook`` wiring of self mode: its flags, their checks, and the start before serving.

Import-light on purpose: ``register``-time code (:func:`add_arguments`) must not import the
kubernetes client or cryptography.
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

from ix_gpu.config.text import one_line
from ix_gpu.webhook.certs.self_mode import ClusterApi, SelfCertManager, SelfCertSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``ix-gpu webhook`` flags of self mode (argparse only; nothing heavy is imported)."""
    group = parser.add_argument_group("self-managed certificates (the chart's certs.mode: self)")
    group.add_argument(
        "--self-certs-secret",
        metavar="NAMESPACE/NAME",
        help="create (if absent), renew and serve the CA and serving certificate kept in this Secret",
    )
    group.add_argument(
        "--webhook-configuration",
        metavar="NAME",
        help="MutatingWebhookConfiguration whose caBundle is kept in line (with --self-certs-secret)",
    )
    group.add_argument(
        "--service-dns",
        action="append",
        default=[],
        metavar="NAME",
        help="DNS SAN of the serving certificate, e.g. svc.namespace.svc (repeatable)",
    )
    group.add_argument(
        "--self-certs-validity-days",
        type=int,
        default=90,
        metavar="N",
        help="validity of the serving certificate; renewed with a third left (default 90)",
    )


def settings_from_args(args: argparse.Namespace) -> SelfCertSettings | None:
    """None without ``--self-certs-secret``; otherwise checked settings (UsageError when wrong)."""
    from ix_gpu.process.usage import UsageError

    if not args.self_certs_secret:
        if args.webhook_configuration or args.service_dns:
            raise UsageError("--webhook-configuration and --service-dns need --self-certs-secret")
        return None
    namespace, sep, name = args.self_certs_secret.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise UsageError(f"--self-certs-secret: expected NAMESPACE/NAME, got {args.self_certs_secret!r}")
    if not args.webhook_configuration:
        raise UsageError("--self-certs-secret needs --webhook-configuration")
    if not args.service_dns:
        raise UsageError("--self-certs-secret needs at least one --service-dns")
    if not 2 <= args.self_certs_validity_days <= 3650:
        raise UsageError("--self-certs-validity-days must be between 2 and 3650")
    return SelfCertSettings(
        namespace=namespace,
        secret_name=name,
        webhook_configuration=args.webhook_configuration,
        dns_names=tuple(args.service_dns),
        cert_dir=Path(args.cert_dir),
        validity=dt.timedelta(days=args.self_certs_validity_days),
    )


def start_from_args(args: argparse.Namespace, api: ClusterApi | None = None) -> SelfCertManager | None:
    """Run before the service starts: the cert dir then holds the Secret's certificate, the
    caBundle matches, and a daemon thread keeps both current. No-op without the flags."""
    from ix_gpu.process import json_logging
    from ix_gpu.process.usage import UsageError
    from ix_gpu.webhook.certs.self_mode_client import KubernetesClusterApi

    settings = settings_from_args(args)
    if settings is None:
        return None
    json_logging.configure(args.log_level)
    if api is None:
        try:
            api = KubernetesClusterApi.connect(args.kubeconfig)
        except Exception as exc:  # ConfigException, OSError, ...: one line for the operator
            where = args.kubeconfig or "the in-cluster service account"
            raise UsageError(f"self certificates: cannot use {where}: {one_line(exc)}") from None
    manager = SelfCertManager(settings, api)
    try:
        manager.ensure()
    except Exception as exc:
        reason = one_line(exc)
        raise UsageError(f"self certificates: {reason}") from None
    manager.start()
    return manager
