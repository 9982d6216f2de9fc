"""kube-scheduler's CPU profile around one layout's claims: what ``bench/dra_scheduler_bench.py
--profile DIR`` adds after its measured rounds.

Why a profile per layout: the bench's extension-point figures say how much longer a partitionable
claim's Filter takes than a plain one's, not in which functions. Go's ``/debug/pprof/profile``
samples the whole process for a fixed number of seconds, so each layout gets a window of its own
with only that layout's pods scheduled in it (the scheduler is otherwise idle: the rest of the
window adds little), and the two profiles can be compared function by function with
``go tool pprof -top -diff_base plain.pprof partitionable.pprof``.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

# The functions a DRA claim's scheduling goes through, for the summary printed per layout.
FOCUS = "dynamicresources|structured|allocator"


def fetch_profile(base_url: str, token: str, seconds: int, out: Path) -> None:
    """``seconds`` of the scheduler's CPU profile, written to ``out`` (blocks that long)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the scheduler's serving cert is self-signed
    request = urllib.request.Request(
        f"{base_url}/debug/pprof/profile?seconds={seconds}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, context=context, timeout=seconds + 30) as answer:
        out.write_bytes(answer.read())


def profiled(base_url: str, token: str, seconds: int, out: Path, work: Callable[[], None]) -> None:
    """Run ``work`` while the scheduler's profile of the next ``seconds`` is taken into ``out``;
    ``work`` must end within the window (else the profile misses its tail: an error here)."""
    failure: list[BaseException] = []

    def take() -> None:
        try:
            fetch_profile(base_url, token, seconds, out)
        except BaseException as exc:  # reported in the caller's thread
            failure.append(exc)

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    time.sleep(0.3)  # the request reaches the scheduler before the pods do
    work()
    if not taker.is_alive():
        raise RuntimeError(f"the profile ended before the work did; raise --profile-seconds ({seconds})")
    taker.join(seconds + 60)
    if failure:
        raise RuntimeError(f"profile {out.name}: {failure[0]}")


def top(profile: Path, *, base: Path | None = None, lines: int = 18) -> str:
    """``go tool pprof -top`` of ``profile`` (or its difference from ``base``), the functions of a
    claim's scheduling only, by cumulative time; or why it could not be made."""
    go = shutil.which("go")
    if go is None:
        return "  (no go on PATH: read the profiles with go tool pprof)"
    command = [go, "tool", "pprof", "-top", "-cum", f"-focus={FOCUS}", f"-nodecount={lines}"]
    if base is not None:
        command.append(f"-diff_base={base}")
    answer = subprocess.run([*command, str(profile)], capture_output=True, text=True, timeout=120)
    if answer.returncode != 0:
        return f"  (go tool pprof failed: {answer.stderr.strip()[:300]})"
    return "\n".join("  " + line for line in answer.stdout.splitlines())
