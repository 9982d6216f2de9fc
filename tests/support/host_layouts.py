"""The node's own ``ldconfig`` as each family of hosts ships it, for the linker-cache hook's tests and
``bench/adversarial_node.py``; and the payload a hostile image plants where a careless hook would
execute it.

The hook runs whatever ``ldconfig`` the node has, so one host's layout proves nothing about the
others. Each layout here is a directory laid over ``/usr/sbin`` (and ``/sbin`` where that is not a
link to it) by an overlay mount in a private mount namespace of the command under test (:func:`within`):
the host's own files stay as they are, and the command (the hook, or ``runc create`` and so the hook)
sees the layout's ``ldconfig`` and ``ldconfig.real``:

- ``debian-rhel``: ``ldconfig`` a static program (Debian, RHEL and its rebuilds, SUSE);
- ``ubuntu``: ``ldconfig`` a ``#!/bin/sh`` wrapper that runs ``ldconfig.real``, the static program;
- ``dynamic``: ``ldconfig`` a dynamic program, whose loader the kernel takes from the current root;
- ``none``: neither (a musl host, a minimal image).

The overlay's whiteouts need root (``mknod``), so these run as root, as CI does.
"""

from __future__ import annotations

import os
import shutil
import stat
import struct
import subprocess
from pathlib import Path

from tests.support.paths import ROOT

PAYLOAD_SOURCE = ROOT / "tests/node/payload.c"
PAYLOAD_MARK = "ix-gpu-payload-ran"
"""The file the payload appends to, at the top of whatever root it runs in."""

LAYOUTS = ("debian-rhel", "ubuntu", "dynamic", "none")
SERVED = {"debian-rhel": "ldconfig", "ubuntu": "ldconfig.real"}
"""The layouts where a static ldconfig exists, and which file it is; elsewhere the hook must skip."""

WRAPPER = (
    "#!/bin/sh\n"
    "# As on Ubuntu: the name everyone calls is a script around the real program.\n"
    'exec /sbin/ldconfig.real "$@"\n'
)

WITHIN = (
    'layer=$1; shift; for dir in /usr/sbin /sbin; do [ -L "$dir" ] || '
    'mount -t overlay ix-gpu-host -o "lowerdir=$layer:$dir" "$dir" || exit 1; done; exec "$@"'
)

PT_INTERP = 3


def interpreter(program: Path) -> str | None:
    """The loader a 64-bit little-endian ELF program names (``PT_INTERP``), or None (static)."""
    data = program.read_bytes()
    assert data[:6] == b"\x7fELF\x02\x01", f"{program} is not a 64-bit little-endian ELF program"
    (phoff,) = struct.unpack_from("<Q", data, 32)
    size, count = struct.unpack_from("<HH", data, 54)
    for index in range(count):
        header = phoff + index * size
        kind, _flags, offset, _vaddr, _paddr, filesz = struct.unpack_from("<IIQQQQ", data, header)
        if kind == PT_INTERP:
            return data[offset : offset + filesz].rstrip(b"\0").decode()
    return None


def host_ldconfig() -> Path:
    """This machine's static glibc ldconfig, which the static layouts copy."""
    for name in ("ldconfig.real", "ldconfig"):
        for path in (Path("/sbin") / name, Path("/usr/sbin") / name):
            if path.is_file() and interpreter(path) is None:
                return path
    raise AssertionError("these tests need a static glibc ldconfig on this machine, as glibc builds it")


def compile_c(source: Path, target: Path, *flags: str) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc, "these tests need a C compiler (gcc)"
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([gcc, "-O2", *flags, "-o", str(target), str(source)], check=True)
    return target


def payload(work: Path) -> Path:
    """The payload: freestanding and static-pie, so the kernel runs it as a program or as a
    program's loader."""
    target = work / "payload"
    if target.exists():
        return target
    return compile_c(PAYLOAD_SOURCE, target, "-nostdlib", "-static-pie", "-fPIE", "-fno-stack-protector")


def dynamic_program(work: Path) -> Path:
    target = work / "dynamic"
    if not target.exists():
        source = work / "dynamic.c"
        source.write_text("int main(void) { return 0; }\n")
        compile_c(source, target)
    return target


def plant_payload(rootfs: Path, work: Path) -> None:
    """The payload as the image's ``/bin/sh`` (what ``#!/bin/sh`` names) and as its loader (what this
    machine's dynamic programs name as ``PT_INTERP``)."""
    loader = interpreter(dynamic_program(work))
    assert loader, "gcc made a static program where a dynamic one was asked for"
    for path in ("/bin/sh", loader):
        target = rootfs / path.lstrip("/")
        if target.is_symlink() or target.exists():
            target.unlink()
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(payload(work), target)
        target.chmod(0o755)


def payload_ran(rootfs: Path) -> list[str]:
    """What the payload wrote, in the image's root or this machine's: nothing, or it ran."""
    found = []
    for mark in (rootfs / PAYLOAD_MARK, Path("/") / PAYLOAD_MARK):
        if mark.is_file():
            found += mark.read_text().splitlines()
    return found


def whiteout(path: Path) -> None:
    """An overlay whiteout: the name is absent in the merged directory."""
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(0, 0))


def layer(name: str, work: Path) -> Path:
    """The directory laid over ``/usr/sbin`` for layout ``name`` (built once under ``work``)."""
    assert name in LAYOUTS, name
    directory = work / f"layout-{name}"
    if directory.exists():
        return directory
    directory.mkdir(parents=True)
    static = host_ldconfig()
    if name == "debian-rhel":
        shutil.copyfile(static, directory / "ldconfig")
        whiteout(directory / "ldconfig.real")
    elif name == "ubuntu":
        (directory / "ldconfig").write_text(WRAPPER)
        shutil.copyfile(static, directory / "ldconfig.real")
    elif name == "dynamic":
        shutil.copyfile(dynamic_program(work), directory / "ldconfig")
        whiteout(directory / "ldconfig.real")
    else:
        whiteout(directory / "ldconfig")
        whiteout(directory / "ldconfig.real")
    for program in directory.iterdir():
        if program.is_file():
            program.chmod(0o755)
    return directory


def probe_layer(work: Path) -> Path:
    """A layout whose static ``ldconfig`` is the payload: the hook runs it as it runs ldconfig, and
    what it writes says with what privilege (a test's view of the hook's confinement)."""
    directory = work / "layout-probe"
    if not directory.exists():
        directory.mkdir(parents=True)
        shutil.copyfile(payload(work), directory / "ldconfig")
        (directory / "ldconfig").chmod(0o755)
        whiteout(directory / "ldconfig.real")
    return directory


def within(layout: Path, argv: list[str]) -> list[str]:
    """``argv`` run in a mount namespace of its own where ``layout`` lies over ``/usr/sbin``."""
    namespace = ["unshare", "--mount", "--propagation", "private"]
    return [*namespace, "sh", "-c", WITHIN, "within", str(layout), *argv]
