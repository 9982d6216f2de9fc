"""The CDI hook's script, run as the OCI runtime runs a createContainer hook: ``/bin/sh`` with the
spec's args and env, the container state on stdin, and a bundle whose ``config.json`` names the
root. The root here is a directory with the driver's libraries where the CDI mount would put them;
the cache the host's ldconfig writes into it is read back with ``ldconfig -p``.

ldconfig ``-r`` chroots, which needs root: as another user the script runs in a user namespace
where it is root (``unshare -r``), as the runtime's own hooks run as root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ix_gpu.node.devices.ldcache_hook import ldcache_hook

HERE = Path(__file__).parent
LIBRARY_DIR = "/usr/local/corex/lib64"


def ldconfig() -> str:
    found = next((p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.access(p, os.X_OK)), None)
    assert found, "these tests need the host's glibc ldconfig, as the hook does"
    return found


def as_root(argv: list[str]) -> list[str]:
    return argv if os.geteuid() == 0 else ["unshare", "-r", *argv]


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """An OCI bundle: ``config.json`` (compact, as containerd writes it, with a user's env value and
    annotation that look like the fields the script reads) and ``rootfs`` with an image's
    ``/etc/ld.so.conf``, one image library and its symlink, and the driver's library."""
    bundle = tmp_path / "bundle"
    rootfs = bundle / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc, "these tests need a C compiler (gcc) to build the libixml stand-in"
    libraries = ((LIBRARY_DIR, "libixml.so", None), ("/usr/lib", "libapp.so.1.2", "libapp.so.1"))
    for directory, name, soname in libraries:
        (rootfs / directory.lstrip("/")).mkdir(parents=True, exist_ok=True)
        target = rootfs / directory.lstrip("/") / name
        flags = [f"-Wl,-soname,{soname}"] if soname else []
        source = str(HERE / "fake_ixml.c")
        subprocess.run([gcc, "-shared", "-fPIC", *flags, "-o", str(target), source], check=True)
    (rootfs / "usr/lib/libapp.so").symlink_to("libapp.so.1.2")
    config = {
        "ociVersion": "1.2.0",
        "process": {"env": ['TRAP="root":{"path":"/"}', "LD_LIBRARY_PATH=/opt/app/lib"]},
        "root": {"path": "rootfs"},
        "annotations": {"root": '{"path":"/"}'},
    }
    (bundle / "config.json").write_text(json.dumps(config, separators=(",", ":")))
    return bundle


def run_hook(bundle: Path | None) -> subprocess.CompletedProcess[str]:
    hook = ldcache_hook([LIBRARY_DIR])
    state: dict[str, Any] = {"ociVersion": "1.2.0", "id": "c1", "status": "creating", "pid": 1}
    if bundle is not None:
        state["bundle"] = str(bundle)
    state["annotations"] = {"bundle": "/nonexistent"}  # a user's key, after the real one
    return subprocess.run(
        as_root([hook["path"], *hook["args"][1:]]),
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


def test_the_spec_hook_runs_sh_with_the_script_inline_and_a_path_of_its_own() -> None:
    hook = ldcache_hook([LIBRARY_DIR])
    assert hook["hookName"] == "createContainer"
    assert hook["path"] == "/bin/sh" and hook["args"][:2] == ["sh", "-c"]
    assert hook["args"][3:] == ["ix-gpu-ldcache", LIBRARY_DIR]
    assert hook["env"] == ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
    assert 1 <= hook["timeout"] <= 60


def test_the_driver_library_enters_the_containers_cache_beside_the_images_own(bundle: Path) -> None:
    rootfs = bundle / "rootfs"
    result = run_hook(bundle)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    entries = cached(rootfs)
    assert entries["libixml.so"] == f"{LIBRARY_DIR}/libixml.so", entries
    assert entries["libapp.so.1"] == "/usr/lib/libapp.so.1", entries  # the image's, still there
    # -X: the image's links are left alone (ldconfig alone would make the libapp.so.1 link), and
    # nothing is written but the cache.
    assert sorted(p.name for p in (rootfs / "usr/lib").iterdir()) == ["libapp.so", "libapp.so.1.2"]
    assert sorted(p.name for p in (rootfs / "etc").iterdir()) == ["ld.so.cache", "ld.so.conf"]


def test_an_absolute_root_in_config_json_is_used_as_it_is(bundle: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (bundle / "rootfs").rename(elsewhere)
    config = json.loads((bundle / "config.json").read_text())
    config["root"] = {"path": str(elsewhere), "readonly": True}
    (bundle / "config.json").write_text(json.dumps(config))  # with spaces, as other runtimes write
    result = run_hook(bundle)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert cached(elsewhere)["libixml.so"] == f"{LIBRARY_DIR}/libixml.so"


@pytest.mark.parametrize("case", ["no bundle", "no config.json", "no root", "no etc"])
def test_what_it_cannot_do_leaves_the_cache_and_never_fails_the_container(bundle: Path, case: str) -> None:
    rootfs = bundle / "rootfs"
    if case == "no config.json":
        (bundle / "config.json").unlink()
    elif case == "no root":
        (bundle / "config.json").write_text('{"ociVersion":"1.2.0","process":{}}')
    elif case == "no etc":
        shutil.rmtree(rootfs / "etc")
    result = run_hook(None if case == "no bundle" else bundle)
    assert result.returncode == 0, result.stderr
    assert "ix-gpu-ldcache: " in result.stderr and "linker cache left as it was" in result.stderr
    assert not (rootfs / "etc" / "ld.so.cache").exists()
