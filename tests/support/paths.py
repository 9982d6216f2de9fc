from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
WEBHOOK_FIXTURES = ROOT / "tests" / "webhook" / "fixtures"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())
