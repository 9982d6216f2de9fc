"""The host settings the real-node tier needs, set for its run and put back afterwards, as container
runtimes and kind do on a fresh machine.

A fresh machine of this kind has ``net.ipv4.ip_forward`` = 0, and the tier routes every pod's
traffic through the host. So before the tier's nodes start, ``apply()`` records each setting's value
in ``STATE_FILE`` and changes only the ones that are not already as the tier needs them;
``restore()`` writes the recorded values back and removes the file. ``cluster down`` and the test
fixtures' teardown call ``restore()`` (through ``real_nodes.cleanup``), and the pytest session's end
calls it again for a run that died between the two.

What the tier relies on from the host, and what this module does about each:

- **root**: namespaces, mounts, cgroups and iptables. Checked; without it the tier is skipped.
- **sysctls** (``SYSCTLS``): set when they differ, restored afterwards. A value that cannot be
  written (a read-only ``/proc/sys``, a container without the capability) skips the tier.
- **bridge netfilter** (``/proc/sys/net/bridge``, the ``br_netfilter`` module): each node sets
  ``bridge-nf-call-iptables`` in its own network namespace, so kube-proxy's rules see pod-to-Service
  traffic on the node's CNI bridge. Loaded with modprobe when missing (and unloaded again); a kernel
  that cannot load it skips the tier.
- **iptables and ip6tables** that work (the nf_tables or ip_tables kernel support): checked.
- **cgroups**: a v1 hierarchy for each controller the kubelet and runc use, or the unified v2
  mount. Checked, never mounted: how cgroups are mounted is the machine's own choice.

Everything here reads and writes ``PROC_SYS`` and ``STATE_FILE``, module attributes, so a unit test
can point them at a directory of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

PROC_SYS = Path("/proc/sys")
STATE_FILE = Path("/var/lib/ix-gpu-tier-host-settings.json")
"""The values the settings had before the tier changed them. Outside the tier's own directory,
which ``cleanup`` removes, so it survives until the settings are back."""


class HostUnfit(RuntimeError):
    """The machine cannot run the real-node tier; the message says why, for a skip."""


@dataclasses.dataclass(frozen=True)
class Sysctl:
    """A sysctl the tier needs: exactly ``value``, or (``at_least``) a number no lower."""

    key: str
    value: int
    why: str
    at_least: bool = False

    @property
    def path(self) -> Path:
        return PROC_SYS / self.key.replace(".", "/")

    def satisfied_by(self, current: str) -> bool:
        try:
            number = int(current.split()[0])
        except (ValueError, IndexError):
            return False
        return number >= self.value if self.at_least else number == self.value


SYSCTLS = (
    Sysctl(
        "net.ipv4.ip_forward",
        1,
        "the host routes each node's pod range to the node's network namespace, and pod traffic "
        "between nodes and to the apiserver",
    ),
    Sysctl(
        "fs.inotify.max_user_instances",
        128,
        "two kubelets, two containerds, three kube-proxies and the pods' own watchers share this "
        "per-user limit (all run as root); measured at the tier's peak: 25 instances. 128 is the "
        "kernel's default",
        at_least=True,
    ),
    Sysctl(
        "fs.inotify.max_user_watches",
        8192,
        "the kubelets and containerds watch the pods' volumes and logs; measured at the tier's "
        "peak: 321 watches. 8192 is the smallest default a kernel gives",
        at_least=True,
    ),
)

BRIDGE_NETFILTER = "br_netfilter"
CGROUP_V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "devices", "pids", "freezer")


def _read(path: Path) -> str:
    return path.read_text().strip()


def _write(path: Path, value: str) -> None:
    with path.open("w") as f:
        f.write(f"{value}\n")


def _cgroup_problem() -> str | None:
    v1: set[str] = set()
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        if fields[2] == "cgroup2" and fields[1] == "/sys/fs/cgroup":
            return None
        if fields[2] == "cgroup":
            v1.update(fields[3].split(","))
    missing = [c for c in CGROUP_V1_CONTROLLERS if c not in v1]
    if missing:
        return f"no cgroup hierarchy is mounted for {', '.join(missing)} (nor cgroup2 at /sys/fs/cgroup)"
    return None


def _iptables_problem() -> str | None:
    for command in ("iptables", "ip6tables"):
        if shutil.which(command) is None:
            return f"{command} is not installed (tests/k8s/node-packages.sh installs it)"
        result = subprocess.run([command, "-w", "-S"], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            return f"`{command} -S` fails here: {result.stderr.strip()}"
    return None


def unfit_reason() -> str | None:
    """Why this machine cannot run the real-node tier, or None. Changes nothing: a sysctl that
    differs from what the tier needs only counts when it cannot be written."""
    if os.geteuid() != 0:
        return "real nodes need root (namespaces, mounts, cgroups, iptables, sysctls)"
    for setting in SYSCTLS:
        if not setting.path.exists():
            return f"{setting.key} does not exist on this kernel"
        if not setting.satisfied_by(_read(setting.path)) and not os.access(setting.path, os.W_OK):
            return (
                f"{setting.key} is {_read(setting.path)} and cannot be set to "
                f"{'at least ' if setting.at_least else ''}{setting.value} here "
                f"({PROC_SYS} is read-only or not ours): the tier needs it because {setting.why}"
            )
    if not (PROC_SYS / "net" / "bridge").exists() and shutil.which("modprobe") is None:
        return (
            f"bridge netfilter is missing ({PROC_SYS}/net/bridge) and there is no modprobe "
            f"to load {BRIDGE_NETFILTER}"
        )
    return _cgroup_problem() or _iptables_problem()


def _state() -> dict[str, object]:
    try:
        data = json.loads(STATE_FILE.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _recorded(state: dict[str, object]) -> dict[str, str]:
    """The recorded sysctls, key -> the value before the tier, in the order they were changed."""
    sysctls = state.get("sysctls")
    return {str(k): str(v) for k, v in sysctls.items()} if isinstance(sysctls, dict) else {}


def _save(state: dict[str, object]) -> None:
    STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
    tmp = STATE_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    tmp.replace(STATE_FILE)


def apply() -> dict[str, str]:
    """Set what the tier needs; returns the settings changed, with the value each had. Each value
    is recorded in ``STATE_FILE`` before it is changed, and a file left by a run that died keeps
    its values: they are the machine's own. Raises :class:`HostUnfit` when something cannot be
    set, having put back what it changed."""
    reason = unfit_reason()
    if reason:
        raise HostUnfit(reason)
    state = _state()
    before = _recorded(state)
    changed: dict[str, str] = {}
    try:
        if not (PROC_SYS / "net" / "bridge").exists():
            state["loaded_module"] = BRIDGE_NETFILTER
            _save(state)
            result = subprocess.run(
                ["modprobe", BRIDGE_NETFILTER], capture_output=True, text=True, check=False
            )
            if result.returncode != 0 or not (PROC_SYS / "net" / "bridge").exists():
                state.pop("loaded_module", None)
                _save(state)
                why = result.stderr.strip() or f"still no {PROC_SYS}/net/bridge"
                raise HostUnfit(f"cannot load {BRIDGE_NETFILTER}: {why}")
        for setting in SYSCTLS:
            current = _read(setting.path)
            if setting.satisfied_by(current):
                continue
            before.setdefault(setting.key, current)
            state["sysctls"] = before
            _save(state)
            try:
                _write(setting.path, str(setting.value))
            except OSError as err:
                raise HostUnfit(f"cannot set {setting.key}={setting.value} (was {current}): {err}") from err
            changed[setting.key] = before[setting.key]
    except HostUnfit:
        restore()
        raise
    return changed


def restore() -> dict[str, str]:
    """Put back every setting recorded in ``STATE_FILE`` and remove it; returns what was written
    back. Idempotent: without the file it does nothing."""
    state = _state()
    if not STATE_FILE.exists():
        return {}
    written: dict[str, str] = {}
    problems: list[str] = []
    for key, value in reversed(list(_recorded(state).items())):
        path = PROC_SYS / key.replace(".", "/")
        try:
            if _read(path) != value:
                _write(path, value)
            written[key] = value
        except OSError as err:
            problems.append(f"{key}={value}: {err}")
    if state.get("loaded_module"):
        subprocess.run(["modprobe", "-r", str(state["loaded_module"])], capture_output=True, check=False)
        written["module"] = f"{state['loaded_module']} unloaded"
    if problems:
        raise RuntimeError(f"could not restore host settings ({STATE_FILE} kept): {'; '.join(problems)}")
    STATE_FILE.unlink(missing_ok=True)
    return written


def snapshot() -> dict[str, str]:
    """The current value of every setting this module may change (for before/after checks)."""
    values = {s.key: _read(s.path) for s in SYSCTLS if s.path.exists()}
    values["bridge netfilter"] = "present" if (PROC_SYS / "net" / "bridge").exists() else "absent"
    return values


def pending() -> list[str]:
    """Settings a run changed and has not put back yet (a leftover, for ``real_nodes.leftovers``)."""
    if not STATE_FILE.exists():
        return []
    state = _state()
    out = [
        f"host setting {key} changed (was {value}; `python -m tests.k8s.cluster down` puts it back)"
        for key, value in _recorded(state).items()
    ]
    if state.get("loaded_module"):
        out.append(f"module {state['loaded_module']} loaded by the tier")
    return out or [f"{STATE_FILE} left behind"]


FRESH_MACHINE = {"net.ipv4.ip_forward": "0"}
"""What a fresh machine of this kind has for the settings the tier changes (the others there are
already as the tier needs them, or machine-dependent: they are left as they are)."""


@contextlib.contextmanager
def as_on_a_fresh_machine() -> Iterator[dict[str, str]]:
    """Set ``FRESH_MACHINE`` for the duration, so that the tier is proven from a fresh machine's
    state whatever this one had; yields the snapshot to expect once the tier has put back what it
    changed. Afterwards the machine's own values are written back."""
    own = {key: _read(PROC_SYS / key.replace(".", "/")) for key in FRESH_MACHINE}
    try:
        for key, value in FRESH_MACHINE.items():
            _write(PROC_SYS / key.replace(".", "/"), value)
        yield snapshot()
    finally:
        for key, value in own.items():
            _write(PROC_SYS / key.replace(".", "/"), value)
