"""``ix_gpu.runtime.forked.call_forked``: results, exceptions, deaths and deadlines come back as
the caller expects. Each case runs in a fresh interpreter: this pytest process may hold grpcio's
threads (other suites start gRPC servers), and grpcio's fork handlers crash a child forked while
they run, which is exactly why the plugin runs the work inline when pydantic is already loaded."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.support.paths import ROOT

PRELUDE = """
import os, signal, sys, time
from ix_gpu.runtime.forked import ForkedCallError, call_forked
from ix_gpu.devicemodel.yaml_input import ConfigError
"""


def run(body: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_result_comes_back_and_the_work_ran_in_another_process() -> None:
    out = run("""
        parent = os.getpid()
        pid, modules = call_forked(lambda: (os.getpid(), __import__("json") and len(sys.modules)))
        print(pid != parent, "pydantic" in sys.modules)
        def heavy():
            import pydantic  # noqa: F401
            return "pydantic" in sys.modules
        print(call_forked(heavy), "pydantic" in sys.modules)  # loaded there, not here
    """)
    assert out.splitlines() == ["True False", "True False"]


def test_an_exception_is_raised_in_the_caller_with_its_message() -> None:
    out = run("""
        def bad():
            raise ConfigError("config: line 3: flags.splitboard: not a bool")
        try:
            call_forked(bad)
        except ConfigError as exc:
            print(type(exc).__name__, exc)
    """)
    assert out == "ConfigError config: line 3: flags.splitboard: not a bool"


@pytest.mark.parametrize(
    ("work", "expected"),
    [
        ("lambda: os.kill(os.getpid(), signal.SIGKILL)", "the child died without an answer (killed by SIGKI"),
        ("lambda: os._exit(3)", "the child died without an answer (exit code 3)"),
        ("lambda: time.sleep(30)", "the child did not answer within 0.5s"),
        ("lambda: (lambda: 1)", "the work failed in the child"),  # a lambda cannot be pickled
    ],
    ids=["killed", "exited", "too-slow", "unpicklable"],
)
def test_a_child_that_dies_hangs_or_cannot_answer_is_a_forked_call_error(work: str, expected: str) -> None:
    out = run(f"""
        started = time.monotonic()
        try:
            call_forked({work}, timeout=0.5)
        except ForkedCallError as exc:
            print(exc)
        print(round(time.monotonic() - started) < 5)
    """)
    message, fast = out.splitlines()
    assert message.startswith(expected), message
    assert fast == "True"


def test_inline_when_the_module_is_already_loaded() -> None:
    out = run("""
        import json  # noqa: F401
        parent = os.getpid()
        print(call_forked(os.getpid, inline_if_loaded="json") == parent)
        print(call_forked(os.getpid, inline_if_loaded="not_loaded_anywhere") == parent)
    """)
    assert out.splitlines() == ["True", "False"]
