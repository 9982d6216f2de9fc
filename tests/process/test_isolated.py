"""``ix_gpu.process.isolated.call_isolated``: the work runs in another interpreter (pydantic loaded
there stays there), and results, exceptions, deaths and deadlines come back as the caller expects."""

from __future__ import annotations

import os
import time

import pytest

from ix_gpu.config.input_files import ConfigError
from ix_gpu.process.isolated import IsolatedCallError, call_isolated
from tests.support import isolated_work


def test_the_work_runs_in_another_process_which_keeps_what_it_imported() -> None:
    pid, loaded_there = call_isolated(isolated_work.pid_and_pydantic, True)
    assert pid != os.getpid() and loaded_there
    # The child starts fresh: it has not inherited this process's modules (pytest loaded pydantic).
    assert call_isolated(isolated_work.pid_and_pydantic, False)[1] is False


def test_an_exception_is_raised_in_the_caller_with_its_message() -> None:
    with pytest.raises(ConfigError, match=r"^config: line 3: flags\.splitboard: not a bool$"):
        call_isolated(isolated_work.refuse, "config: line 3: flags.splitboard: not a bool")


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("kill", r"the child died without an answer \(killed by SIGKILL\)"),
        ("exit", r"the child died without an answer \(exit code 3\)"),
        ("hang", r"the child did not answer within 1s"),
    ],
)
def test_a_child_that_dies_or_hangs_is_an_isolated_call_error(how: str, expected: str) -> None:
    started = time.monotonic()
    with pytest.raises(IsolatedCallError, match=expected):
        call_isolated(isolated_work.die, how, timeout=1)
    assert time.monotonic() - started < 10


def test_a_result_that_cannot_travel_is_an_isolated_call_error() -> None:
    with pytest.raises(IsolatedCallError, match=r"the work failed in the child: .*pickle"):
        call_isolated(isolated_work.unpicklable)


def test_inline_when_the_module_is_already_loaded() -> None:
    assert call_isolated(isolated_work.pid_and_pydantic, False, inline_if_loaded="pytest")[0] == os.getpid()
    assert call_isolated(isolated_work.pid_and_pydantic, False, inline_if_loaded="nowhere")[0] != os.getpid()


def test_a_shared_child_answers_several_calls_from_several_threads_then_exits() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from ix_gpu.process import isolated

    with isolated.shared_child():
        child = isolated._SHARED
        assert child is not None
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: call_isolated(isolated_work.pid_and_pydantic, True), range(6)))
        with pytest.raises(ConfigError, match="refused here"):
            call_isolated(isolated_work.refuse, "refused here")
    assert {pid for pid, _ in answers} == {child.process.pid} != {os.getpid()}
    assert child.process.returncode == 0  # it left when its stdin closed
    # Without the block, each call has its own child again.
    assert call_isolated(isolated_work.pid_and_pydantic, False)[0] != child.process.pid


def test_a_shared_child_that_dies_is_an_isolated_call_error() -> None:
    from ix_gpu.process import isolated

    with isolated.shared_child(), pytest.raises(IsolatedCallError, match="killed by SIGKILL"):
        call_isolated(isolated_work.die, "kill")


def test_a_shared_child_past_its_deadline_is_killed_and_said_so() -> None:
    from ix_gpu.process import isolated

    started = time.monotonic()
    with isolated.shared_child(), pytest.raises(IsolatedCallError, match="did not answer within 1s"):
        call_isolated(isolated_work.die, "hang", timeout=1)
    assert time.monotonic() - started < 10
