"""Run a pure function in a fresh interpreter and take back its pickled result.

The device plugin validates its config and the fake backend's devices file with pydantic, which a
process cannot unload once imported (~12 MiB). Doing that work in a short-lived child means the
long-running plugin never imports it: the child imports what the work needs, answers on stdout and
exits, and its memory goes with it.

A fresh interpreter (``python -m ix_gpu.process.isolated``), not ``fork`` alone: the work imports
modules, and a child forked while another thread of the plugin holds an import lock (a lazy import
on a worker thread) would wait for that lock forever. The price is the interpreter's start, about
0.3 s with pydantic, paid at start-up and when a file changes.

The function is named by module and qualified name, its arguments and result are pickled; the
result (or the exception the work raised) must be of classes the caller can import without the
heavy modules. Several calls in a row (the plugin's start: its config and its devices file) can
share one child, so the imports are paid once: ``with shared_child(): ...``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import IO, Any, TypeVar

T = TypeVar("T")


class IsolatedCallError(RuntimeError):
    """The child could not be started, died, timed out, or could not send its answer back."""


def call_isolated(
    function: Callable[..., T], *args: Any, timeout: float = 60.0, inline_if_loaded: str | None = None
) -> T:
    """``function(*args)`` in a fresh interpreter; its result, or the exception it raised, here.

    ``inline_if_loaded``: a module whose presence makes the child pointless (the memory it would
    keep out of this process is here already, as in tests and short-lived commands): ``function``
    then runs here."""
    if inline_if_loaded is not None and inline_if_loaded in sys.modules:
        return function(*args)
    request = pickle.dumps((function.__module__, function.__qualname__, args))
    shared = _SHARED
    if shared is not None:
        shared_result: T = _answer(shared.call(request, timeout))
        return shared_result
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__],
            input=request,
            stdout=subprocess.PIPE,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise IsolatedCallError(f"the child did not answer within {timeout:g}s") from None
    except OSError as exc:
        raise IsolatedCallError(f"cannot start {sys.executable}: {exc}") from None
    if not done.stdout:
        raise IsolatedCallError(f"the child died without an answer ({_describe(done.returncode)})")
    result: T = _answer(done.stdout)
    return result


def _answer(payload: bytes) -> Any:
    kind, value = pickle.loads(payload)
    if kind == "ok":
        return value
    if kind == "raised":
        raise value
    raise IsolatedCallError(f"the work failed in the child: {value}")


def _describe(returncode: int) -> str:
    if returncode < 0:
        import signal

        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


class _SharedChild:
    """One child answering framed requests (8-byte length, then the pickle) until its stdin closes."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self.lock = threading.Lock()  # one request at a time: the child answers in order

    def call(self, request: bytes, timeout: float) -> bytes:
        assert self.process.stdin is not None and self.process.stdout is not None
        with self.lock:
            deadline = time.monotonic() + timeout
            timer = threading.Timer(timeout, self.process.kill)
            timer.start()
            try:
                self.process.stdin.write(struct.pack("!Q", len(request)) + request)
                self.process.stdin.flush()
                answer = _read_frame(self.process.stdout)
            except OSError:
                answer = None
            finally:
                timer.cancel()
        if answer is None:
            code = self.process.wait()
            if time.monotonic() >= deadline:  # killed by the timer above
                raise IsolatedCallError(f"the child did not answer within {timeout:g}s")
            raise IsolatedCallError(f"the child died without an answer ({_describe(code)})")
        return answer

    def close(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_SHARED: _SharedChild | None = None


@contextlib.contextmanager
def shared_child() -> Iterator[None]:
    """Within the block, :func:`call_isolated` sends its calls (from any thread, one at a time) to
    one child started here, which imports what they need once."""
    global _SHARED
    child = _SharedChild()
    _SHARED = child
    try:
        yield
    finally:
        _SHARED = None
        child.close()


def _read_frame(stream: IO[bytes]) -> bytes | None:
    header = stream.read(8)
    if len(header) < 8:
        return None
    (size,) = struct.unpack("!Q", header)
    payload = stream.read(size)
    return payload if len(payload) == size else None


def _run(request: bytes) -> bytes:  # in the child
    module, qualname, args = pickle.loads(request)
    try:
        function: Any = importlib.import_module(module)
        for part in qualname.split("."):
            function = getattr(function, part)
        answer: tuple[str, Any] = ("ok", function(*args))
    except Exception as exc:  # every failure of the work goes back to the caller
        answer = ("raised", exc)
    try:
        return pickle.dumps(answer)
    except Exception as exc:  # a result (or exception) that cannot travel
        return pickle.dumps(("crashed", "".join(traceback.format_exception_only(exc)).strip()))


def _serve() -> int:  # the child: one request on stdin, or framed requests with --serve
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    if "--serve" not in sys.argv[1:]:
        stdout.write(_run(stdin.read()))
        stdout.flush()
        return 0
    while (request := _read_frame(stdin)) is not None:
        answer = _run(request)
        stdout.write(struct.pack("!Q", len(answer)) + answer)
        stdout.flush()
    return 0


if __name__ == "__main__":
    # os._exit: the answers are flushed, and finalizing an interpreter that loaded pydantic takes
    # about 0.1 s the caller would wait for.
    os._exit(_serve())
