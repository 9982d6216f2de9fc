"""Command-line plumbing both processes share: usage errors, the one-line parser, argument types.

It lives below ``ix_gpu.cli`` (the dispatcher), ``webhook`` and ``plugin`` so that their
subcommands can raise :class:`UsageError` without importing the dispatcher that imports them.
Exit codes follow the Kubernetes tools' habit: 2 and one line for a usage error.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence
from typing import NoReturn

LOG_LEVELS = ("debug", "info", "warning", "error")
"""The ``--log-level`` names of every ix-gpu process: lower case, as in the JSON ``level`` field."""


class UsageError(Exception):
    """Bad input from the person at the terminal: printed as one line, exit code 2."""


ENV_PREFIX = "IX_GPU_"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


_ENV_ATTRIBUTE = "ix_gpu_env"


def env_name(option: str) -> str:
    """The environment variable for a long option: ``--log-level`` → ``IX_GPU_LOG_LEVEL``."""
    return ENV_PREFIX + option.lstrip("-").upper().replace("-", "_")


def set_env_name(action: argparse.Action, variable: str) -> argparse.Action:
    """Give an option another variable than its name makes. Where two commands' options of one
    name mean different things (the webhook's ``--config`` and the plugin's), a variable exported
    for one must not reach the other."""
    setattr(action, _ENV_ATTRIBUTE, variable)
    return action


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
            variable = _env_variable(action)
            if variable is not None and (raw := os.environ.get(variable)) is not None:
                self._default_from_env(action, variable, raw)
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
            variable = _env_variable(action)
            note = f"[env {variable}]" if variable is not None else None
            if note is not None and action.help is not None and note not in action.help:
                action.help = f"{action.help} {note}"
        return super().format_help()


def _env_variable(action: argparse.Action) -> str | None:
    """The variable an action takes its value from (None: positionals, subcommands, and actions that
    only do something, such as --help and --version, whose default is SUPPRESS: IX_GPU_VERSION=0.1.0,
    set by a build or an image, is no request to print the version)."""
    if action.default is argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
        return None
    option = next((o for o in action.option_strings if o.startswith("--")), None)
    if option is None:
        return None
    variable: str = getattr(action, _ENV_ATTRIBUTE, None) or env_name(option)
    return variable


def _seconds(text: str, *, zero_allowed: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not ((value >= 0 if zero_allowed else value > 0) and value <= 3600):  # NaN fails both
        raise argparse.ArgumentTypeError(f"must be between 0 and 3600 seconds, got {text}")
    return value


def interval_seconds(text: str) -> float:
    """An interval flag: more than 0 and at most an hour."""
    return _seconds(text, zero_allowed=False)


def interval_seconds_or_off(text: str) -> float:
    """An interval flag where 0 turns the thing off."""
    return _seconds(text, zero_allowed=True)


def port_number(text: str) -> int:
    """argparse type for TCP ports; 0 is allowed (where a command says it disables the listener)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535, got {value}")
    return value


SOCKET_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}")
"""What ``--socket-id`` takes: a pod's UID fits, and nothing that could leave a socket's directory."""


def socket_id(text: str) -> str:
    """``--socket-id`` of both node agents: the part of a socket's name that makes it one
    instance's own, beside another instance's during a rolling update."""
    if not SOCKET_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be letters, digits and '-', up to 63, got {text[:80]!r}")
    return text


def listen_address(text: str) -> str:
    """argparse type for a listen address (``::``, ``0.0.0.0``, ``127.0.0.1``, ``fd00::5``, a name).
    Brackets are refused rather than stripped: ``[::]`` is URL syntax, and an operator who wrote it
    in a values file would otherwise get a name lookup error at start instead of this usage error."""
    if not text or text != text.strip() or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"expected an address such as :: or 0.0.0.0, got {text!r}")
    if text.startswith("[") or text.endswith("]"):
        raise argparse.ArgumentTypeError(f"write an IPv6 address without brackets (e.g. ::), got {text!r}")
    return text


def add_log_level(parser: argparse.ArgumentParser, help_suffix: str = "") -> None:
    """The one ``--log-level`` option (JSON lines on stderr), with the same names in both processes."""
    parser.add_argument(
        "--log-level",
        default="info",
        choices=LOG_LEVELS,
        type=str.lower,
        help=f"JSON log level on stderr (default: info{help_suffix})",
    )
