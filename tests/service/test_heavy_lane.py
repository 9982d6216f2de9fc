"""The heavy lane runs a large review's work in a forked child: what that promises, tested on the
lane itself (the service-level effects are in test_service_limits and test_service_adversarial)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import orjson
import pytest

from ix_gpu.config.webhook_config import default_config
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.service.admission_handler import AdmissionHandler
from ix_gpu.webhook.service.hot_reload import LiveConfig
from ix_gpu.webhook.service.limits import HeavyLane, Limits, OverBudget, WorkerDied
from ix_gpu.webhook.service.metrics import ServiceMetrics
from ix_gpu.webhook.service.namespace_cache import UnknownNamespaces
from tests.support.objects import pod, review


def _run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def _children() -> set[int]:
    """This process's children now (other tests may have left some running: compare with a set
    taken before)."""
    found: set[int] = set()
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{task}/children") as children:
            found.update(int(pid) for pid in children.read().split())
    return found


def test_the_work_runs_in_another_process_and_its_bytes_come_back() -> None:
    before = _children()
    lane = HeavyLane(1.0)
    payload = b"x" * (3 << 20)  # larger than a pipe's buffer: read while the child writes

    async def main() -> bytes:
        return await lane.run(time.monotonic() + 5, lambda: str(os.getpid()).encode() + payload)

    answer = _run(main())
    assert isinstance(answer, bytes)
    child_pid = int(answer[: -len(payload)])
    assert child_pid != os.getpid()
    assert answer.endswith(payload)
    assert _children() <= before  # reaped


def test_a_child_past_its_deadline_is_killed_and_the_loop_was_free_meanwhile() -> None:
    before = _children()
    lane = HeavyLane(1.0)
    ticks = 0

    def spin() -> bytes:
        while True:  # a review whose work never ends: only SIGKILL stops it
            pass

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    async def main() -> float:
        task = asyncio.create_task(ticker())
        started = time.monotonic()
        with pytest.raises(OverBudget):
            await lane.run(started + 0.3, spin)
        task.cancel()
        return time.monotonic() - started

    took = _run(main())
    assert isinstance(took, float) and took < 0.6
    assert ticks >= 15, ticks  # the loop ran while the child spun (a thread would hold the GIL)
    assert _children() <= before


def test_a_killed_child_is_a_worker_death_with_its_signal() -> None:
    lane = HeavyLane(1.0)

    def crash() -> bytes:
        os.kill(os.getpid(), signal.SIGKILL)
        return b"never"

    async def main() -> None:
        await lane.run(time.monotonic() + 5, crash)

    with pytest.raises(WorkerDied, match=f"signal {int(signal.SIGKILL)}"):
        _run(main())


def test_an_exception_in_the_child_is_a_worker_death_not_a_hang(capfd: pytest.CaptureFixture[str]) -> None:
    lane = HeavyLane(1.0)

    def fail() -> bytes:
        raise RuntimeError("a bug in the core")

    async def main() -> None:
        await lane.run(time.monotonic() + 5, fail)

    with pytest.raises(WorkerDied, match="exited with status 70"):
        _run(main())
    assert "RuntimeError: a bug in the core" in capfd.readouterr().err  # the traceback, on fd 2


def test_reviews_wait_for_the_one_slot_and_a_wait_past_the_budget_is_refused() -> None:
    before = _children()
    lane = HeavyLane(1.0)

    def slow() -> bytes:
        time.sleep(0.3)
        return b"done"

    async def main() -> list[object]:
        deadline = time.monotonic() + 0.45
        return await asyncio.gather(
            lane.run(deadline, slow), lane.run(deadline, slow), return_exceptions=True
        )

    first, second = _run(main())  # type: ignore[misc]
    assert first == b"done"
    assert isinstance(second, OverBudget)  # 0.3 s waiting + 0.3 s of work > 0.45 s
    assert _children() <= before


# ------------------------------------------------------------------------------ through the handler


def _handler() -> tuple[AdmissionHandler, ServiceMetrics]:
    metrics = ServiceMetrics()
    live = LiveConfig(CompiledConfig(default_config()), None)
    return AdmissionHandler(live, UnknownNamespaces(), metrics, Limits(offload_bytes=1024)), metrics


def _large_review() -> bytes:
    obj = pod(annotations={"note": "x" * 4096})  # over the 1 KiB offload threshold
    return orjson.dumps(review(obj, uid="large"))


def test_a_large_review_is_answered_by_the_child_like_a_small_one() -> None:
    handler, metrics = _handler()
    status, body = asyncio.run(handler.handle(_large_review(), time.perf_counter()))
    response = orjson.loads(body)["response"]
    assert status == 200 and response["uid"] == "large" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    labels = {"kind": "Pod", "operation": "CREATE", "result": "mutated"}
    assert metrics.registry.get_sample_value("ix_gpu_admission_requests_total", labels) == 1


def test_a_child_that_dies_is_a_denial_naming_the_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The OOM killer or a crash in C code takes the child, never the server: the review is denied
    as an internal error (failurePolicy Fail would refuse it too) and counted."""
    handler, metrics = _handler()

    loads = orjson.loads

    def die(body: bytes) -> object:  # runs in the child only: large reviews are parsed there
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")

    # The decoder's module attribute, not the handler's: the webhook's build compiles the handler,
    # and compiled code looks up only a module's attributes at each call.
    monkeypatch.setattr(orjson, "loads", die)
    status, body = asyncio.run(handler.handle(_large_review(), time.perf_counter()))
    response = loads(body)["response"]
    assert status == 200 and response["allowed"] is False
    assert response["status"]["code"] == 500
    assert f"killed by signal {int(signal.SIGKILL)}" in response["status"]["message"]
    assert metrics.internal_errors._value.get() == 1


def test_a_failed_fork_is_a_worker_death(monkeypatch: pytest.MonkeyPatch) -> None:
    """A container at its pids limit: fork fails with EAGAIN, and the review is denied as an
    internal error rather than escaping as an exception (which would be a 500)."""
    import errno

    def no_fork() -> int:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    lane = HeavyLane(1.0)
    with pytest.raises(WorkerDied, match="cannot start the review worker"):
        asyncio.run(lane.run(time.monotonic() + 5, lambda: b""))
