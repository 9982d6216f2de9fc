"""``ix-gpu``: the single console script.

Each area registers its own subcommands (``ix_gpu.webhook.cli``, ``ix_gpu.plugin.cli``,
``ix_gpu.dra.cli``) so this module stays a dispatcher. Registration must stay import-light:
``ix-gpu mutate`` should not pay for FastAPI or gRPC, so handlers import their heavy dependencies
when they run.

Exit codes follow the Kubernetes tools' habit: 0 success, 1 the command ran and the answer is "no"
(e.g. an object was denied), 2 a usage error with a one-line message. Every long option can also be
set from the environment (``--log-level`` from ``IX_GPU_LOG_LEVEL``; see ``ix_gpu.process.usage``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ix_gpu.process.usage import OneLineParser, UsageError

_SUBCOMMAND_MODULES = ("ix_gpu.webhook.cli", "ix_gpu.plugin.cli", "ix_gpu.dra.cli", "ix_gpu.status.cli")

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="ix-gpu",
        description=(
            "GPUs made easy on Kubernetes. A mutating admission webhook injects the driver volumes, "
            "env, privileges and scheduling that a GPU workload needs; a device plugin advertises "
            "Iluvatar (iluvatar.com/gpu) and NVIDIA (nvidia.com/gpu) GPUs to the kubelet."
        ),
    )
    parser.add_argument("--version", action=_VersionAction)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    subparsers.required = True
    for module_name in _SUBCOMMAND_MODULES:
        module = importlib.import_module(module_name)
        module.register(subparsers)
    return parser


class _VersionAction(argparse.Action):
    """``--version``, looked up only when asked: importlib.metadata pulls in email, zipfile and csv,
    which every other command (the long-running plugin among them) would otherwise carry."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the version and exit"
        )

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"ix-gpu {_version()}")
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ix-gpu")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    from ix_gpu.kube.apiserver import identify

    identify(args.command)
    try:
        code = handler(args)
        sys.stdout.flush()  # here, so that a closed pipe shows up below and not at interpreter exit
        return code
    except UsageError as exc:
        print(f"ix-gpu {args.command}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _reader_gone()
    except KeyboardInterrupt:
        return 130


SIGPIPE_EXIT = 141
"""128 + SIGPIPE: how a shell reports ``cat`` ended by a reader that stopped (``| head -1``)."""


def _reader_gone() -> int:
    """End quietly when whoever read stdout stopped reading. Python ignores SIGPIPE, so the write
    raises instead; stdout then points at /dev/null, else the interpreter's own last flush of what
    is still buffered fails again and prints a traceback on the way out."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return SIGPIPE_EXIT
