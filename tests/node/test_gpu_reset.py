"""GPU reset below both agents (:mod:`ix_gpu.node.gpu_reset`): the lock that keeps discovery and
telemetry out of the library during a reset, the reset tool's bound, and each backend's reset."""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from ix_gpu.config.plugin_config import parse_plugin_config
from ix_gpu.node.backends import make_backend
from ix_gpu.node.backends.base import BackendError, Chip, run_reset_tool
from ix_gpu.node.gpu_reset import (
    RESET_CHANGED,
    RESET_FAILED,
    RESET_OK,
    ChipResetter,
    ResetFailed,
    SerializedBackend,
    SharedOrExclusive,
    reset_problem,
)
from tests.node.test_backends import FakeNvml

pytestmark = pytest.mark.timeout(60)


def test_calls_share_the_library_and_a_reset_has_it_alone() -> None:
    lock = SharedOrExclusive()
    hung = threading.Event()

    def hang_in_the_library() -> None:
        with lock.shared():
            hung.wait(10)

    reader = threading.Thread(target=hang_in_the_library)
    reader.start()
    time.sleep(0.05)
    with lock.shared():  # a second call is not held up by the hung one
        pass
    started = time.monotonic()
    with pytest.raises(BackendError, match=r"stayed busy for 0\.3s"), lock.alone(0.3):
        pass
    assert 0.3 <= time.monotonic() - started < 1
    hung.set()
    reader.join()
    order: list[str] = []
    with lock.alone(1):
        waiting = threading.Thread(target=lambda: (lock.shared().__enter__(), order.append("read")))
        waiting.start()
        time.sleep(0.1)
        order.append("reset done")
    waiting.join(2)
    assert order == ["reset done", "read"]  # a call waits out the reset


def test_the_reset_tool_is_killed_with_its_children_at_its_bound(tmp_path: Path) -> None:
    marker = f"ix-gpu-reset-test-{os.getpid()}"
    tool = tmp_path / "tool"
    tool.write_text(f"#!/bin/sh\nsleep 300 &\nexec -a {marker} sleep 300\n")
    tool.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(BackendError, match=r"did not finish in 0\.5s; it was killed"):
        run_reset_tool([str(tool)], 0.5)
    assert time.monotonic() - started < 3
    time.sleep(0.2)
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert left == ""
    failing = tmp_path / "failing"
    failing.write_text("#!/bin/sh\necho 'Unable to reset GPU: in use' >&2\nexit 3\n")
    failing.chmod(0o755)
    with pytest.raises(BackendError, match=r"exited 3: Unable to reset GPU: in use"):
        run_reset_tool([str(failing), "-r"], 5)


class ScriptedBackend:
    """A backend whose reset does what a test says, and whose chips a test sets."""

    name = "scripted"
    reset_method = "scripted"

    def __init__(self, chips: list[Chip]) -> None:
        self.now = chips
        self.fail: str | None = None
        self.rename: dict[str, str] = {}
        self.reset_calls: list[list[str]] = []

    @property
    def vendor(self) -> object:
        raise AssertionError("not needed")

    def chips(self) -> list[Chip]:
        return list(self.now)

    def control_nodes(self) -> tuple[str, ...]:
        return ()

    def read_telemetry(self, chip: Chip) -> dict[str, float]:
        return {}

    def reset(self, chips: Sequence[Chip], timeout: float) -> None:
        self.reset_calls.append([c.uuid for c in chips])
        if self.fail:
            raise BackendError(self.fail)
        self.now = [Chip(**{**vars(c), "uuid": self.rename.get(c.uuid, c.uuid)}) for c in self.now]

    def close(self) -> None:
        pass


def chip(uuid: str, index: int) -> Chip:
    return Chip(uuid, index, index, "board0", index, "Iluvatar BI-V150", 32768, 0)


def test_the_resetter_says_what_became_of_the_chips() -> None:
    backend = ScriptedBackend([chip("GPU-a", 0), chip("GPU-b", 1)])
    results: list[str] = []
    resetter = ChipResetter(SerializedBackend(backend), lambda result, _: results.append(result))  # type: ignore[arg-type]
    assert [c.uuid for c in resetter.reset(backend.now[:1], 5)] == ["GPU-a", "GPU-b"]
    backend.fail = "Unable to reset: busy"
    with pytest.raises(ResetFailed, match=r"GPU reset of GPU-a failed \(Unable to reset: busy\)"):
        resetter.reset(backend.now[:1], 5)
    backend.fail, backend.rename = None, {"GPU-b": "GPU-c"}
    with pytest.raises(ResetFailed, match="GPU-b no longer exists after its GPU reset"):
        resetter.reset(backend.now[1:], 5)
    assert results == [RESET_OK, RESET_FAILED, RESET_CHANGED]
    assert backend.reset_calls == [["GPU-a"], ["GPU-a"], ["GPU-b"]]


