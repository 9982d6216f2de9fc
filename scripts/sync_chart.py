"""Regenerate what charts/ix-gpu takes from the core, so the chart never holds a second copy:

- ``values.schema.json``, property ``config``: ``ix-gpu config schema`` (the JSON Schema of the
  webhook config models);
- ``values.yaml``, the block under ``config:`` between its BEGIN and END lines: ``ix-gpu config
  default``.

    .venv/bin/python scripts/sync_chart.py           # rewrite both files
    .venv/bin/python scripts/sync_chart.py --check   # exit 1, naming what is stale (tests/chart)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from ix_gpu.config.webhook_config import default_config, json_schema

CHART = Path(__file__).resolve().parent.parent / "charts" / "ix-gpu"
SCHEMA = CHART / "values.schema.json"
VALUES = CHART / "values.yaml"
BEGIN, END = "  # BEGIN generated", "  # END generated"


def schema_text(current: str) -> str:
    schema = json.loads(current)
    schema["properties"]["config"] = json_schema()
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def values_text(current: str) -> str:
    lines = current.splitlines(keepends=True)
    begin = next(i for i, line in enumerate(lines) if line.startswith(BEGIN))
    end = next(i for i, line in enumerate(lines) if line.startswith(END))
    data = default_config().model_dump(mode="json", by_alias=True, exclude_none=True)
    block = yaml.safe_dump(data, sort_keys=False, width=100)
    indented = "".join(f"  {line}" for line in block.splitlines(keepends=True))
    return "".join(lines[: begin + 1]) + indented + "".join(lines[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a file is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, render in ((SCHEMA, schema_text), (VALUES, values_text)):
        current = path.read_text()
        wanted = render(current)
        if wanted == current:
            continue
        stale.append(str(path.relative_to(CHART.parent.parent)))
        if not args.check:
            path.write_text(wanted)
    if stale and args.check:
        print(f"stale: {', '.join(stale)} (run: .venv/bin/python scripts/sync_chart.py)", file=sys.stderr)
        return 1
    for name in stale:
        print(f"rewrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
