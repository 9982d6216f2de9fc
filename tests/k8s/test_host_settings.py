"""The real-node tier's host settings (host_settings.py): set for the tier's run, put back after it,
and a machine that cannot set them skips the tier with the reason instead of failing.

The first tests run the module against a directory standing in for /proc/sys. The last two run the
real-node module itself in a pytest of its own, on this machine's kernel: once with /proc/sys
read-only (a private mount and network namespace, where ip_forward starts at 0), once as a user
other than root (a user namespace), and read what pytest reports. The real-node modules prove the
rest on the real thing: test_real_nodes.py starts from ip_forward = 0 and its fixture checks every
setting is back afterwards.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s import host_settings
from tests.support.paths import ROOT

FRESH = {
    "net/ipv4/ip_forward": "0",
    "fs/inotify/max_user_instances": "64",  # below the floors (a machine set lower than a kernel's default)
    "fs/inotify/max_user_watches": "4096",
}


@pytest.fixture
def proc_sys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A stand-in /proc/sys with a fresh machine's values, as root, with cgroups and iptables fine."""
    root = tmp_path / "sys"
    for key, value in FRESH.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_text(f"{value}\n")
    (root / "net" / "bridge").mkdir()
    monkeypatch.setattr(host_settings, "PROC_SYS", root)
    monkeypatch.setattr(host_settings, "STATE_FILE", tmp_path / "state.json")
    monkeypatch.setattr(host_settings, "_cgroup_problem", lambda: None)
    monkeypatch.setattr(host_settings, "_iptables_problem", lambda: None)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    yield root


def values(root: Path) -> dict[str, str]:
    return {key: (root / key).read_text().strip() for key in FRESH}


def test_apply_sets_what_the_tier_needs_and_restore_puts_back_the_machines_values(proc_sys: Path) -> None:
    changed = host_settings.apply()
    assert changed == {
        "net.ipv4.ip_forward": "0",
        "fs.inotify.max_user_instances": "64",
        "fs.inotify.max_user_watches": "4096",
    }
    assert values(proc_sys) == {
        "net/ipv4/ip_forward": "1",
        "fs/inotify/max_user_instances": "128",
        "fs/inotify/max_user_watches": "8192",
    }
    assert json.loads(host_settings.STATE_FILE.read_text())["sysctls"] == changed
    assert host_settings.pending(), "a changed setting is a leftover until it is put back"

    assert host_settings.restore() == changed
    assert values(proc_sys) == FRESH
    assert not host_settings.STATE_FILE.exists()
    assert host_settings.pending() == []
    assert host_settings.restore() == {}, "restore is idempotent"


def test_settings_already_as_needed_are_left_alone(proc_sys: Path) -> None:
    (proc_sys / "net/ipv4/ip_forward").write_text("1\n")
    (proc_sys / "fs/inotify/max_user_instances").write_text("8192\n")  # above the floor: kept
    assert host_settings.apply() == {"fs.inotify.max_user_watches": "4096"}
    assert (proc_sys / "fs/inotify/max_user_instances").read_text().strip() == "8192"
    host_settings.restore()
    assert values(proc_sys)["net/ipv4/ip_forward"] == "1"


def test_a_run_that_died_keeps_the_machines_own_values(proc_sys: Path) -> None:
    host_settings.apply()  # the first run dies here: nothing put back
    assert host_settings.apply() == {}, "the second run finds everything set"
    host_settings.restore()
    assert values(proc_sys) == FRESH, "the values recorded by the first run are the ones put back"


def test_a_setting_that_cannot_be_written_undoes_the_others_and_says_which(
    proc_sys: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ip_forward is written first, then max_user_instances fails: ip_forward must go back to 0.
    target = proc_sys / "fs/inotify/max_user_instances"
    real_write = host_settings._write

    def refuse(path: Path, value: str) -> None:
        if path == target:
            raise PermissionError(13, "Permission denied", str(path))
        real_write(path, value)

    monkeypatch.setattr(host_settings, "_write", refuse)
    with pytest.raises(host_settings.HostUnfit, match=r"cannot set fs\.inotify\.max_user_instances=128"):
        host_settings.apply()
    assert values(proc_sys) == FRESH
    assert not host_settings.STATE_FILE.exists()


def test_unfit_reasons_name_the_setting_and_why(proc_sys: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert host_settings.unfit_reason() is None
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    reason = host_settings.unfit_reason()
    assert reason is not None
    assert reason.startswith("net.ipv4.ip_forward is 0 and cannot be set to 1 here")
    assert "routes each node's pod range" in reason
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert (
        host_settings.unfit_reason()
        == "real nodes need root (namespaces, mounts, cgroups, iptables, sysctls)"
    )


# --------------------------------------------------------------------------- the real module, skipped


def run_real_node_module(prefix: list[str], tmp_path: Path) -> tuple[int, str, str]:
    """pytest on test_real_nodes.py under ``prefix``; (exit code, output, the report file)."""
    report = tmp_path / "report"
    env = {**os.environ, "IX_GPU_K8S": "1", "IX_GPU_TIER_REPORT": str(report)}
    result = subprocess.run(
        [
            *prefix,
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-rs",
            "tests/k8s/test_real_nodes.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return result.returncode, result.stdout + result.stderr, report.read_text() if report.exists() else ""


def only_skips(out: str) -> bool:
    """pytest's closing line counts skipped tests and nothing else."""
    last = out.strip().splitlines()[-1]
    return re.search(r"\d+ skipped", last) is not None and not re.search(r"passed|failed|error", last)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_with_a_read_only_proc_sys_the_real_node_tests_are_skipped_with_the_reason(tmp_path: Path) -> None:
    # A new network namespace starts with ip_forward = 0, as a fresh machine does; its /proc/sys is
    # then made read-only. Nothing of the host's settings is touched.
    script = 'mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec "$@"'
    rc, out, report = run_real_node_module(
        ["unshare", "--mount", "--net", "--propagation", "private", "sh", "-c", script, "sh"], tmp_path
    )
    assert rc == 0, out[-4000:]
    assert only_skips(out), out[-4000:]
    assert "real-node tier not run: net.ipv4.ip_forward is 0 and cannot be set to 1 here" in out, out[-4000:]
    assert "the real-node tier did not run" in out, "the session's summary says so"
    assert report.startswith("net.ipv4.ip_forward is 0 and cannot be set"), report


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_as_another_user_the_real_node_tests_are_skipped_with_the_reason(tmp_path: Path) -> None:
    rc, out, report = run_real_node_module(
        ["unshare", "--user", "--map-user=1000", "--map-group=1000"], tmp_path
    )
    assert rc == 0, out[-4000:]
    assert only_skips(out), out[-4000:]
    assert "real-node tier not run: real nodes need root" in out, out[-4000:]
    assert report.startswith("real nodes need root"), report
