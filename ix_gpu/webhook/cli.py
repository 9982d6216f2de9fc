"""Webhook-side subcommands: ``mutate``, ``config``, ``check-injection``, ``certs`` (and the service,
``webhook``).

Registration only declares arguments; each handler imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ix_gpu.process.usage import UsageError


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """The webhook's commands, in the order ``ix-gpu --help`` lists them."""
    from ix_gpu.webhook.service.service_cli import register_service

    for add in (register_service, _add_mutate, _add_config, _add_check_injection, _add_certs):
        add(subparsers)


def _add_mutate(subparsers: argparse._SubParsersAction[Any]) -> None:
    mutate = subparsers.add_parser(
        "mutate",
        help="preview what the webhook would inject into Pods/TFJobs (YAML or JSON in, YAML out)",
        description=(
            "Run the webhook's mutation on local manifests. Reads one or more YAML/JSON documents, "
            "prints them mutated (or, with --patch, one JSON patch per document). The items of a List "
            "(kubectl get -o yaml) are mutated as the objects they are, with one patch each. Warnings go to "
            "stderr. Exit 0 on success, 1 when an object is denied (an internal error included, as the "
            "webhook denies then too), 2 on unreadable input or config: not YAML/JSON, a duplicate key, "
            "over 16 MiB, nested over 100 levels, or aliases expanding past 100,000 nodes."
        ),
    )
    mutate.add_argument(
        "-f", "--filename", required=True, metavar="FILE", help="manifest file, or - for stdin"
    )
    mutate.add_argument("--config", metavar="FILE", help="webhook config (default: the built-in one)")
    mutate.add_argument(
        "--namespace",
        metavar="NAME",
        help="namespace to assume (default: each object's metadata.namespace, else 'default')",
    )
    mutate.add_argument(
        "--namespace-annotation",
        action="append",
        default=[],
        type=_key_value,
        metavar="KEY=VALUE",
        help="an annotation of the namespace (repeatable), e.g. ix-gpu.io/inject=disabled",
    )
    mutate.add_argument(
        "--namespace-label",
        action="append",
        default=[],
        type=_key_value,
        metavar="KEY=VALUE",
        help="a label of the namespace (repeatable), e.g. pod-security.kubernetes.io/enforce=baseline",
    )
    mutate.add_argument(
        "--claim-template",
        action="append",
        default=[],
        metavar="FILE",
        help="ResourceClaimTemplate or ResourceClaim manifests (repeatable) that DRA pods reference: "
        "they stand in for the cluster's, whose device classes the webhook watches. Without a "
        "namespace they match in any. A claim not given is unknown (policy.claimLookupFailure)",
    )
    mutate.add_argument("--patch", action="store_true", help="print JSON patches instead of objects")
    mutate.add_argument(
        "-v", "--verbose", action="store_true", help="say on stderr what happened to each object"
    )
    mutate.set_defaults(handler=_run_mutate)


def _add_config(subparsers: argparse._SubParsersAction[Any]) -> None:
    config = subparsers.add_parser("config", help="validate or print the webhook configuration or its schema")
    config_sub = config.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    config_sub.required = True
    validate = config_sub.add_parser(
        "validate",
        help="check a config file; errors name the field",
        description=(
            "Check a webhook config file. Exit 0 when valid, 1 when it is YAML but not a valid config "
            "(the field is named), 2 when it cannot be read as YAML: missing, not text, bad syntax, a "
            "duplicate key, over 1 MiB, nested over 100 levels, or aliases expanding past 100,000 nodes."
        ),
    )
    validate.add_argument("file", metavar="FILE")
    validate.set_defaults(handler=_run_config_validate)
    default = config_sub.add_parser("default", help="print the built-in default config (a starting point)")
    default.set_defaults(handler=_run_config_default)
    schema = config_sub.add_parser(
        "schema",
        help="print the config's JSON Schema (draft-07), generated from the config models",
        description=(
            "Print the JSON Schema of webhook config files, generated from the models the webhook "
            "loads them with, for editors and for the Helm chart's values.schema.json (which embeds "
            "it under `config`). Checks that are code (DNS labels, absolute paths, unique names) are "
            "left to `ix-gpu config validate`."
        ),
    )
    schema.set_defaults(handler=_run_config_schema)