def test_ixml_resets_with_ixsmi_while_the_library_is_shut_down(
    ixml_env: Path,
    libixml: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ix_gpu.node.backends import ixml

    backend = make_backend("ixml", root=ixml_env.parent / "root")
    chips = backend.chips()
    assert backend.reset_method is None  # no ixsmi in COREX_HOME/bin nor on PATH
    with pytest.raises(BackendError, match="no ixsmi in"):
        backend.reset(chips[:1], 5)
    tool = libixml / "bin/ixsmi"
    tool.parent.mkdir(exist_ok=True)
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    seen: list[tuple[list[str], int]] = []

    def tool_run(argv: Sequence[str], timeout: float) -> None:
        count = ctypes.c_uint()
        code = backend._lib.nvmlDeviceGetCount_v2(ctypes.byref(count))  # type: ignore[attr-defined]
        seen.append((list(argv), code))
        ixml_env.write_text(ixml_env.read_text().replace("GPU-ix-1 ", "GPU-ix-9 "))

    monkeypatch.setattr(ixml, "run_reset_tool", tool_run)
    assert backend.reset_method == f"{tool} -r -i <chip UUIDs>"
    backend.reset(chips[:2], 5)
    ((argv, code),) = seen
    assert argv == [str(tool), "-r", "-i", "GPU-ix-0,GPU-ix-1"]
    assert code != 0  # the library was shut down while the tool ran
    assert [c.uuid for c in backend.chips()][:2] == ["GPU-ix-0", "GPU-ix-9"]  # initialised again
    monkeypatch.setattr(ixml, "run_reset_tool", run_reset_tool)  # the real one again
    tool.write_text("#!/bin/sh\necho 'device busy'\nexit 1\n")
    with pytest.raises(BackendError, match="exited 1: device busy"):
        backend.reset(chips[:1], 5)
    assert backend.chips()  # the library is usable after a failed reset too


def test_nvml_resets_with_nvidia_smi_while_nvml_is_shut_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ix_gpu.node.backends import nvml as nvml_module
    from ix_gpu.node.backends.nvml import NvmlBackend

    events: list[object] = []

    class Recorded(FakeNvml):
        def nvmlInit(self) -> None:
            events.append("init")

        def nvmlShutdown(self) -> None:
            events.append("shutdown")

    backend = NvmlBackend(root=tmp_path, nvml=Recorded())
    chips = backend.chips()
    monkeypatch.setenv("PATH", str(tmp_path))
    assert backend.reset_method is None
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nexit 0\n")
    smi.chmod(0o755)
    monkeypatch.setattr(nvml_module, "run_reset_tool", lambda argv, timeout: events.append(list(argv)))
    events.clear()
    backend.reset(chips[:2], 5)
    assert events == ["shutdown", [str(smi), "--gpu-reset", "-i", "GPU-nv-0,GPU-nv-1"], "init"]


def test_reset_gpu_needs_a_backend_that_can_reset(tmp_path: Path) -> None:
    config = parse_plugin_config({"flags": {"reset_gpu": True}}).runtime()
    backend = ScriptedBackend([])
    assert reset_problem(config, backend) is None  # type: ignore[arg-type]
    backend.reset_method = None  # type: ignore[assignment]
    assert reset_problem(config, backend) == (  # type: ignore[arg-type]
        "flags.reset_gpu: true, but the scripted backend cannot reset chips"
    )
    assert reset_problem(parse_plugin_config({}).runtime(), backend) is None  # type: ignore[arg-type]


def test_an_agent_on_a_backend_that_cannot_reset_refuses_to_start(tmp_path: Path) -> None:
    """``ix-gpu plugin --backend devfs`` with reset_gpu: exit 2 and one line naming the flag."""
    from ix_gpu.devicemodel.vendors import ILUVATAR
    from tests.node.test_backends import pci
    from tests.support.cli import ix_gpu

    pci(tmp_path, "0000:8a:00.0", ILUVATAR.pci_vendor_id, 0x120000, numa=0)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/iluvatar0").touch()
    config = tmp_path / "ix-config"
    config.write_text("flags:\n  reset_gpu: true\n")
    result = ix_gpu("plugin", "--backend", "devfs", "--root", str(tmp_path), "--config", str(config),
                    "--device-plugin-dir", str(tmp_path / "dp"), "--metrics-port", "0")  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "flags.reset_gpu: true, but the devfs backend cannot reset chips" in result.stderr
