"""The CDI hook's scripts, run as the OCI runtime runs a createContainer hook: ``/bin/sh`` with the
spec's args and env, the container state on stdin, and a bundle whose ``config.json`` names the
root. The root here is a directory with the driver's libraries where the CDI mount would put them;
the cache the host's ldconfig writes into it is read back with ``ldconfig -p``.

The hook runs as root (the runtime's hooks do): as another user the script runs in a user
namespace where it is root (``unshare -r``). ``runc_like`` runs it where runc does, in a mount and
pid namespace of the container's with procfs mounted in the root, so that ``/proc/1/root`` leads
back to this host's tree as it does on a node; the hostile roots below try every way out through
it, and a directory of this host is checked for any file created, changed or read into the cache.
The last test does the same under the real runc. The roots are in :mod:`tests.support.hostile_roots`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from ix_gpu.node.devices.ldcache_hook import LDCONFIG_BOUND_S, ldcache_hook
from tests.support.host_layouts import (
    LAYOUTS,
    PAYLOAD_MARK,
    SERVED,
    layer,
    payload_ran,
    plant_payload,
    probe_layer,
    within,
)
from tests.support.hostile_roots import (
    HOSTILE,
    LIBRARY_DIR,
    RUNC_REFUSES,
    as_root,
    cached,
    host_target,
    leftovers,
    make_bundle,
    regular,
    runc_create,
    runc_delete,
    runc_driver_bundle,
    snapshot,
)

BOUND_SLACK_S = 5
"""How long past the hook's own bound on ldconfig ``runc create`` may take: runc's own work."""

RUNC_LIKE = 'mount --rbind "$1" "$1" && mount -t proc proc "$1/proc" && shift && exec "$@"'
"""What runc has done by the time it runs a createContainer hook: the root bound onto itself and
procfs (of the container's new pid namespace) mounted in it, in a mount namespace of its own."""


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return make_bundle(tmp_path)


def run_hook(
    bundle: Path | None, *, runc_like: bool = False, layout: Path | None = None
) -> subprocess.CompletedProcess[str]:
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
    if layout is not None:
        argv = within(layout, argv)
    return subprocess.run(
        as_root(argv),
        input=json.dumps(state, separators=(",", ":")),
        env=dict(e.split("=", 1) for e in hook["env"]),
        capture_output=True,
        text=True,
        timeout=hook["timeout"],
        check=False,
    )


def test_the_spec_hook_runs_sh_with_the_scripts_inline_and_a_path_of_its_own() -> None:
    hook = ldcache_hook([LIBRARY_DIR])
    assert hook["hookName"] == "createContainer"
    assert hook["path"] == "/bin/sh" and hook["args"][:2] == ["sh", "-c"]
    assert hook["args"][3] == "ix-gpu-ldcache" and hook["args"][5:] == [str(LDCONFIG_BOUND_S), LIBRARY_DIR]
    assert "unshare --user --map-user=1 --map-group=1 --root=." in hook["args"][4]
    assert "--kill-child" in hook["args"][2] and hook["timeout"] > LDCONFIG_BOUND_S
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


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_root_reads_and_writes_nothing_outside_it(bundle: Path, tmp_path: Path, case: str) -> None:
    """The container starts (the hook exits 0), no file of the host directory the root aims at is
    created or changed, and no library there enters the container's cache. A root that the
    hook can still serve gets the driver's library."""
    host = host_target(tmp_path / "host")
    before = snapshot(host)
    rootfs = bundle / "rootfs"
    HOSTILE[case](rootfs, f"/proc/1/root{host}")
    started = time.monotonic()
    result = run_hook(bundle, runc_like=True)
    took = time.monotonic() - started
    print(result.stderr)
    assert result.returncode == 0, result.stderr
    assert took < LDCONFIG_BOUND_S + BOUND_SLACK_S, f"the hook took {took:.1f} s"
    assert leftovers(rootfs) == []
    assert snapshot(host) == before
    if not (rootfs / "etc").is_symlink() and regular(rootfs / "etc/ld.so.cache"):
        entries = cached(rootfs)
        assert not [path for path in entries.values() if "libhost" in path or str(host) in path], entries
        assert entries["libixml.so"] == f"{LIBRARY_DIR}/libixml.so", entries
    else:
        assert "linker cache left as it was" in result.stderr


@pytest.mark.parametrize("case", ["benign", *sorted(HOSTILE)])
def test_under_real_runc_the_hook_serves_the_driver_and_a_hostile_root_touches_no_host_file(
    runc: str, bundle: Path, tmp_path: Path, case: str
) -> None:
    """``runc create`` runs the hook as the node's runtime does (root, the container's mount and
    pid namespaces, procfs mounted in the root, before the switch to it). The container is
    created, the host directory is untouched, and a root that can be served finds the driver."""
    host = host_target(tmp_path / "host")
    driver = tmp_path / "driver"
    rootfs = bundle / "rootfs"
    runc_driver_bundle(bundle, driver, runc)
    if case != "benign":
        HOSTILE[case](rootfs, f"/proc/1/root{host}")
    before = snapshot(host), snapshot(driver)
    name = f"ix-gpu-ldcache-{os.getpid()}-{abs(hash(case)) % 10**6}"
    try:
        errors = tmp_path / "runc.err"
        started = time.monotonic()
        code = runc_create(runc, bundle, name, errors)
        took = time.monotonic() - started
        print(errors.read_text())
        if case in RUNC_REFUSES:  # runc guards its own mounts: such an image never runs
            assert code != 0 and "runc create failed" in errors.read_text()
        else:
            assert code == 0, errors.read_text()
        assert took < LDCONFIG_BOUND_S + BOUND_SLACK_S, f"runc create took {took:.1f} s"
        assert leftovers(rootfs) == []
        assert (snapshot(host), snapshot(driver)) == before
        if case == "benign":
            assert cached(rootfs)["libixml.so"] == f"{LIBRARY_DIR}/libixml.so"
    finally:
        runc_delete(runc, name)
    assert leftovers(rootfs) == []


@pytest.fixture
def as_host_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the host layouts are overlay mounts with whiteouts (mknod): root only; CI runs as root")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_on_every_host_layout_no_file_of_the_image_runs_and_a_static_ldconfig_serves(
    as_host_root: None, bundle: Path, tmp_path: Path, layout: str
) -> None:
    """The image's ``/bin/sh`` and program loader are the payload. On Ubuntu the host's
    ``ldconfig`` is a ``#!/bin/sh`` script (the kernel would take ``/bin/sh`` from the image), on a
    host with a dynamic one the kernel would take its loader from the image: only a static program
    is run, ``ldconfig.real`` first, and nothing of the image's ever is."""
    rootfs = bundle / "rootfs"
    plant_payload(rootfs, tmp_path)
    result = run_hook(bundle, runc_like=True, layout=layer(layout, tmp_path))
    print(result.stderr)
    assert result.returncode == 0, result.stderr
    assert payload_ran(rootfs) == []
    if layout in SERVED:
        assert result.stderr == ""
        assert cached(rootfs)["libixml.so"] == f"{LIBRARY_DIR}/libixml.so"
    else:
        assert "is not a static program" in result.stderr or "no ldconfig on this host" in result.stderr
        assert "linker cache left as it was" in result.stderr
        assert not (rootfs / "etc/ld.so.cache").exists()


