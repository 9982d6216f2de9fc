"""Subcommands of the device plugin (``ix-gpu plugin``, ``ix-gpu devices``) — being built."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """No plugin subcommands yet."""
