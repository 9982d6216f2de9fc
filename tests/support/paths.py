"""Paths of the checkout under test, so no suite has to count ``parents[...]`` from its own file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FAKE_DEVICES = EXAMPLES / "fake-devices.yaml"
"""The fake backend's devices file: two boards of two chips (the seed's two GPUs)."""
WEBHOOK_FIXTURES = ROOT / "tests" / "webhook" / "fixtures"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())