def test_ldconfig_runs_with_no_capability_and_no_new_privileges(
    as_host_root: None, bundle: Path, tmp_path: Path
) -> None:
    """A host whose static ``ldconfig`` is the payload: the hook runs it as it runs ldconfig, and it
    says what it got: a user namespace's uid 1 (the host's root for files, root of nothing), no
    effective capability in any namespace, ``no_new_privs``, inside the image's root."""
    rootfs = bundle / "rootfs"
    result = run_hook(bundle, runc_like=True, layout=probe_layer(tmp_path))
    assert result.returncode == 0, result.stderr
    (line,) = (rootfs / PAYLOAD_MARK).read_text().splitlines()
    assert line == "ran as /proc/ldconfig: uid=1 euid=1 capeff=0000000000000000 nnp=1", line


@pytest.mark.parametrize("layout", LAYOUTS)
def test_under_real_runc_on_every_host_layout_no_file_of_the_image_runs(
    runc: str, bundle: Path, tmp_path: Path, layout: str
) -> None:
    """As above, with the hook run by ``runc create`` on each host layout: the container is
    created, the payload never runs, and the driver is cached where a static ldconfig exists."""
    driver = tmp_path / "driver"
    rootfs = bundle / "rootfs"
    runc_driver_bundle(bundle, driver, runc)
    plant_payload(rootfs, tmp_path)
    name = f"ix-gpu-ldcache-{os.getpid()}-{layout}"
    try:
        code = runc_create(runc, bundle, name, tmp_path / "runc.err", layer(layout, tmp_path))
        assert code == 0, (tmp_path / "runc.err").read_text()
        assert payload_ran(rootfs) == []
        if layout in SERVED:
            assert cached(rootfs)["libixml.so"] == f"{LIBRARY_DIR}/libixml.so"
        else:
            assert not (rootfs / "etc/ld.so.cache").exists()
    finally:
        runc_delete(runc, name)
