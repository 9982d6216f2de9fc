"""The CDI hook's scripts, run as the OCI runtime runs a createContainer hook: ``/bin/sh`` with the
spec's args and env, the container state on stdin, and a bundle whose ``config.json`` names the
root. The root here is a directory with the driver's libraries where the CDI mount would put them;
the cache the host's ldconfig writes into it is read back with ``ldconfig -p``.

The hook runs as root (the runtime's hooks do): as another user the script runs in a user
namespace where it is root (``unshare -r``). ``runc_like`` runs it where runc does, in a mount and
pid namespace of the container's with procfs mounted in the root, so that ``/proc/1/root`` leads
back to this host's tree as it does on a node; the hostile roots below try every way out through
it, and a directory of this host is checked for any file created, changed or read into the cache.
``test_ldcache_hook_runc.py`` does the same under the real runc."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ix_gpu.node.devices.ldcache_hook import ldcache_hook

HERE = Path(__file__).parent
LIBRARY_DIR = "/usr/local/corex/lib64"
RUNC_LIKE = 'mount --rbind "$1" "$1" && mount -t proc proc "$1/proc" && shift && exec "$@"'
"""What runc has done by the time it runs a createContainer hook: the root bound onto itself and
procfs (of the container's new pid namespace) mounted in it, in a mount namespace of its own."""


def ldconfig() -> str:
    found = next((p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.access(p, os.X_OK)), None)
    assert found, "these tests need the host's glibc ldconfig, as the hook does"
    return found


def as_root(argv: list[str]) -> list[str]:
    return argv if os.geteuid() == 0 else ["unshare", "-r", *argv]


def build_library(target: Path, soname: str | None = None) -> None:
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc, "these tests need a C compiler (gcc) to build the libixml stand-in"
    target.parent.mkdir(parents=True, exist_ok=True)
    flags = [f"-Wl,-soname,{soname}"] if soname else []
    subprocess.run(
        [gcc, "-shared", "-fPIC", *flags, "-o", str(target), str(HERE / "fake_ixml.c")], check=True
    )


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
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


def run_hook(bundle: Path | None, *, runc_like: bool = False) -> subprocess.CompletedProcess[str]:
    hook = ldcache_hook([LIBRARY_DIR])
    state: dict[str, Any] = {"ociVersion": "1.2.0", "id": "c1", "status": "creating", "pid": 1}
    if bundle is not None:
        state["bundle"] = str(bundle)
    state["annotations"] = {"bundle": "/nonexistent"}  # a user's key, after the real one
    argv = [hook["path"], *hook["args"][1:]]
    if runc_like:
        assert bundle is not None
        namespaces = ["unshare", "--mount", "--propagation", "private", "--pid", "--fork"]
        argv = [*namespaces, "sh", "-c", RUNC_LIKE, "runc-like", str(bundle / "rootfs"), *argv]
    return subprocess.run(
        as_root(argv),
        input=json.dumps(state, separators=(",", ":")),
        env=dict(e.split("=", 1) for e in hook["env"]),
        capture_output=True,
        text=True,
        timeout=hook["timeout"],
        check=False,
    )


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


def test_the_spec_hook_runs_sh_with_the_scripts_inline_and_a_path_of_its_own() -> None:
    hook = ldcache_hook([LIBRARY_DIR])
    assert hook["hookName"] == "createContainer"
    assert hook["path"] == "/bin/sh" and hook["args"][:2] == ["sh", "-c"]
    assert hook["args"][3] == "ix-gpu-ldcache" and hook["args"][5:] == [LIBRARY_DIR]
    assert "setpriv" in hook["args"][4] and "mount --move" in hook["args"][4]
    assert hook["env"] == ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
    assert 1 <= hook["timeout"] <= 60


@pytest.mark.parametrize("runc_like", [False, True], ids=["plain", "runc-like"])
def test_the_driver_library_enters_the_containers_cache_beside_the_images_own(
    bundle: Path, runc_like: bool
) -> None:
    rootfs = bundle / "rootfs"
    result = run_hook(bundle, runc_like=runc_like)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    entries = cached(rootfs)
    assert entries["libixml.so"] == f"{LIBRARY_DIR}/libixml.so", entries
    assert entries["libapp.so.1"] == "/usr/lib/libapp.so.1", entries  # the image's, still there
    # -X: the image's links are left alone (ldconfig alone would make the libapp.so.1 link), and
    # nothing is written but the cache: not in the root, and not in what the runtime mounted.
    assert sorted(p.name for p in (rootfs / "usr/lib").iterdir()) == ["libapp.so", "libapp.so.1.2"]
    assert sorted(p.name for p in (rootfs / "etc").iterdir()) == ["ld.so.cache", "ld.so.conf"]
    assert [list((rootfs / d).iterdir()) for d in ("proc", "sys", "dev")] == [[], [], []]


def test_an_absolute_root_in_config_json_is_used_as_it_is(bundle: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (bundle / "rootfs").rename(elsewhere)
    config = json.loads((bundle / "config.json").read_text())
    config["root"] = {"path": str(elsewhere), "readonly": True}
    (bundle / "config.json").write_text(json.dumps(config))  # with spaces, as other runtimes write
    result = run_hook(bundle)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert cached(elsewhere)["libixml.so"] == f"{LIBRARY_DIR}/libixml.so"


@pytest.mark.parametrize("case", ["no bundle", "no config.json", "no root", "no etc", "no proc"])
def test_what_it_cannot_do_leaves_the_cache_and_never_fails_the_container(bundle: Path, case: str) -> None:
    rootfs = bundle / "rootfs"
    if case == "no config.json":
        (bundle / "config.json").unlink()
    elif case == "no root":
        (bundle / "config.json").write_text('{"ociVersion":"1.2.0","process":{}}')
    elif case == "no etc":
        shutil.rmtree(rootfs / "etc")
    elif case == "no proc":
        (rootfs / "proc").rmdir()
    result = run_hook(None if case == "no bundle" else bundle)
    assert result.returncode == 0, result.stderr
    assert "ix-gpu-ldcache: " in result.stderr and "linker cache left as it was" in result.stderr
    assert not (rootfs / "etc" / "ld.so.cache").exists()


# Hostile image roots. Each is given the host directory ``host`` (as seen from the root's own
# procfs, ``/proc/1/root<host>``) to aim at, and makes its root with it.
HOSTILE: dict[str, Callable[[Path, str], None]] = {}


def hostile(name: str) -> Callable[[Callable[[Path, str], None]], Callable[[Path, str], None]]:
    def register(make: Callable[[Path, str], None]) -> Callable[[Path, str], None]:
        HOSTILE[name] = make
        return make

    return register


def link(path: Path, target: str) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


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
    os.mkfifo(rootfs / "etc/ld.so.cache")
    (rootfs / "var/cache/ldconfig").mkdir(parents=True)
    os.mkfifo(rootfs / "var/cache/ldconfig/aux-cache")


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


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_root_reads_and_writes_nothing_outside_it(bundle: Path, tmp_path: Path, case: str) -> None:
    """The container starts (the hook exits 0), no file of the host directory the root aims at is
    created or changed, and no library there enters the container's cache. A root that the
    hook can still serve gets the driver's library."""
    host = tmp_path / "host"
    build_library(host / "lib/libhost.so.1", "libhost.so.1")
    (host / "host.conf").write_text(f"{host}/lib\n")
    (host / "keep").write_text("the host's\n")
    before = snapshot(host)
    rootfs = bundle / "rootfs"
    HOSTILE[case](rootfs, f"/proc/1/root{host}")
    result = run_hook(bundle, runc_like=True)
    print(result.stderr)
    assert result.returncode == 0, result.stderr
    assert snapshot(host) == before
    if not (rootfs / "etc").is_symlink() and regular(rootfs / "etc/ld.so.cache"):
        entries = cached(rootfs)
        assert not [path for path in entries.values() if "libhost" in path or str(host) in path], entries
        assert entries["libixml.so"] == f"{LIBRARY_DIR}/libixml.so", entries
    else:
        assert "linker cache left as it was" in result.stderr


RUNC_REFUSES = {"dev is a link to the host", "sys is a link to the host"}


def runc_bundle(bundle: Path, driver: Path) -> None:
    """``bundle`` made into a real runc bundle: ``runc spec``'s config with the driver's root bound
    read-only where the CDI spec mounts it, and the hook as the CDI spec adds it. The process is
    the host's static ldconfig (in the root, never run: the test stops at ``runc create``)."""
    (bundle / "config.json").unlink()
    subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["process"].update(terminal=False, args=["/sbin/ldconfig", "-p"])
    config["root"] = {"path": "rootfs", "readonly": False}
    mount = {"type": "bind", "source": str(driver), "destination": "/usr/local/corex"}
    config["mounts"].append({**mount, "options": ["rbind", "ro", "nosuid", "nodev"]})
    hook = ldcache_hook([LIBRARY_DIR])
    config["hooks"] = {"createContainer": [{key: hook[key] for key in ("path", "args", "env", "timeout")}]}
    (bundle / "config.json").write_text(json.dumps(config))
    (bundle / "rootfs/sbin").mkdir(exist_ok=True)
    shutil.copy(ldconfig(), bundle / "rootfs/sbin/ldconfig")


@pytest.fixture
def runc() -> str:
    if os.geteuid() != 0:
        pytest.skip("runc runs containers as root only; scripts/test.sh runs these as root (CI does)")
    found = shutil.which("runc")
    assert found, "runc is installed by tests/k8s/node-packages.sh, which scripts/test.sh runs as root"
    return found


@pytest.mark.parametrize("case", ["benign", *sorted(HOSTILE)])
def test_under_real_runc_the_hook_serves_the_driver_and_a_hostile_root_touches_no_host_file(
    runc: str, bundle: Path, tmp_path: Path, case: str
) -> None:
    """``runc create`` runs the hook as the node's runtime does (root, the container's mount and
    pid namespaces, procfs mounted in the root, before the switch to it). The container is
    created, the host directory is untouched, and a root that can be served finds the driver."""
    host = tmp_path / "host"
    build_library(host / "lib/libhost.so.1", "libhost.so.1")
    (host / "keep").write_text("the host's\n")
    driver = tmp_path / "driver"
    (driver / "lib64").mkdir(parents=True)
    rootfs = bundle / "rootfs"
    shutil.move(rootfs / LIBRARY_DIR.lstrip("/") / "libixml.so", driver / "lib64/libixml.so")
    shutil.rmtree(rootfs / "usr/local/corex/lib64")
    runc_bundle(bundle, driver)
    if case != "benign":
        HOSTILE[case](rootfs, f"/proc/1/root{host}")
    before = snapshot(host), snapshot(driver)
    name = f"ix-gpu-ldcache-{os.getpid()}-{abs(hash(case)) % 10**6}"
    try:
        # The created container's init keeps runc's stdio open: a pipe would never close.
        errors = tmp_path / "runc.err"
        with errors.open("w") as err:
            created = subprocess.run(
                [runc, "create", "--bundle", str(bundle), name],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                timeout=60,
                check=False,
            )
        print(errors.read_text())
        if case in RUNC_REFUSES:  # runc guards its own mounts: such an image never runs
            assert created.returncode != 0 and "runc create failed" in errors.read_text()
        else:
            assert created.returncode == 0, errors.read_text()
        assert (snapshot(host), snapshot(driver)) == before
        if case == "benign":
            assert cached(rootfs)["libixml.so"] == f"{LIBRARY_DIR}/libixml.so"
    finally:
        subprocess.run([runc, "delete", "--force", name], capture_output=True, timeout=60, check=False)
