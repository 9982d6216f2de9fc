"""Module-level work for tests/process/test_isolated.py: ``call_isolated`` names a function by module and
qualified name, which the child imports."""

from __future__ import annotations

import os
import signal
import sys
import time

from ix_gpu.config.input_files import ConfigError


def pid_and_pydantic(load: bool) -> tuple[int, bool]:
    if load:
        import pydantic  # noqa: F401

    return os.getpid(), "pydantic" in sys.modules


def refuse(message: str) -> None:
    raise ConfigError(message)


def die(how: str) -> None:
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "exit":
        os._exit(3)
    elif how == "hang":
        time.sleep(30)


def unpicklable() -> object:
    return lambda: None
