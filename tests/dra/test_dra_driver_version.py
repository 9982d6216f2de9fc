"""The driver version the DRA slice publishes (``driverVersion``), as the ixml and nvml backends read
it: ``nvmlSystemGetDriverVersion``, once per discovery, for every chip.

ixml runs against tests/plugin's gcc-built libixml stand-in, linked here with one more C function
(the call, answering ``$FAKE_IXML_DRIVER_VERSION``, or NOT_SUPPORTED without it); without that
function the stand-in is a libixml that lacks the call.
"""

from __future__ import annotations

import ctypes
import logging
import shutil
import subprocess
from pathlib import Path

import pytest

from ix_gpu.devicemodel.vendors import ILUVATAR, NVIDIA
from ix_gpu.dra.devices import attributes, dra_devices
from ix_gpu.node.backends.ixml import IxmlBackend
from ix_gpu.node.backends.nvml import NvmlBackend

STUB = Path(__file__).resolve().parents[1] / "node" / "fake_ixml.c"

DRIVER_VERSION_C = """\
#include <stdio.h>
#include <stdlib.h>
int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    const char *v = getenv("FAKE_IXML_DRIVER_VERSION");
    if (!v) return 3; /* NVML_ERROR_NOT_SUPPORTED */
    snprintf(version, length, "%s", v);
    return 0;
}
"""

SCRIPT = "GPU-ix-0 0 0 0 0 32768 8a\nGPU-ix-1 1 0 1 0 32768 8b\n"


def _build(directory: Path, *sources: Path) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc, "these tests need a C compiler (gcc) to build the libixml stand-in"
    library = directory / "libixml.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-o", str(library), *map(str, sources)], check=True)
    return library


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the stand-in with nvmlSystemGetDriverVersion, the stand-in without it)."""
    with_call, without = tmp_path_factory.mktemp("with"), tmp_path_factory.mktemp("without")
    extra = with_call / "driver_version.c"
    extra.write_text(DRIVER_VERSION_C)
    return _build(with_call, STUB, extra), _build(without, STUB)


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "script"
    path.write_text(SCRIPT)
    monkeypatch.setenv("FAKE_IXML_SCRIPT", str(path))
    return path


def test_ixml_reads_the_driver_version_once_per_discovery_for_every_chip(
    stand_ins: tuple[Path, Path], script: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_IXML_DRIVER_VERSION", "4.3.0")
    backend = IxmlBackend(root=tmp_path, library=ctypes.CDLL(str(stand_ins[0])))
    chips = backend.chips()
    assert [c.driver_version for c in chips] == ["4.3.0", "4.3.0"]
    device = dra_devices(chips, splitboard=True)[0]
    assert attributes(device, ILUVATAR)["driverVersion"] == {"version": "4.3.0"}
    # Read again on the next discovery: a driver upgraded under a running plugin is seen.
    monkeypatch.setenv("FAKE_IXML_DRIVER_VERSION", "4.3.0.20260101")
    chips = backend.chips()
    assert {c.driver_version for c in chips} == {"4.3.0.20260101"}
    # Not semver: published as a string rather than refused by the apiserver.
    device = dra_devices(chips, splitboard=False)[0]
    assert attributes(device, ILUVATAR)["driverVersion"] == {"string": "4.3.0.20260101"}
    backend.close()


def test_ixml_without_a_driver_version_publishes_none_and_says_so_once(
    stand_ins: tuple[Path, Path],
    script: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.delenv("FAKE_IXML_DRIVER_VERSION", raising=False)
    failing = IxmlBackend(root=tmp_path, library=ctypes.CDLL(str(stand_ins[0])))
    with caplog.at_level(logging.WARNING, logger="ix_gpu.node.backends.ixml"):
        for _ in range(3):
            chips = failing.chips()
    assert {c.driver_version for c in chips} == {""}
    assert "driverVersion" not in attributes(dra_devices(chips, splitboard=True)[0], ILUVATAR)
    warnings = [r.getMessage() for r in caplog.records if "nvmlSystemGetDriverVersion" in r.getMessage()]
    assert len(warnings) == 1 and "code 3" in warnings[0]
    failing.close()
    # A libixml that lacks the call: no version, no warning, discovery unchanged.
    caplog.clear()
    lacking = IxmlBackend(root=tmp_path, library=ctypes.CDLL(str(stand_ins[1])))
    chips = lacking.chips()
    assert [(c.uuid, c.driver_version) for c in chips] == [("GPU-ix-0", ""), ("GPU-ix-1", "")]
    assert not caplog.records
    lacking.close()


class _Nvml:
    """The pynvml calls the nvml backend makes, for two GPUs on one board."""

    class NVMLError(Exception):
        pass

    def __init__(self, version: str | bytes | None) -> None:
        self.version = version

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        if self.version is None:
            raise self.NVMLError("Not Supported")
        return self.version

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-nv-{h}"

    def nvmlDeviceGetBoardId(self, h: int) -> int:
        return 0x100

    def nvmlDeviceGetPciInfo(self, h: int) -> object:
        return type("Pci", (), {"busId": f"00000000:{0x3B + h:02X}:00.0"})()

    def nvmlDeviceGetMinorNumber(self, h: int) -> int:
        return h

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> object:
        return type("Mem", (), {"total": 141 * 1024**3})()


def test_nvml_reads_the_driver_version(tmp_path: Path) -> None:
    chips = NvmlBackend(root=tmp_path, nvml=_Nvml(b"570.124.06")).chips()
    assert [c.driver_version for c in chips] == ["570.124.06", "570.124.06"]
    # A leading zero is not semver: a string attribute.
    assert attributes(dra_devices(chips, splitboard=True)[1], NVIDIA)["driverVersion"] == {
        "string": "570.124.06"
    }
    chips = NvmlBackend(root=tmp_path, nvml=_Nvml("580.65.1")).chips()
    assert attributes(dra_devices(chips, splitboard=True)[0], NVIDIA)["driverVersion"] == {
        "version": "580.65.1"
    }
    chips = NvmlBackend(root=tmp_path, nvml=_Nvml(None)).chips()
    assert [(c.uuid, c.driver_version) for c in chips] == [("GPU-nv-0", ""), ("GPU-nv-1", "")]
