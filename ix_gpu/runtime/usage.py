"""Command-line plumbing both processes share: usage errors, the one-line parser, argument types.

It lives below ``ix_gpu.cli`` (the dispatcher), ``webhook`` and ``plugin`` so that their
subcommands can raise :class:`UsageError` without importing the dispatcher that imports them.
Exit codes follow the Kubernetes tools' habit: 2 and one line for a usage error.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

LOG_LEVELS = ("debug", "info", "warning", "error")
"""The ``--log-level`` names of every ix-gpu process: lower case, as in the JSON ``level`` field."""


class UsageError(Exception):
    """Bad input from the person at the terminal: printed as one line, exit code 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus message; operators asked for one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def port_number(text: str) -> int:
    """argparse type for TCP ports; 0 is allowed (where a command says it disables the listener)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535, got {value}")
    return value


def add_log_level(parser: argparse.ArgumentParser, help_suffix: str = "") -> None:
    """The one ``--log-level`` option (JSON lines on stderr), with the same names in both processes."""
    parser.add_argument(
        "--log-level",
        default="info",
        choices=LOG_LEVELS,
        type=str.lower,
        help=f"JSON log level on stderr (default: info{help_suffix})",
    )
