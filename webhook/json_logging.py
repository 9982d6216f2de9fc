"""Structured logs: one JSON object per line on stderr, for the service and for uvicorn.

Log collectors in a cluster parse JSON lines without per-format rules, and a per-admission line
with fixed keys (uid, kind, namespace, name, result, ops, durationMs) can be queried directly.
Fields ride on ``extra={"fields": {...}}`` so call sites stay plain ``logging`` calls.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

FIELDS = "fields"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def _timestamp(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


def configure(level: str = "info") -> None:
    """Route every logger (ours, uvicorn's, the kubernetes client's) through one JSON handler."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    # urllib3 warns on every retry of the watch connection; our own log line says it once.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
