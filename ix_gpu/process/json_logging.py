"""Structured logs: one JSON object per line on stderr, for the service and for uvicorn.

Log collectors in a cluster parse JSON lines without per-format rules, and a per-admission line
with fixed keys (uid, kind, namespace, name, result, ops, durationMs) can be queried directly.
Fields ride on ``extra={"fields": {...}}`` so ordinary call sites stay plain ``logging`` calls.

The per-admission line has its own writer, :func:`info_line`: going through ``logging`` (record
object, formatter, handler) cost about 30 µs per line on the benchmark machine, 8% of an
admission. It writes the same JSON shape to the same stream, under the handler's lock, and obeys
the logger's level.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

FIELDS = "fields"

_handler: logging.StreamHandler[Any] | None = None
_second = -1
_second_text = ""
_milli = -1
_milli_text = ""


def _timestamp(created: float) -> str:
    """RFC 3339 in UTC with milliseconds; the text is kept for the millisecond (and its date for
    the second), because a busy webhook writes many lines in each."""
    global _second, _second_text, _milli, _milli_text
    milli = int(created * 1000)
    if milli != _milli:
        whole = milli // 1000
        if whole != _second:
            _second, _second_text = whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _milli, _milli_text = milli, f"{_second_text}.{milli % 1000:03d}Z"
    return _milli_text


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


def info_line(logger: logging.Logger, msg: str, fields: dict[str, Any]) -> None:
    """``logger.info(msg, extra={"fields": fields})``, without the logging machinery."""
    if not logger.isEnabledFor(logging.INFO):
        return
    handler = _handler
    if handler is None:
        logger.info(msg, extra={FIELDS: fields})
        return
    entry = {"ts": _timestamp(time.time()), "level": "info", "logger": logger.name, "msg": msg, **fields}
    line = orjson.dumps(entry, default=str, option=orjson.OPT_APPEND_NEWLINE)
    stream = handler.stream
    with handler.lock or _NO_LOCK:
        buffer = getattr(stream, "buffer", None)
        if buffer is not None:
            stream.flush()  # keep order with anything written through the text layer
            buffer.write(line)
            buffer.flush()
        else:
            stream.write(line.decode())
            stream.flush()


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_LOCK = _NoLock()


def configure(level: str = "info") -> None:
    """Route every logger (ours, uvicorn's, the kubernetes client's) through one JSON handler."""
    global _handler
    handler: logging.StreamHandler[Any] = logging.StreamHandler(sys.stderr)
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
    _handler = handler
