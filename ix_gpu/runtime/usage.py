"""Command-line plumbing both processes share: usage errors, the one-line parser, argument types.

It lives below ``ix_gpu.cli`` (the dispatcher), ``webhook`` and ``plugin`` so that their
subcommands can raise :class:`UsageError` without importing the dispatcher that imports them.
Exit codes follow the Kubernetes tools' habit: 2 and one line for a usage error.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import NoReturn

LOG_LEVELS = ("debug", "info", "warning", "error")
"""The ``--log-level`` names of every ix-gpu process: lower case, as in the JSON ``level`` field."""


class UsageError(Exception):
    """Bad input from the person at the terminal: printed as one line, exit code 2."""


ENV_PREFIX = "IX_GPU_"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def env_name(option: str) -> str:
    """The environment variable for a long option: ``--log-level`` → ``IX_GPU_LOG_LEVEL``."""
    return ENV_PREFIX + option.lstrip("-").upper().replace("-", "_")


class OneLineParser(argparse.ArgumentParser):
    """The parser of every ix-gpu command.

    - Errors are one line and exit code 2: argparse prints usage plus message, and operators asked
      for one line.
    - Every long option can also come from the environment, ``--metrics-port`` from
      ``IX_GPU_METRICS_PORT`` (a flag on the command line wins). Helm charts and DaemonSets set
      env more easily than they edit argument lists; NVIDIA's plugin does the same. A value from
      the environment is checked as the flag would be, and an error names the variable.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        for action in self._actions:
            name = _env_option(action)
            if name is not None and (raw := os.environ.get(env_name(name))) is not None:
                self._default_from_env(action, env_name(name), raw)
        return super().parse_known_args(args, namespace)

    def _default_from_env(self, action: argparse.Action, variable: str, raw: str) -> None:
        if action.nargs == 0:  # store_true / store_false
            lowered = raw.strip().lower()
            if lowered not in _TRUE + _FALSE:
                self.error(f"{variable}={raw!r}: expected one of {', '.join(_TRUE + _FALSE)}")
            flag = lowered in _TRUE
            action.default = flag if action.const is True else not flag
            return
        values = [raw] if not isinstance(action, argparse._AppendAction) else raw.split(",")
        try:
            converted = [self._get_value(action, value) for value in values]
        except argparse.ArgumentError as exc:
            self.error(f"{variable}={raw!r}: {exc.message}")
        for value in converted:
            if action.choices is not None and value not in action.choices:
                choices = ", ".join(map(str, action.choices))
                self.error(f"{variable}={raw!r}: invalid choice (choose from {choices})")
        action.default = converted if isinstance(action, argparse._AppendAction) else converted[0]
        action.required = False

    def format_help(self) -> str:
        for action in self._actions:
            name = _env_option(action)
            note = f"[env {env_name(name)}]" if name is not None else None
            if note is not None and action.help is not None and note not in action.help:
                action.help = f"{action.help} {note}"
        return super().format_help()


def _env_option(action: argparse.Action) -> str | None:
    """The long option an action may take from the environment (None: help, version, positionals)."""
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
        return None
    return next((o for o in action.option_strings if o.startswith("--")), None)


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
