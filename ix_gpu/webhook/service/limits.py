"""Bounds on what clients can make the webhook hold: connections, header bytes and time, body bytes
in flight, and CPU time on the event loop.

The webhook serves every Pod create of the cluster with ``failurePolicy: Fail`` and one event loop,
so one careless or hostile client must not be able to stall or bloat it:

- **Connections** are capped at ``max_connections``, ``max_connections_per_address`` of them from
  one client address. At a cap the newcomer takes the slot of the connection idle longest (each
  address keeps its ``keep_idle_per_address`` most recently used), which is closed; only when none
  is idle is the newcomer closed as soon as it is made (after the TLS handshake, which asyncio
  bounds at 60 s). Refusing every newcomer at the cap let one client that kept 128 connections
  with a request on each every 20 s lock out the apiserver and the kubelet's probes
  (:mod:`ix_gpu.serving.connection_slots`). Idle keep-alive connections are also closed by uvicorn
  after its keep-alive timeout. (Enforced by the connection's protocol, :mod:`.http_protocol`.)
- **Headers** must be complete within ``header_timeout`` seconds of the connection (or of the
  request's first byte) and within ``max_header_bytes``: uvicorn bounds neither, so a client
  sending one header byte a second, or 128 MiB of headers, held a connection and its memory.
- **Body bytes in flight** across all connections are capped by :class:`ByteBudget`; a request
  that would go past it is answered 503 with ``Retry-After`` before its body is read
  (:mod:`.mutate_exchange`).
- **CPU on the loop**: a review larger than ``offload_bytes`` is parsed and mutated in a forked
  child process, one at a time, killed at ``request_budget`` seconds (:class:`HeavyLane`), so the
  loop keeps answering ``/healthz`` and small reviews meanwhile. The work per byte is bounded by
  the core's caps; the budget bounds the wait.
- **The collector's full passes**: the objects made at start-up (the app, the compiled config,
  pydantic's and FastAPI's classes) are frozen out of the cyclic collector
  (:func:`freeze_startup_heap`), so a full pass walks only what requests made since.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import signal
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

from ix_gpu.webhook.service.limit_settings import Limits as Limits  # re-exported

log = logging.getLogger("ix_gpu.webhook")


class ByteBudget:
    """Bytes of request bodies held at once, across connections; reservations never block."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0

    def try_reserve(self, size: int) -> bool:
        if self.used + size > self.capacity:
            return False
        self.used += size
        return True

    def release(self, size: int) -> None:
        self.used -= size
        if size >= TRIM_AFTER_BYTES:
            FREED_MEMORY.note()


class OverBudget(Exception):
    """The request could not be served within its budget (queue wait plus work)."""


class WorkerDied(Exception):
    """The child process doing a large review's work ended without an answer (a crash, a signal)."""


class HeavyLane:
    """Runs large reviews' CPU work in a forked child process, one review at a time, within a
    deadline.

    Why a process and not a thread: parsing a 3 MiB review is one C call (``orjson.loads``) that
    holds the GIL for 50-160 ms on a small node, and the event loop waits for the GIL all that
    time: ``/healthz`` and every small review stall behind it (measured: ``/healthz`` up to 163 ms
    with a worker thread). A forked child has its own GIL, so the loop never waits. It also bounds
    what a review can cost: the child's heap (a parsed review is five to ten times its JSON) goes
    back to the OS when it exits, so the server's RSS does not keep the high-water mark of the
    largest burst; and a child past its deadline is killed, where a thread could only be waited
    for.

    ``fork`` without ``exec`` is sound here because the child only runs pure code on data it
    inherited (the body, the compiled config, namespace facts) and leaves with ``os._exit``: it
    takes no lock another thread could have held at the fork (no logging, no metrics, no I/O but
    its result pipe and, on a bug, ``write(2)`` of a traceback). Forking costs about a millisecond,
    paid only by reviews over ``offload_bytes``.

    One review at a time: the slot bounds memory (one parsed large review, outside this process)
    and CPU (the loop keeps the other core). Later large reviews wait and, past their own budget,
    are refused.
    """

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self._slot = asyncio.Semaphore(1)

    async def run(self, deadline: float, work: Callable[[], bytes]) -> bytes:
        """``work()`` run in a child process; its bytes, or :class:`OverBudget` at ``deadline``
        (the child is then killed), or :class:`WorkerDied`."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise OverBudget()
        try:
            async with asyncio.timeout(remaining):
                await self._slot.acquire()
        except TimeoutError:
            raise OverBudget() from None
        try:
            return await _run_forked(deadline, work)
        finally:
            self._slot.release()


async def _run_forked(deadline: float, work: Callable[[], bytes]) -> bytes:
    loop = asyncio.get_running_loop()
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
    except OSError as exc:  # EAGAIN/ENOMEM: the pids or memory limit of the container
        os.close(read_fd)
        os.close(write_fd)
        raise WorkerDied(f"cannot start the review worker: {exc}") from None
    if pid == 0:  # pragma: no cover - the child; its effects are what the tests check
        os.close(read_fd)
        _child_main(write_fd, work)
    os.close(write_fd)
    os.set_blocking(read_fd, False)
    chunks: list[bytes] = []
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            data = os.read(read_fd, 1 << 20)
        except BlockingIOError:
            return
        except OSError as exc:
            data = b""
            chunks.clear()
            log.error("reading the review worker's answer failed: %s", exc)
        if data:
            chunks.append(data)
        elif not done.done():
            done.set_result(None)

    loop.add_reader(read_fd, readable)
    try:
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
                await done
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            raise OverBudget() from None
        except BaseException:  # cancelled (the client left): the work is no longer wanted
            os.kill(pid, signal.SIGKILL)
            raise
    finally:
        loop.remove_reader(read_fd)
        os.close(read_fd)
        status = _reap(pid)
    if status != 0 or not chunks:
        raise WorkerDied(_describe_exit(status))
    return b"".join(chunks)


def _reap(pid: int) -> int:
    """The child's wait status. At EOF (or after SIGKILL) it is exiting, so this returns at once;
    reaping here, not by a SIGCHLD handler, leaves the loop's signal handling alone."""
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return 0
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
            continue


