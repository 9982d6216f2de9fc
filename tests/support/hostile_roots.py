"""Hostile image roots for the CDI linker-cache hook, and what runs the hook over them as the node's
runtime does: shared by ``tests/node/test_ldcache_hook.py`` and ``bench/adversarial_node.py``.

Each hostile root is the benign bundle's root (:func:`make_bundle`) changed by one builder of
:data:`HOSTILE`, aimed at a host directory through ``/proc/1/root<dir>``: where procfs is mounted in
the root, as it is when a createContainer hook runs, that path leads back to the host."""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ix_gpu.node.devices.ldcache_hook import ldcache_hook
from tests.support.host_layouts import within
from tests.support.paths import ROOT

FAKE_IXML = ROOT / "tests/node/fake_ixml.c"
LIBRARY_DIR = "/usr/local/corex/lib64"


def ldconfig() -> str:
    found = next((p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.access(p, os.X_OK)), None)
    assert found, "these tests need the host's glibc ldconfig, as the hook does"
    return found


def as_root(argv: list[str]) -> list[str]:
    return argv if os.geteuid() == 0 else ["unshare", "-r", *argv]


def build_library(target: Path, soname: str | None = None) -> None:
    """The libixml stand-in at ``target``, with ``soname``: compiled once per name in a process,
    then copied (the generated roots of ``bench/adversarial_node.py`` need thousands)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_compiled_library(soname), target)


@functools.cache
def _compiled_library(soname: str | None) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc, "these tests need a C compiler (gcc) to build the libixml stand-in"
    directory = Path(tempfile.mkdtemp(prefix="ix-gpu-library-"))
    atexit.register(shutil.rmtree, directory, True)
    target = directory / "library.so"
    flags = [f"-Wl,-soname,{soname}"] if soname else []
    subprocess.run([gcc, "-shared", "-fPIC", *flags, "-o", str(target), str(FAKE_IXML)], check=True)
    return target


def make_bundle(tmp_path: Path) -> Path:
    """An OCI bundle: ``config.json`` (compact, as containerd writes it, with a user's env value and
    annotation that look like the fields the script reads) and ``rootfs`` with the directories the
    runtime mounts on (``/proc``, ``/sys``, ``/dev``), an image's ``/etc/ld.so.conf``, one image
    library and its symlink, and the driver's library."""
    bundle = tmp_path / "bundle"
    rootfs = bundle / "rootfs"
    for directory in ("etc", "proc", "sys", "dev"):
        (rootfs / directory).mkdir(parents=True)
    (rootfs / "etc" / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    build_library(rootfs / LIBRARY_DIR.lstrip("/") / "libixml.so")
    build_library(rootfs / "usr/lib/libapp.so.1.2", "libapp.so.1")
    (rootfs / "usr/lib/libapp.so").symlink_to("libapp.so.1.2")
    config = {
        "ociVersion": "1.2.0",
        "process": {"env": ['TRAP="root":{"path":"/"}', "LD_LIBRARY_PATH=/opt/app/lib"]},
        "root": {"path": "rootfs"},
        "annotations": {"root": '{"path":"/"}'},
    }
    (bundle / "config.json").write_text(json.dumps(config, separators=(",", ":")))
    return bundle


def cached(rootfs: Path) -> dict[str, str]:
    """The root's linker cache: library name → path, as ``ldconfig -p`` prints it."""
    listing = subprocess.run(
        as_root([ldconfig(), "-r", str(rootfs), "-p"]), capture_output=True, text=True, check=True
    ).stdout
    entries = {}
    for line in listing.splitlines()[1:]:
        name, _, path = line.strip().partition(" => ")
        entries[name.split(" (")[0]] = path
    return entries


# Hostile image roots. Each is given the host directory ``host`` (as seen from the root's own
# procfs, ``/proc/1/root<host>``) to aim at, and makes its root with it.
HOSTILE: dict[str, Callable[[Path, str], None]] = {}


def hostile(name: str) -> Callable[[Callable[[Path, str], None]], Callable[[Path, str], None]]:
    def register(make: Callable[[Path, str], None]) -> Callable[[Path, str], None]:
        HOSTILE[name] = make
        return make

    return register


def clear(path: Path) -> Path:
    """``path`` with nothing there (what the image had is replaced), its parent made. Never follows
    ``path`` itself: it may be a link an earlier change aimed out of the root."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        shutil.rmtree(path)
    elif mode is not None:
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def link(path: Path, target: str) -> None:
    clear(path).symlink_to(target)


@hostile("aux-cache dir is a link to the host")
def _aux_cache_dir(rootfs: Path, out: str) -> None:
    link(rootfs / "var/cache/ldconfig", out)


@hostile("etc is a link to the host")
def _etc(rootfs: Path, out: str) -> None:
    link(rootfs / "etc", out)


@hostile("a SONAME with a newline, aux-cache dir a link")
def _soname(rootfs: Path, out: str) -> None:
    build_library(rootfs / "usr/lib/libevil.so.1", f"libevil.so.1\n{out}/planted")
    link(rootfs / "var/cache/ldconfig", out)


@hostile("the cache is a link to the host")
def _cache(rootfs: Path, out: str) -> None:
    link(rootfs / "etc/ld.so.cache", f"{out}/ld.so.cache")


@hostile("the cache's temporary file is a link to the host")
def _cache_temporary(rootfs: Path, out: str) -> None:
    link(rootfs / "etc/ld.so.cache~", f"{out}/ld.so.cache~")


@hostile("ld.so.conf names and includes host paths")
def _conf(rootfs: Path, out: str) -> None:
    lines = [
        f"include {out}/*.conf",
        f"{out}/lib",
        "/proc/self/root" + out.removeprefix("/proc/1/root") + "/lib",
    ]
    (rootfs / "etc/ld.so.conf").write_text("\n".join(lines) + "\n")


@hostile("a library directory is a link to the host")
def _library_dir(rootfs: Path, out: str) -> None:
    link(rootfs / "opt/lib", f"{out}/lib")
    (rootfs / "etc/ld.so.conf").write_text("/opt/lib\n")


@hostile("deep symlink loops")
def _loops(rootfs: Path, out: str) -> None:
    for i in range(60):
        link(rootfs / f"loop/{i}", f"/loop/{i + 1}")
    link(rootfs / "loop/60", "/loop/0")
    link(rootfs / "self", "/self/self")
    (rootfs / "etc/ld.so.conf").write_text("/loop/0\n/self\ninclude /loop/0/*\n")


@hostile("a huge ld.so.conf")
def _huge(rootfs: Path, out: str) -> None:
    (rootfs / "etc/ld.so.conf").write_text("".join(f"/usr/lib/d{i}\n" for i in range(200_000)))


@hostile("FIFOs in place of the cache and the aux-cache")
def _fifos(rootfs: Path, out: str) -> None:
    os.mkfifo(clear(rootfs / "etc/ld.so.cache"))
    os.mkfifo(clear(rootfs / "var/cache/ldconfig/aux-cache"))


@hostile("a library in a configured directory is a link to a FIFO")
def _library_fifo(rootfs: Path, out: str) -> None:
    os.mkfifo(clear(rootfs / "opt/pipe"))
    link(rootfs / "opt/lib/libfoo.so.1", "/opt/pipe")
    (rootfs / "etc/ld.so.conf").write_text("/opt/lib\n")


@hostile("ld.so.conf is a FIFO")
def _conf_fifo(rootfs: Path, out: str) -> None:
    os.mkfifo(clear(rootfs / "etc/ld.so.conf"))


@hostile("dev is a link to the host")
def _dev(rootfs: Path, out: str) -> None:
    link(rootfs / "dev", out)


@hostile("sys is a link to the host")
def _sys(rootfs: Path, out: str) -> None:
    link(rootfs / "sys", out)


def regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def snapshot(directory: Path) -> dict[str, tuple[int, int, str]]:
    """Every entry under ``directory``: mode, mtime and a digest of a file's content."""
    found = {}
    for path in sorted(directory.rglob("*")):
        info = path.lstat()
        digest = (
            hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() and not path.is_symlink() else ""
        )
        found[str(path.relative_to(directory))] = (info.st_mode, info.st_mtime_ns, digest)
    return found


def host_target(directory: Path) -> Path:
    """A host directory for a hostile root to aim at: a library of the host's, a configuration that
    names it, and a file of the host's. Returns ``directory``."""
    build_library(directory / "lib/libhost.so.1", "libhost.so.1")
    (directory / "host.conf").write_text(f"{directory}/lib\n")
    (directory / "keep").write_text("the host's\n")
    return directory


RUNC_REFUSES = {"dev is a link to the host", "sys is a link to the host"}
NODE_RUNC_REFUSES = {"etc is a link to the host"}
"""Roots the tier's runc (1.2 and later) runs alone but refuses on a node: the kubelet bind-mounts
``/etc/hosts``, ``/etc/hostname`` and ``/etc/resolv.conf`` into every container, and runc resolves a
mount target inside the root, where this ``/etc``, a link through ``/proc/1/root``, ends in ELOOP
("too many levels of symbolic links"). Debian's runc 1.1.5 followed it and ran the pod. Their
images are still built: on the real nodes a pod of one is refused, and its target left alone."""


def runc_bundle(bundle: Path, driver: Path, runc: str) -> None:
    """``bundle`` made into a real runc bundle: the config ``runc spec`` of ``runc`` writes, with the
    driver's root bound read-only where the CDI spec mounts it, and the hook as the CDI spec adds it.
    The process is the host's static ldconfig (in the root, never run: the test stops at ``runc
    create``)."""
    (bundle / "config.json").unlink()
    subprocess.run([runc, "spec", "--bundle", str(bundle)], check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["process"].update(terminal=False, args=["/sbin/ldconfig", "-p"])
    config["root"] = {"path": "rootfs", "readonly": False}
    mount = {"type": "bind", "source": str(driver), "destination": "/usr/local/corex"}
    config["mounts"].append({**mount, "options": ["rbind", "ro", "nosuid", "nodev"]})
    (bundle / "config.json").write_text(json.dumps(config))
    set_hook(bundle, ldcache_hook([LIBRARY_DIR]))
    (bundle / "rootfs/sbin").mkdir(exist_ok=True)
    shutil.copy(ldconfig(), bundle / "rootfs/sbin/ldconfig")


def set_hook(bundle: Path, hook: dict[str, Any] | None) -> None:
    """The runc bundle's createContainer hook: ``hook`` as a CDI spec carries it, or none."""
    config = json.loads((bundle / "config.json").read_text())
    config.pop("hooks", None)
    if hook is not None:
        fields = ("path", "args", "env", "timeout")
        config["hooks"] = {"createContainer": [{key: hook[key] for key in fields}]}
    (bundle / "config.json").write_text(json.dumps(config))


def runc_driver_bundle(bundle: Path, driver: Path, runc: str) -> None:
    """``bundle`` as :func:`runc_bundle` makes it, with the driver's library moved out of the root
    into ``driver``, which the bundle binds where the CDI spec mounts the driver's root."""
    rootfs = bundle / "rootfs"
    (driver / "lib64").mkdir(parents=True)
    shutil.move(rootfs / LIBRARY_DIR.lstrip("/") / "libixml.so", driver / "lib64/libixml.so")
    shutil.rmtree(rootfs / LIBRARY_DIR.lstrip("/"))
    runc_bundle(bundle, driver, runc)


def runc_create(runc: str, bundle: Path, name: str, errors: Path, layout: Path | None = None) -> int:
    """``runc create`` of ``bundle`` as ``name`` (the hook runs then), on the host ``layout``
    (:mod:`tests.support.host_layouts`) where one is given; its exit code, its stderr in
    ``errors``. The created container's init keeps runc's stdio open: a pipe would never close."""
    argv = [runc, "create", "--bundle", str(bundle), name]
    with errors.open("w") as err:
        created = subprocess.run(
            argv if layout is None else within(layout, argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            timeout=60,
            check=False,
        )
    return created.returncode


def timed_create(
    runc: str, bundle: Path, name: str, errors: Path, layout: Path | None = None
) -> tuple[int, float, list[str]]:
    """:func:`runc_create`, timed, then ``runc delete``: the exit code, the seconds ``runc create``
    took (the hook runs inside it), and the hook's processes left after the create and after the
    delete (:func:`leftovers`)."""
    started = time.monotonic()
    try:
        code = runc_create(runc, bundle, name, errors, layout)
        seconds = time.monotonic() - started
        left = leftovers(bundle / "rootfs")
    finally:
        runc_delete(runc, name)
    return code, seconds, left + leftovers(bundle / "rootfs")


def runc_delete(runc: str, name: str) -> None:
    subprocess.run([runc, "delete", "--force", name], capture_output=True, timeout=60, check=False)


def leftovers(rootfs: Path) -> list[str]:
    """Processes the hook started over ``rootfs`` that are still there: any whose command line names
    ``rootfs``, and any whose root directory is in it (ldconfig, chrooted there; the hooks of other
    containers on the machine, a real node's among them, run ldconfigs of their own)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            root = os.readlink(entry / "root")
        except OSError:
            continue
        line = " ".join(part.decode(errors="replace") for part in argv).strip()
        if str(rootfs) in line or root == str(rootfs) or root.startswith(f"{rootfs}/"):
            found.append(f"{entry.name}: {line[:200]}")
    return found


IMAGE_CASES = {
    re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-"): name for name in HOSTILE if name not in RUNC_REFUSES
}
"""The hostile roots an image can carry to a real node (those runc itself refuses never start), by
the name their image is tagged with (tests/k8s/build-images.sh)."""
TIER_TARGET = "/var/lib/ix-gpu-tier/hook-target"
"""The host directory the tier's hostile images aim at (``/proc/1/root`` + it), fixed at build time."""


def main(argv: list[str]) -> int:
    """``python -m tests.support.hostile_roots ROOT``: prints the image cases, one per line;
    ``... ROOT CASE``: makes ROOT (a copy of a benign image root) that case, aimed at the tier's
    target."""
    if len(argv) == 1:
        print("\n".join(IMAGE_CASES))
        return 0
    root, case = Path(argv[0]), argv[1]
    HOSTILE[IMAGE_CASES[case]](root, f"/proc/1/root{TIER_TARGET}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
