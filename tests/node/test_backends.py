"""The ixml binding against a gcc-built stand-in for libixml, and the devfs backend on a fake tree."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ix_gpu.devicemodel.vendors import ILUVATAR, NVIDIA
from ix_gpu.node.backends import make_backend
from ix_gpu.node.backends.base import BackendError
from ix_gpu.node.backends.devfs import DevfsBackend
from ix_gpu.node.devices.device_list import build_device_list
from tests.node.conftest import SCRIPT

HERE = Path(__file__).resolve().parent


def test_ixml_discovers_boards_positions_numa_and_memory(ixml_env: Path) -> None:
    backend = make_backend("ixml", root=ixml_env.parent / "root")
    chips = backend.chips()
    assert [c.uuid for c in chips] == ["GPU-ix-0", "GPU-ix-1", "GPU-ix-3", "GPU-ix-2"]
    assert [c.numa_node for c in chips] == [0, 0, 1, 1]
    assert {c.product for c in chips} == {"Iluvatar BI-V150"}
    assert {c.memory_mib for c in chips} == {32768}
    assert backend.control_nodes() == ("/dev/itrctl",)
    devices = build_device_list(chips, splitboard=False, replicas=1)
    # Board 1's position-0 chip is GPU-ix-2 although the library lists GPU-ix-3 first.
    assert devices.ids == ("GPU-ix-0", "GPU-ix-2")
    assert devices.physical[1].minors == (2, 3)
    assert len(build_device_list(chips, splitboard=True, replicas=4).devices) == 16
    backend.close()


def test_ixml_health_bits_lost_chip_and_library_failure(ixml_env: Path) -> None:
    backend = make_backend("ixml", root=ixml_env.parent / "root")
    assert all(c.healthy for c in backend.chips())
    ixml_env.write_text(SCRIPT.replace("GPU-ix-1 1 0 1 0 ", "GPU-ix-1 1 0 1 14 "))
    reasons = {c.uuid: c.unhealthy_reason for c in backend.chips()}
    assert reasons["GPU-ix-1"] == "over temperature, ECC error (health 0x14)"
    ixml_env.write_text(SCRIPT.replace("8b\n", "8b lost\n"))
    chips = {c.uuid: c for c in backend.chips()}
    assert chips["GPU-ix-1"].unhealthy_reason == "nvmlDeviceGetHandleByIndex_v2: GPU is lost (code 15)"
    assert chips["GPU-ix-1"].minor == 1  # remembered from when it was readable
    ixml_env.write_text("fail 999\n")
    with pytest.raises(BackendError, match=r"nvmlDeviceGetCount_v2: Unknown Error \(code 999\)"):
        backend.chips()
    ixml_env.write_text(SCRIPT)
    assert len(backend.chips()) == 4


def test_ixml_telemetry_one_call_per_figure_and_what_fails_is_absent(ixml_env: Path) -> None:
    """Through the real ctypes binding: power from milliwatts to watts, clocks from MHz to hertz,
    memory from bytes; a call the stub answers NOT_SUPPORTED leaves its figure out (never 0)."""
    figures = " util=37 memutil=12 used=2048 temp=91 power=155500 sm=1500 memclk=1200 sbe=5 dbe=1"
    ixml_env.write_text(SCRIPT.replace("GPU-ix-1 1 0 1 0 32768 8b", "GPU-ix-1 1 0 1 4 32768 8b" + figures))
    backend = make_backend("ixml", root=ixml_env.parent / "root")
    chips = {c.uuid: c for c in backend.chips()}
    assert backend.read_telemetry(chips["GPU-ix-1"]) == {
        "gpu_utilization": 37.0,
        "memory_utilization": 12.0,
        "memory_used_bytes": 2048.0 * 2**20,
        "memory_total_bytes": 32768.0 * 2**20,
        "temperature_celsius": 91.0,
        "power_watts": 155.5,
        "sm_clock_hertz": 1.5e9,
        "memory_clock_hertz": 1.2e9,
        "ecc_corrected_errors": 5.0,
        "ecc_uncorrected_errors": 1.0,
        "health_mask": 4.0,
    }
    # Nothing but what every chip answers: memory (used 0 is a reading) and the health mask.
    assert backend.read_telemetry(chips["GPU-ix-0"]) == {
        "memory_used_bytes": 0.0,
        "memory_total_bytes": 32768.0 * 2**20,
        "health_mask": 0.0,
    }
    ixml_env.write_text(SCRIPT.replace("8b\n", "8b lost\n"))
    backend.chips()  # the stub re-reads its script on a count
    assert backend.read_telemetry(chips["GPU-ix-1"]) == {}  # a lost chip: no figure at all
    backend.close()


class TelemetryNvml:
    """pynvml's telemetry calls, for one GPU whose temperature read fails."""

    class NVMLError(Exception):
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, h: int) -> object:
        return type("Rates", (), {"gpu": 80, "memory": 40})()

    def nvmlDeviceGetMemoryInfo(self, h: int) -> object:
        return type("Mem", (), {"used": 10 * 1024**3, "total": 141 * 1024**3})()

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 512_000

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return {1: 1980, 2: 2619}[clock]

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter_type: int) -> int:
        assert counter_type == 0  # volatile: since the driver loaded, as DCGM's *_VOL_TOTAL
        return {0: 7, 1: 0}[error_type]  # corrected, uncorrected


