"""``ix-gpu webhook``: the HTTPS admission service (being built)."""

from __future__ import annotations

import argparse
from typing import Any


def register_service(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Not registered yet: the service lands with the webhook-service issue."""