def _describe_exit(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"the review worker was killed by signal {os.WTERMSIG(status)}"
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0:
        return f"the review worker exited with status {os.WEXITSTATUS(status)}"
    return "the review worker ended without an answer"


def _child_main(write_fd: int, work: Callable[[], bytes]) -> NoReturn:  # pragma: no cover
    """The forked child: do ``work``, write its bytes, leave without running any cleanup (the
    parent's atexit handlers, buffered files and sockets are the parent's)."""
    code = 70  # EX_SOFTWARE
    try:
        # Signals for the server (Ctrl-C to the process group, SIGTERM) must not run the parent's
        # handlers here, which write to the loop's wakeup fd that the child shares.
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        # Nothing is kept: the collector would only walk the parsed review again.
        gc.disable()
        answer = memoryview(work())
        while answer:
            answer = answer[os.write(write_fd, answer) :]
        code = 0
    except BaseException:
        with contextlib.suppress(BaseException):
            os.write(2, traceback.format_exc().encode("utf-8", "replace")[-8192:])
    finally:
        os._exit(code)


def freeze_startup_heap() -> int:
    """Move every object alive now out of the cyclic collector's reach; the count moved.

    Why: the collector's full pass (generation 2) walks every tracked object, and most of the
    server's are start-up's, which live until exit: measured 52-61 ms a pass with 63 000 objects,
    a pause of the event loop (``/healthz`` and every review waiting) that the adversarial load
    set off a few times a minute. Frozen, a full pass costs only what requests left, about
    nothing. Start-up objects live until exit, except the start-up config once a reload replaces
    it: that is freed by reference counting like any object, and only a reference cycle inside it
    (none in the compiled config) would stay, once. Called once the server is
    fully loaded (uvicorn's protocol classes imported), just before the first connection.
    """
    gc.collect()  # what start-up left as garbage goes now, not frozen forever
    gc.freeze()
    return gc.get_freeze_count()


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018 - both must exist: glibc, not musl
    except (OSError, AttributeError):
        return None
    return libc


_GLIBC = _glibc()
_M_MMAP_THRESHOLD = -3


MMAP_THRESHOLD = 384 << 10
"""Allocations of at least this size get their own mmap (see :func:`fix_malloc_mmap_threshold`).

Above 256 KiB on purpose: uvloop's TLS transport reads every record batch with
``SSLObject.read(256 KiB)``, which allocates 256 KiB, shrinks it to what was read and frees it. With
the threshold below that (128 KiB, say), every request pays an mmap, an mremap and a munmap
(strace: 1.0-2.0 of each per request), and a page fault per touched page of a fresh mapping:
CPU per request is 1.3-1.8x higher under 64 connections. At 384 KiB none of these
happen per request, and request bodies near the 3 MiB cap (and their joins) are still mapped."""


def fix_malloc_mmap_threshold(size: int = MMAP_THRESHOLD) -> None:
    """Serve every allocation of ``size`` or more with its own mmap, returned to the OS when freed.

    glibc starts with a 128 KiB rule but raises the threshold each time a mapped block is freed, up
    to 32 MiB; after the first 3 MiB request body is freed, bodies and TLS reads of a burst come
    from the heap, which fragments and stays resident (measured: RSS 190-225 MiB after 300 clients
    sent 3 MiB each, against 62 MiB before). Setting the threshold once turns the adjustment off.
    What is under it and freed after a burst goes back by :class:`FreedMemory`."""
    if _GLIBC is not None:
        _GLIBC.mallopt(_M_MMAP_THRESHOLD, size)


TRIM_AFTER_BYTES = 64 << 10
"""Releasing a body of this size or more asks for a trim: smaller ones (every ordinary review)
leave nothing a trim would give back, and trimming under steady load only makes the heap fault
its pages in again."""


class FreedMemory:
    """Gives freed heap pages back to the OS a moment after a burst of bodies or connections.

    glibc keeps freed heap pages for reuse, so without this RSS stays at the high-water mark of
    the largest burst (measured: 148 MiB 30 s after 300 clients had sent 3 MiB each, against
    62 MiB before). ``malloc_trim`` walks the heap (about a millisecond), so it runs at most once
    per ``interval``, and only when large bodies (:data:`TRIM_AFTER_BYTES`) or connections were
    released since the last time."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._pending = False

    def note(self) -> None:
        self._pending = True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if self._pending:
                self._pending = False
                if _GLIBC is not None:
                    _GLIBC.malloc_trim(0)


FREED_MEMORY = FreedMemory()
"""One per process: the heap it trims is the process's."""