def test_nvml_telemetry_converts_units_and_leaves_out_what_fails() -> None:
    from ix_gpu.node.backends.base import Chip
    from ix_gpu.node.backends.nvml import NvmlBackend

    backend = NvmlBackend.__new__(NvmlBackend)  # the calls under test need only the binding
    backend.nvml = TelemetryNvml()
    chip = Chip("GPU-nv-0", 0, 0, "board-0", 0, "NVIDIA H200", 141 * 1024, None)
    assert backend.read_telemetry(chip) == {
        "gpu_utilization": 80.0,
        "memory_utilization": 40.0,
        "memory_used_bytes": 10.0 * 1024**3,
        "memory_total_bytes": 141.0 * 1024**3,
        "power_watts": 512.0,
        "sm_clock_hertz": 1.98e9,
        "memory_clock_hertz": 2.619e9,
        "ecc_corrected_errors": 7.0,
        "ecc_uncorrected_errors": 0.0,
    }


def test_ixml_stub_reads_its_devices_beside_the_driver_root_and_names_the_product(
    libixml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device plugin container has only the driver root mounted, no FAKE_IXML_SCRIPT: the stub
    then reads <driver root>/fake-ixml-devices, whose ``name`` line is the product every chip
    reports (how the real-node tier gives its two nodes different products)."""
    corex = tmp_path / "corex"
    (corex / "lib64").mkdir(parents=True)
    shutil.copy(libixml / "lib64" / "libixml.so", corex / "lib64" / "libixml.so")  # a fresh dlopen
    (corex / "fake-ixml-devices").write_text("name Iluvatar BI-V100\nGPU-v100-0 0 0 0 0 32768 8a\n")
    monkeypatch.delenv("FAKE_IXML_SCRIPT", raising=False)
    monkeypatch.setenv("COREX_HOME", str(corex))
    backend = make_backend("ixml", root=tmp_path)
    chips = backend.chips()
    assert [(c.uuid, c.product, c.minor) for c in chips] == [("GPU-v100-0", "Iluvatar BI-V100", 0)]
    backend.close()


def test_missing_library_names_every_place_looked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("COREX_HOME", str(tmp_path))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    with pytest.raises(BackendError) as info:
        make_backend("ixml")
    message = str(info.value)
    assert f"{tmp_path}/lib64/libixml.so: not found" in message
    assert "/usr/local/corex/lib64/libixml.so" in message


def pci(root: Path, address: str, vendor: int, pci_class: int, numa: int = -1) -> None:
    dev = root / "sys/bus/pci/devices" / address
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(f"0x{vendor:04x}\n")
    (dev / "class").write_text(f"0x{pci_class:06x}\n")
    (dev / "device").write_text("0x0001\n")
    (dev / "numa_node").write_text(f"{numa}\n")


def test_devfs_pairs_pci_functions_with_device_nodes(tmp_path: Path) -> None:
    pci(tmp_path, "0000:8a:00.0", ILUVATAR.pci_vendor_id, 0x120000, numa=0)
    pci(tmp_path, "0000:8b:00.0", ILUVATAR.pci_vendor_id, 0x120000, numa=1)
    pci(tmp_path, "0000:00:1f.0", 0x8086, 0x060100)
    (tmp_path / "dev").mkdir()
    for name in ("iluvatar0", "iluvatar1", "itrctl", "iluvatar-foo"):
        (tmp_path / "dev" / name).touch()
    backend = DevfsBackend(root=tmp_path)
    assert backend.vendor is ILUVATAR
    chips = backend.chips()
    assert [(c.uuid, c.minor, c.numa_node, c.healthy) for c in chips] == [
        ("PCI-0000:8a:00.0", 0, 0, True),
        ("PCI-0000:8b:00.0", 1, 1, True),
    ]
    assert backend.control_nodes() == ("/dev/itrctl",)
    os.remove(tmp_path / "dev" / "iluvatar1")
    assert chips[1].uuid == backend.chips()[1].uuid
    assert backend.chips()[1].unhealthy_reason == "no device node for PCI device 0000:8b:00.0"


def test_devfs_skips_nvidia_audio_function_and_finds_nothing_on_empty_tree(tmp_path: Path) -> None:
    pci(tmp_path, "0000:3b:00.0", NVIDIA.pci_vendor_id, 0x030200)
    pci(tmp_path, "0000:3b:00.1", NVIDIA.pci_vendor_id, 0x040300)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch()
    backend = DevfsBackend(root=tmp_path)
    assert backend.vendor is NVIDIA
    assert [c.uuid for c in backend.chips()] == ["PCI-0000:3b:00.0"]
    with pytest.raises(BackendError, match="no GPU PCI devices"):
        DevfsBackend(root=tmp_path / "empty")


class FakeNvml:
    """Just enough of pynvml's surface, with pynvml's own error type semantics."""

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        self.lost: set[int] = set()
        self.count_error: str | None = None
        self.boards = [0x100, 0x100, 0]

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        if self.count_error:
            raise self.NVMLError(self.count_error)
        return 3

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index in self.lost:
            raise self.NVMLError("GPU is lost")
        return index

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-nv-{h}"

    def nvmlDeviceGetBoardId(self, h: int) -> int:
        return self.boards[h]

    def nvmlDeviceGetPciInfo(self, h: int) -> object:
        return type("Pci", (), {"busId": f"00000000:{0x3B + h:02X}:00.0".encode()})()

    def nvmlDeviceGetMinorNumber(self, h: int) -> int:
        return h

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> object:
        return type("Mem", (), {"total": 141 * 1024**3})()


def test_nvml_boards_numa_and_lost_gpu(tmp_path: Path) -> None:
    from ix_gpu.node.backends.nvml import NvmlBackend

    dev = tmp_path / "sys/bus/pci/devices/0000:3c:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    fake = FakeNvml()
    backend = NvmlBackend(root=tmp_path, nvml=fake)
    assert backend.vendor is NVIDIA
    chips = backend.chips()
    assert [(c.uuid, c.board_position, c.numa_node, c.memory_mib) for c in chips] == [
        ("GPU-nv-0", 0, None, 141 * 1024),
        ("GPU-nv-1", 1, 1, 141 * 1024),
        ("GPU-nv-2", 0, None, 141 * 1024),
    ]
    assert build_device_list(chips, splitboard=False, replicas=1).ids == ("GPU-nv-0", "GPU-nv-2")
    fake.lost.add(1)
    lost = backend.chips()[1]
    assert (lost.uuid, lost.unhealthy_reason) == ("GPU-nv-1", "NVML: GPU is lost")
    fake.count_error = "Driver Not Loaded"
    with pytest.raises(BackendError, match="Driver Not Loaded"):
        backend.chips()


def test_nvml_without_the_driver_fails_before_importing_pynvml() -> None:
    """``auto`` tries nvml on every node that ixml does not serve; without NVIDIA's library that must
    not leave pynvml (about 2 MiB) imported for the life of the plugin. A fresh interpreter, since
    this test process may have imported pynvml already."""
    import ctypes
    import sys

    from ix_gpu.node.backends.nvml import NVML_LIBRARY

    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        pass
    else:
        pytest.skip(f"{NVML_LIBRARY} is installed on this machine")
    probe = (
        "import sys\n"
        "from ix_gpu.node.backends import make_backend\n"
        "from ix_gpu.node.backends.base import BackendError\n"
        "try:\n"
        "    make_backend('nvml')\n"
        "except BackendError as exc:\n"
        "    print(exc)\n"
        "print('pynvml' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    message, imported = result.stdout.splitlines()
    assert message.startswith(f"nvmlInit: {NVML_LIBRARY} cannot be loaded")
    assert imported == "False"
