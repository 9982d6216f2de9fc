"""Run a pure function in a forked child and take back its pickled result.

The device plugin validates its config and the fake backend's devices file with pydantic, which a
process cannot unload once imported (~12 MiB). Doing that work in a child means the long-running
parent never imports it: the child inherits everything already loaded, imports what the work
needs, answers over a pipe and leaves with ``os._exit``, and its memory goes with it.

Fork without exec is safe here for the same reasons as the webhook's heavy lane
(:mod:`ix_gpu.webhook.service.limits`): the child runs only pure code on inherited data, takes no
lock another thread may hold (no logging, no I/O but its pipe; CPython takes the import lock
around ``fork``), and never returns into the parent's stack. The result (or the exception the work
raised) must be picklable by classes the parent can import without the heavy modules.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")


class ForkedCallError(RuntimeError):
    """The child died, timed out, or raised something that could not be sent back."""


def call_forked(work: Callable[[], T], timeout: float = 60.0, *, inline_if_loaded: str | None = None) -> T:
    """``work()`` in a forked child; its result, or the exception it raised, raised here.

    ``inline_if_loaded``: a module whose presence makes the fork pointless (the memory it would
    keep out of this process is here already, as in tests and short-lived commands); ``work`` then
    runs here. That also keeps forks out of processes that embed grpcio, whose threads do not
    survive ``fork`` (its child handlers crash when other threads are inside gRPC)."""
    if inline_if_loaded is not None and inline_if_loaded in sys.modules:
        return work()
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:  # pids or memory exhausted
        os.close(read_fd)
        os.close(write_fd)
        raise ForkedCallError(f"cannot fork: {exc}") from None
    if pid == 0:  # pragma: no cover - the child; covered through its results
        os.close(read_fd)
        _child(write_fd, work)
    os.close(write_fd)
    try:
        data = _read_all(read_fd, time.monotonic() + timeout)
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        raise ForkedCallError(f"the child did not answer within {timeout:g}s") from None
    finally:
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
    if not data:
        raise ForkedCallError(f"the child died without an answer ({_describe(status)})")
    kind, value = pickle.loads(data)
    if kind == "ok":
        result: T = value
        return result
    if kind == "raised":
        raise value
    raise ForkedCallError(f"the work failed in the child: {value}")


def _child(write_fd: int, work: Callable[[], Any]) -> NoReturn:  # pragma: no cover
    code = 0
    try:
        try:
            answer: tuple[str, Any] = ("ok", work())
        except Exception as exc:  # every failure of the work goes back to the parent
            answer = ("raised", exc)
        try:
            payload = pickle.dumps(answer)
        except Exception as exc:  # a result (or exception) that cannot travel
            payload = pickle.dumps(("crashed", "".join(traceback.format_exception_only(exc)).strip()))
        view = memoryview(payload)
        while view:
            view = view[os.write(write_fd, view) :]
    except BaseException:
        code = 70
    finally:
        os._exit(code)


def _read_all(fd: int, deadline: float) -> bytes:
    chunks: list[bytes] = []
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            raise TimeoutError
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"
