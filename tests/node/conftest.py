"""Fixtures of the node layer's suites: libixml's stand-in (tests/node/fake_ixml.c) compiled once,
the environment that points the ixml backend at it with a scripted set of chips, and the real
nodes' runc for the tests that run ``runc create`` themselves."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.tier_runc import tier_runc

HERE = Path(__file__).resolve().parent

SCRIPT = """\
GPU-ix-0 0 0 0 0 32768 8a
GPU-ix-1 1 0 1 0 32768 8b
GPU-ix-3 3 1 1 0 32768 8d
GPU-ix-2 2 1 0 0 32768 8c
"""


@pytest.fixture(scope="module")
def libixml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Compile tests/node/fake_ixml.c into <COREX_HOME>/lib64/libixml.so."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc, "these tests need a C compiler (gcc) to build the libixml stand-in"
    corex_home = tmp_path_factory.mktemp("corex")
    (corex_home / "lib64").mkdir()
    subprocess.run(
        [
            gcc,
            "-shared",
            "-fPIC",
            "-O1",
            "-o",
            str(corex_home / "lib64" / "libixml.so"),
            str(HERE / "fake_ixml.c"),
        ],
        check=True,
    )
    return corex_home


@pytest.fixture
def ixml_env(libixml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    script = tmp_path / "script"
    script.write_text(SCRIPT)
    root = tmp_path / "root"
    for bus, numa in (("8a", 0), ("8b", 0), ("8c", 1), ("8d", 1)):
        dev = root / "sys/bus/pci/devices" / f"0000:{bus}:00.0"
        dev.mkdir(parents=True)
        (dev / "numa_node").write_text(f"{numa}\n")
    (root / "dev").mkdir()
    (root / "dev/itrctl").touch()
    monkeypatch.setenv("COREX_HOME", str(libixml))
    monkeypatch.setenv("FAKE_IXML_SCRIPT", str(script))
    yield script


@pytest.fixture
def runc() -> str:
    """The real nodes' runc (tests/support/tier_runc.py: built from the module proxy on first use,
    then cached), so what these tests prove of runc holds for the tier's nodes."""
    if os.geteuid() != 0:
        pytest.skip("runc runs containers as root only; scripts/test.sh runs these as root (CI does)")
    return tier_runc()
