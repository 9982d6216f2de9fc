"""Helpers shared by the device-plugin tests (imported as tests.plugin.plugin_testkit)."""

from __future__ import annotations

from pathlib import Path

FAST_HEALTH = "health:\n  intervalSeconds: 0.1\n  recoverAfter: 3\n"


def write_config(directory: Path, text: str) -> Path:
    """An ix-config file (tests prepend FAST_HEALTH for a 0.1 s health interval)."""
    path = directory / "ix-config"
    path.write_text(text)
    return path
