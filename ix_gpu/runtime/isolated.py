"""Run a pure function in a fresh interpreter and take back its pickled result.

The device plugin validates its config and the fake backend's devices file with pydantic, which a
process cannot unload once imported (~12 MiB). Doing that work in a short-lived child means the
long-running plugin never imports it: the child imports what the work needs, answers on stdout and
exits, and its memory goes with it.

A fresh interpreter (``python -m ix_gpu.runtime.isolated``), not ``fork`` alone: the work imports
modules, and a child forked while another thread of the plugin holds an import lock (a lazy import
on a worker thread) would wait for that lock forever. The price is the interpreter's start, about
0.3 s with pydantic, paid at start-up and when a file changes.

The function is named by module and qualified name, its arguments and result are pickled; the
result (or the exception the work raised) must be of classes the caller can import without the
heavy modules.
"""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

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
    kind, value = pickle.loads(done.stdout)
    if kind == "ok":
        result: T = value
        return result
    if kind == "raised":
        raise value
    raise IsolatedCallError(f"the work failed in the child: {value}")


def _describe(returncode: int) -> str:
    if returncode < 0:
        import signal

        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


def _serve() -> int:  # the child
    module, qualname, args = pickle.loads(sys.stdin.buffer.read())
    try:
        function: Any = importlib.import_module(module)
        for part in qualname.split("."):
            function = getattr(function, part)
        answer: tuple[str, Any] = ("ok", function(*args))
    except Exception as exc:  # every failure of the work goes back to the caller
        answer = ("raised", exc)
    try:
        payload = pickle.dumps(answer)
    except Exception as exc:  # a result (or exception) that cannot travel
        payload = pickle.dumps(("crashed", "".join(traceback.format_exception_only(exc)).strip()))
    sys.stdout.buffer.write(payload)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_serve())
