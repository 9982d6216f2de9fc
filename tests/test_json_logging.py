"""The JSON log lines: one object per line, and the per-admission line's batching on an event loop
(:func:`ix_gpu.runtime.json_logging.info_line`)."""

from __future__ import annotations

import asyncio
import io
import logging
import sys
from collections.abc import Iterator

import orjson
import pytest

from ix_gpu.runtime import json_logging


class _CountingBytes(io.BytesIO):
    """stderr's bytes, and how many writes brought them."""

    writes = 0

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.writes += 1
        return super().write(data)


@pytest.fixture
def stderr(monkeypatch: pytest.MonkeyPatch) -> Iterator[_CountingBytes]:
    raw = _CountingBytes()
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(raw, encoding="utf-8", write_through=True))
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    monkeypatch.setattr(json_logging, "_handler", json_logging._handler)
    try:
        json_logging.configure("info")
        yield raw
    finally:
        root.handlers[:], root.level = saved


def _lines(raw: _CountingBytes) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in raw.getvalue().splitlines()]


def test_the_admission_lines_of_one_loop_iteration_are_one_write_in_order(stderr: _CountingBytes) -> None:
    log = logging.getLogger("ix_gpu.admission")

    async def serve() -> tuple[bytes, int]:
        json_logging.info_line(log, "admission", {"n": 1})
        json_logging.info_line(log, "admission", {"n": 2})
        assert stderr.getvalue() == b""  # pending until the loop's iteration ends
        await asyncio.sleep(0)
        written, writes = stderr.getvalue(), stderr.writes
        json_logging.info_line(log, "admission", {"n": 3})
        log.warning("another line")  # from the loop's thread: the pending line goes first
        return written, writes

    written, writes = asyncio.run(serve())
    assert written.count(b"\n") == 2 and writes == 1
    json_logging.info_line(log, "admission", {"n": 4})  # no loop: written at once
    lines = _lines(stderr)
    assert [line.get("n") for line in lines] == [1, 2, 3, None, 4]
    assert lines[0]["msg"] == "admission" and lines[0]["level"] == "info"
    assert lines[0]["logger"] == "ix_gpu.admission" and str(lines[0]["ts"]).endswith("Z")
    assert lines[3] == {**lines[3], "msg": "another line", "level": "warning"}


def test_pending_lines_are_written_at_exit_if_the_loop_stopped_first(stderr: _CountingBytes) -> None:
    """The loop is closed before the iteration that would write the line: the exit hook does."""
    log = logging.getLogger("ix_gpu.admission")
    loop = asyncio.new_event_loop()

    async def last_answer() -> None:
        json_logging.info_line(log, "admission", {"uid": "last"})
        loop.stop()

    task = loop.create_task(last_answer())
    loop.run_forever()
    loop.close()
    assert task.done()
    assert stderr.getvalue() == b""
    json_logging.flush_pending()  # what atexit runs
    assert [line["uid"] for line in _lines(stderr)] == ["last"]


def test_a_level_above_info_writes_no_admission_line(stderr: _CountingBytes) -> None:
    logging.getLogger().setLevel(logging.WARNING)
    json_logging.info_line(logging.getLogger("ix_gpu.admission"), "admission", {"n": 1})
    json_logging.flush_pending()
    assert stderr.getvalue() == b""