def _add_check_injection(subparsers: argparse._SubParsersAction[Any]) -> None:
    check = subparsers.add_parser(
        "check-injection",
        help="dry-run a GPU pod through the apiserver and check that the webhook injected it",
        description=(
            "Ask the apiserver to create a one-GPU pod with dryRun=All (nothing is stored) and check "
            "that it comes back with the ix-gpu.io/injected annotation: proof that the webhook is "
            "registered, reachable and mutating. The chart's `helm test` runs it. Exit 0 when "
            "injected, 1 when not (or when the apiserver refused), 2 on a usage error."
        ),
    )
    check.add_argument(
        "--namespace", default="default", metavar="NAME", help="where to dry-run (default: default)"
    )
    check.add_argument(
        "--resource",
        default="iluvatar.com/gpu",
        metavar="NAME",
        help="the GPU resource to ask for (default: iluvatar.com/gpu)",
    )
    check.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster)")
    check.add_argument(
        "--timeout", type=float, default=30.0, metavar="SECONDS", help="request timeout (default: 30)"
    )
    check.set_defaults(handler=_run_check_injection)


def _add_certs(subparsers: argparse._SubParsersAction[Any]) -> None:
    certs = subparsers.add_parser("certs", help="TLS material for the webhook")
    certs_sub = certs.add_subparsers(dest="certs_command", metavar="SUBCOMMAND")
    certs_sub.required = True
    generate = certs_sub.add_parser(
        "generate",
        help="write a CA and a serving cert/key (ca.crt, ca.key, tls.crt, tls.key)",
        description=(
            "Generate a private CA and an ECDSA P-256 serving certificate signed by it, for local runs "
            "and for the chart's 'provided' certificate mode. Without --dns/--ip the certificate is "
            "for localhost and 127.0.0.1."
        ),
    )
    generate.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    generate.add_argument("--dns", action="append", default=[], metavar="NAME", help="DNS SAN (repeatable)")
    generate.add_argument("--ip", action="append", default=[], metavar="ADDR", help="IP SAN (repeatable)")
    generate.add_argument("--days", type=int, default=365, metavar="N", help="validity of the serving cert")
    generate.set_defaults(handler=_run_certs_generate)


def _run_check_injection(args: argparse.Namespace) -> int:
    from ix_gpu.webhook.injection_check import CheckOptions, run_check

    return run_check(CheckOptions(args.namespace, args.resource, args.kubeconfig, args.timeout))


def _run_mutate(args: argparse.Namespace) -> int:
    from ix_gpu.webhook.mutate_command import MutateOptions, run_mutate

    options = MutateOptions(
        filename=args.filename,
        config_path=args.config,
        namespace=args.namespace,
        namespace_annotations=dict(args.namespace_annotation),
        namespace_labels=dict(args.namespace_label),
        claim_files=tuple(args.claim_template),
        patch_only=args.patch,
        verbose=args.verbose,
    )
    return run_mutate(options, sys.stdin, sys.stdout, sys.stderr)


def _run_config_validate(args: argparse.Namespace) -> int:
    from ix_gpu.config.input_files import ConfigError, YamlInputError
    from ix_gpu.config.webhook_config import load_config

    try:
        config = load_config(args.file)
    except YamlInputError as exc:  # not even YAML: a usage error, like any unreadable input
        raise UsageError(str(exc)) from None
    except ConfigError as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return 1
    print(
        f"{args.file}: valid ({len(config.profiles)} profiles, {len(config.workloads)} workloads, "
        f"digest {config.digest()})"
    )
    return 0


def _run_config_default(args: argparse.Namespace) -> int:
    from ix_gpu.config.webhook_config import default_config

    sys.stdout.write(default_config().to_yaml())
    return 0


def _run_config_schema(args: argparse.Namespace) -> int:
    import json

    from ix_gpu.config.webhook_config import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")
    return 0


def _run_certs_generate(args: argparse.Namespace) -> int:
    import ipaddress

    from ix_gpu.webhook.certs.authority import generate_bundle, write_bundle

    for ip in args.ip:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise UsageError(f"--ip {ip!r} is not an IP address") from None
    if args.days < 1:
        raise UsageError("--days must be at least 1")
    dns, ips = args.dns, args.ip
    if not dns and not ips:
        dns, ips = ["localhost"], ["127.0.0.1"]
    try:
        written = write_bundle(generate_bundle(dns, ips, args.days), args.out)
    except OSError as exc:
        raise UsageError(f"cannot write to {args.out}: {exc.strerror or exc}") from None
    for path in written.values():
        print(path)
    return 0
