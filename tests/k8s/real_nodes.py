"""Real Nodes for the mini cluster: each a kubelet on its own containerd (2.3 by default, 1.7 as a
second lane) and runc (1.5; both in node_runtime.py), with CNI pod networking and kube-proxy in
iptables mode, so pods are real containers (own mount, PID and network namespaces, cgroup limits, a
device cgroup, an image filesystem).

Layout on this machine (root; one real-node cluster at a time, the addresses are fixed):

- **Network.** The host bridge ``ixt-br0`` holds 198.51.100.1/28 (TEST-NET-2; the apiserver
  advertises this address). Each node is a network namespace ``ixt-<node>`` with a veth on that
  bridge (``gpu-a`` 198.51.100.2, ``gpu-b`` .3), its own CNI bridge and pod range (``gpu-a``
  198.51.100.64/26, ``gpu-b`` .128/26; the host routes each range to its node), its own iptables,
  and its own kube-proxy. Services get 198.51.100.192/26 (not TEST-NET-3: this machine's package
  registries resolve to an address there, which a ClusterIP must never shadow on the host's
  kube-proxy, nor the filter chain below reject). The control plane runs on the
  host, so the host runs a kube-proxy too, as a control-plane node would: the apiserver reaches a
  webhook at its Service's ClusterIP. Chain ``IX-GPU-TIER`` in the host's filter table rejects
  Service and pod traffic that would otherwise leave the machine (before kube-proxy has synced, or
  a pod dialling out).
- **Mounts.** containerd and the kubelet share one private mount namespace per node (containerd
  starts in it; the kubelet joins it), in which node directories are bound over the paths a real
  node has: ``/var/lib/kubelet`` (so the chart's default device-plugin directory is that node's),
  ``/var/log/pods``, ``/var/log/containers``, ``/run/containerd`` (containerd keeps shim sockets
  there whatever its state directory), ``/run/netns``, ``/var/lib/cni``, ``/etc/cni/net.d``,
  ``/run/cdi`` (the CDI specs a DRA driver writes and containerd resolves), the driver root
  ``DRIVER_ROOT``, and six sysctl files the kubelet would otherwise rewrite on the host.
  ``/dev`` is an overlay of the host's ``/dev`` with the node's GPU device nodes added, so both
  nodes have ``/dev/iluvatar0`` and see different devices there.
- **GPUs without a GPU.** The device nodes are real character devices made with ``mknod``. Each
  takes the major:minor of a harmless misc device of this kernel that opens without side effects
  and that runc's default device allow-list does not contain, so the device cgroup decides for real
  whether a container may open it. The driver root holds ``lib64/libixml.so``, the stub libixml
  (tests/node/fake_ixml.c) compiled for the node, and the script it reads, naming the node's chips.
- **cgroups.** Each node's kubelet has its own ``cgroupRoot`` (``/ixt-<node>``), so the two
  kubelets never see each other's pod cgroups as orphans.

``RealNodeCluster``-level orchestration is in cluster.py (``MiniCluster(runtime="containerd")``).
``leftovers()`` lists what of all this still exists (for the tests that check nothing leaks).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import yaml

from tests.k8s import host_settings
from tests.k8s.k8s_tier import KUBELET_SYSCTLS, K8sBinaries, KubeAPI, unix_socket_ready, write_kubeconfig
from tests.k8s.node_runtime import NodeRuntime, containerd_config, find_runtime
from tests.support.paths import ROOT
from tests.support.processes import Process, start_process
from tests.support.waiting import wait_until

TIER_ROOT = Path("/var/lib/ix-gpu-tier")
TIER_LOCK = "/run/lock/ix-gpu-tier.lock"
"""Held (flock) by the process whose real-node cluster runs (``RealNodes.prepare``)."""
_machine_lock: int | None = None


def take_machine() -> int:
    """Wait for any other process's real-node cluster on this machine to be gone (its addresses,
    mounts and ``TIER_ROOT`` are fixed): two pytest runs queue instead of tearing each other down.
    Held until :func:`release_machine` (after the leftovers check) or the process ends."""
    global _machine_lock
    if _machine_lock is None:
        fd = os.open(TIER_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for the real-node cluster that holds {TIER_LOCK} to close", flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        _machine_lock = fd
    return _machine_lock


def release_machine() -> None:
    """Let another process's real-node cluster start (this one's is closed and checked)."""
    global _machine_lock
    if _machine_lock is not None:
        os.close(_machine_lock)
        _machine_lock = None


DRIVER_ROOT = "/var/lib/ix-gpu-tier/corex"
"""The GPU driver root on every real node (each node binds its own directory here): the value of
the chart's ``plugin.driver.root`` and of the Iluvatar profile's driver hostPath on this cluster."""
HOST_BRIDGE = "ixt-br0"
HOST_ADDRESS = "198.51.100.1"
NODE_PREFIX_LEN = 28
SERVICE_CIDR = "198.51.100.192/26"
CLUSTER_CIDR = "198.51.100.64/25"
TIER_CIDR = "198.51.100.0/24"
FILTER_CHAIN = "IX-GPU-TIER"
KUBE_PROXY_PORTS = (10249, 10256)
HARMLESS_MISC = (
    (237, "loop-control"),
    (234, "btrfs-control"),
    (235, "autofs"),
    (183, "hw_random"),
    (232, "kvm"),
    (257, "userfaultfd"),
    (256, "vga_arbiter"),
    (258, "vsock"),
)
"""Misc devices (major 10) that open for reading without side effects and are not on runc's
default allow-list (null, zero, full, random, urandom, tty, console, ptmx, pts, tun), so only a
container given the device can open it; in order of preference. Which exist depends on the kernel:
this kind's fresh machines have no autofs, whose number a stand-in made earlier then failed to open
(ENODEV) whenever the allocator handed out that chip."""


@functools.cache
def misc_devices(count: int = 4, proc_misc: Path = Path("/proc/misc")) -> tuple[tuple[int, int], ...]:
    """Stand-ins for /dev/iluvatar0..count-1, in order: the first ``count`` of HARMLESS_MISC this
    kernel has. Raises :class:`host_settings.HostUnfit` when it has fewer."""
    registered = {int(line.split()[0]) for line in proc_misc.read_text().splitlines() if line.strip()}
    found = tuple((10, minor) for minor, _ in HARMLESS_MISC if minor in registered)
    if len(found) < count:
        names = ", ".join(f"{name} (10:{minor})" for minor, name in HARMLESS_MISC)
        raise host_settings.HostUnfit(
            f"this kernel registers fewer than {count} of the misc devices the tier's GPUs stand in "
            f"for: {names}"
        )
    return found[:count]


CONTROL_DEVICE = (1, 11)
"""/dev/itrctl, the Iluvatar control node the plugin hands to every GPU container: kmsg's numbers."""
LIBIXML_SOURCE = ROOT / "tests" / "node" / "fake_ixml.c"
MOUNT_POINTS = (
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/run/containerd",
    "/run/netns",
    "/var/lib/cni",
    "/etc/cni/net.d",
    "/run/cdi",
    DRIVER_ROOT,
)


@dataclasses.dataclass(frozen=True)
class RealNodeSpec:
    """A real node: its name, address on the host bridge, pod range, and GPUs (boards of chips)."""

    name: str
    address: str
    pod_cidr: str
    pod_gateway: str
    product: str
    boards: int
    chips_per_board: int

    @property
    def netns(self) -> str:
        return f"ixt-{self.name}"

    @property
    def root(self) -> Path:
        return TIER_ROOT / self.name

    @property
    def chips(self) -> int:
        return self.boards * self.chips_per_board


REAL_NODES = (
    RealNodeSpec("gpu-a", "198.51.100.2", "198.51.100.64/26", "198.51.100.65", "Iluvatar BI-V150", 2, 2),
    RealNodeSpec("gpu-b", "198.51.100.3", "198.51.100.128/26", "198.51.100.129", "Iluvatar BI-V100", 2, 1),
)


def run(argv: Sequence[str], *, check: bool = True, input_text: str | None = None) -> str:
    """Run a host command; its stdout. A failure raises with the command and its stderr."""
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False, input=input_text)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def _quiet(argv: Sequence[str]) -> None:
    """Best-effort cleanup step: run it and ignore a failure (the thing may already be gone)."""
    subprocess.run(list(argv), capture_output=True, check=False)


# --------------------------------------------------------------------------- host network


def setup_host_network(nodes: Sequence[RealNodeSpec]) -> None:
    """The host bridge with the apiserver's address, a route to each node's pod range, and the
    filter chain that keeps tier traffic on this machine. Refuses when a tier network exists."""
    if Path(f"/sys/class/net/{HOST_BRIDGE}").exists():
        raise RuntimeError(
            f"{HOST_BRIDGE} exists: another real-node cluster is running (python -m tests.k8s.cluster down)"
        )
    run(["ip", "link", "add", HOST_BRIDGE, "type", "bridge"])
    run(["ip", "addr", "add", f"{HOST_ADDRESS}/{NODE_PREFIX_LEN}", "dev", HOST_BRIDGE])
    run(["ip", "link", "set", HOST_BRIDGE, "up"])
    # Traffic of the tier stays on this machine: Service addresses that nothing translated, and
    # anything a pod sends elsewhere, are rejected instead of leaving through the default route.
    run(["iptables", "-w", "-N", FILTER_CHAIN])
    run(["iptables", "-w", "-A", FILTER_CHAIN, "-d", SERVICE_CIDR, "-j", "REJECT"])
    run(["iptables", "-w", "-A", FILTER_CHAIN, "-s", TIER_CIDR, "!", "-d", TIER_CIDR, "-j", "REJECT"])
    for chain in ("OUTPUT", "FORWARD"):
        run(["iptables", "-w", "-I", chain, "1", "-j", FILTER_CHAIN])


def teardown_host_network(nodes: Sequence[RealNodeSpec]) -> None:
    for spec in nodes:
        _quiet(["ip", "netns", "del", spec.netns])
        _quiet(["ip", "link", "del", spec.netns])
    _quiet(["ip", "link", "del", HOST_BRIDGE])
    for chain in ("OUTPUT", "FORWARD"):
        while (
            subprocess.run(
                ["iptables", "-w", "-D", chain, "-j", FILTER_CHAIN], capture_output=True
            ).returncode
            == 0
        ):
            pass
    _quiet(["iptables", "-w", "-F", FILTER_CHAIN])
    _quiet(["iptables", "-w", "-X", FILTER_CHAIN])


def kube_chains() -> list[tuple[str, str, str]]:
    """(command, table, line) of every rule or chain named KUBE-* in the host's iptables and
    ip6tables."""
    found = []
    for command in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            rules = subprocess.run([command, "-w", "-t", table, "-S"], capture_output=True, text=True).stdout
            found += [(command, table, line) for line in rules.splitlines() if "KUBE-" in line]
    return found


HOST_CHAINS_BEFORE = TIER_ROOT / "host-kube-chains.json"
"""The host's KUBE-* rules and chains before the cluster started (another kubelet's or kube-proxy's
on this machine), which cleanup leaves in place."""


def remove_kube_chains(keep: Sequence[tuple[str, str, str]] = ()) -> None:
    """Remove what ``kube-proxy --cleanup`` leaves on the host: KUBE-FIREWALL, which it shares with
    the kubelet and so never deletes, with the jumps to it; nothing of ``keep``."""
    kept = {tuple(rule) for rule in keep}
    rules = [rule for rule in kube_chains() if rule not in kept]
    for command, table, line in rules:
        if line.startswith("-A "):
            _quiet([command, "-w", "-t", table, "-D", *line.split()[1:]])
    for command, table, line in rules:
        if line.startswith("-N "):
            _quiet([command, "-w", "-t", table, "-F", line.split()[1]])
            _quiet([command, "-w", "-t", table, "-X", line.split()[1]])


def setup_node_network(spec: RealNodeSpec) -> None:
    """The node's network namespace: eth0 on the host bridge, a default route via the host, IP
    forwarding and bridge netfilter on (kube-proxy's rules must see pod-to-Service traffic that
    stays on the node's CNI bridge), and the host's route to the node's pod range."""
    ns = spec.netns
    run(["ip", "netns", "add", ns])
    run(["ip", "link", "add", ns, "type", "veth", "peer", "name", "eth0", "netns", ns])
    run(["ip", "link", "set", ns, "master", HOST_BRIDGE, "up"])
    inside = ["ip", "netns", "exec", ns]
    run([*inside, "ip", "addr", "add", f"{spec.address}/{NODE_PREFIX_LEN}", "dev", "eth0"])
    run([*inside, "ip", "link", "set", "eth0", "up"])
    run([*inside, "ip", "link", "set", "lo", "up"])
    run([*inside, "ip", "route", "add", "default", "via", HOST_ADDRESS])
    run([*inside, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
    run([*inside, "sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1"])
    run(["ip", "route", "add", spec.pod_cidr, "via", spec.address])


# --------------------------------------------------------------------------- node files


def cni_config(spec: RealNodeSpec) -> dict[str, Any]:
    return {
        "cniVersion": "0.4.0",
        "name": "ix-gpu-tier",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,  # the host routes pod ranges back: pods keep their addresses
                "hairpinMode": True,  # a pod reaching itself through a Service
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": spec.pod_cidr, "gateway": spec.pod_gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def libixml_script(spec: RealNodeSpec) -> str:
    """The stub libixml's devices for ``spec`` (format in tests/node/fake_ixml.c): the product
    name, then one line per chip, minors from 0."""
    lines = [f"name {spec.product}"]
    minor = 0
    for board in range(spec.boards):
        for position in range(spec.chips_per_board):
            uuid = f"GPU-{spec.name}-{board:02d}{position:02d}-0000-4000-8000-000000000000"
            lines.append(f"{uuid} {minor} {board} {position} 0 32768 {0x8A + minor:x}")
            minor += 1
    return "\n".join(lines) + "\n"


def edit_stub_chip(node: str, uuid: str, *, health: str | None = None, **figures: int) -> str:
    """Change chip ``uuid``'s line in ``node``'s stub libixml devices file (which it re-reads on
    every count): its health mask (hex) and telemetry words (``temp=95``, format in
    tests/node/fake_ixml.c). Returns the file as it was."""
    script = TIER_ROOT / node / "corex" / "fake-ixml-devices"
    before = script.read_text()
    lines = before.splitlines()
    (row,) = [i for i, line in enumerate(lines) if line.startswith(uuid + " ")]
    fields = lines[row].split()
    if health is not None:
        fields[4] = health
    words = dict(w.split("=", 1) for w in fields[7:] if "=" in w)
    words.update({key: str(value) for key, value in figures.items()})
    fields = fields[:7] + [w for w in fields[7:] if "=" not in w] + [f"{k}={v}" for k, v in words.items()]
    lines[row] = " ".join(fields)
    script.write_text("\n".join(lines) + "\n")
    return before


@contextlib.contextmanager
def stub_chip(node: str, uuid: str, *, health: str | None = None, **figures: int) -> Iterator[None]:
    """:func:`edit_stub_chip` while inside; the file as it was on leaving."""
    before = edit_stub_chip(node, uuid, health=health, **figures)
    try:
        yield
    finally:
        (TIER_ROOT / node / "corex" / "fake-ixml-devices").write_text(before)


def stub_uuids(node: str) -> list[str]:
    """The chips' UUIDs in ``node``'s stub devices file, by minor."""
    script = (TIER_ROOT / node / "corex" / "fake-ixml-devices").read_text()
    return [line.split()[0] for line in script.splitlines() if line.startswith("GPU-")]


def write_node_files(spec: RealNodeSpec, pause_image: str, runtime: NodeRuntime) -> None:
    """The node's directories, configs and driver root (the stub libixml compiled into it)."""
    root = spec.root
    if root.exists():
        shutil.rmtree(root)
    for sub in (
        "kubelet/device-plugins",
        "kubelet/plugins_registry",
        "pod-logs",
        "container-logs",
        "run-containerd",
        "netns",
        "cni-state",
        "cni-conf",
        "cdi",
        "corex/lib64",
        "sysctl",
        "devfs",
        "hostdev",
        "containerd",
    ):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "cni-conf" / "10-ix-gpu-tier.conflist").write_text(json.dumps(cni_config(spec), indent=2))
    (root / "containerd.toml").write_text(containerd_config(root, pause_image, runtime))
    for key, value in KUBELET_SYSCTLS.items():
        (root / "sysctl" / key.replace("/", ".")).write_text(f"{value}\n")
    corex = root / "corex"
    (corex / "fake-ixml-devices").write_text(libixml_script(spec))
    run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(corex / "lib64" / "libixml.so"), str(LIBIXML_SOURCE)])


def launcher_script(spec: RealNodeSpec, containerd_bin: Path) -> str:
    """The shell that builds the node's mount namespace (it runs inside a fresh one) and then execs
    the containerd of ``containerd_bin`` (its shim found there too). Paths are bound over, never
    created, on the host: MOUNT_POINTS exist beforehand."""
    r = spec.root
    binds = {
        f"{r}/kubelet": "/var/lib/kubelet",
        f"{r}/pod-logs": "/var/log/pods",
        f"{r}/container-logs": "/var/log/containers",
        f"{r}/run-containerd": "/run/containerd",
        f"{r}/netns": "/run/netns",
        f"{r}/cni-state": "/var/lib/cni",
        f"{r}/cni-conf": "/etc/cni/net.d",
        f"{r}/cdi": "/run/cdi",
        f"{r}/corex": DRIVER_ROOT,
    }
    lines = ["set -eu"]
    lines += [f"mount --bind {source} {target}" for source, target in binds.items()]
    lines.append(f'for f in {r}/sysctl/*; do mount --bind "$f" "/proc/sys/$(basename "$f" | tr . /)"; done')
    # /dev: the host's, plus this node's GPU device nodes in an overlay's upper layer.
    lines += [
        f"mount --rbind /dev {r}/hostdev",
        f"mount -t tmpfs -o mode=755 ix-gpu-devfs {r}/devfs",
        f"mkdir {r}/devfs/upper {r}/devfs/work",
        f"mount -t overlay ix-gpu-dev -o lowerdir=/dev,upperdir={r}/devfs/upper,workdir={r}/devfs/work /dev",
        "for m in pts shm mqueue; do",
        f"    if [ -d {r}/hostdev/$m ]; then mount --rbind {r}/hostdev/$m /dev/$m; fi",
        "done",
    ]
    for minor in range(spec.chips):
        major, dev_minor = misc_devices()[minor]
        lines.append(f"mknod -m 666 /dev/iluvatar{minor} c {major} {dev_minor}")
    lines.append(f"mknod -m 666 /dev/itrctl c {CONTROL_DEVICE[0]} {CONTROL_DEVICE[1]}")
    lines.append(f'export PATH="{containerd_bin}:$PATH"')
    lines.append(f"exec {containerd_bin}/containerd --config {r}/containerd.toml")  # log level in the config
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- cgroups


def cgroup_hierarchies() -> list[Path]:
    """The mounted cgroup v1 hierarchies (cgroup v2: the one unified mount)."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] in ("cgroup", "cgroup2"):
            out.append(Path(fields[1]))
    return out


def container_cgroup(pod: dict[str, Any], container: str, controller: str) -> Path:
    """The host directory of a running container's cgroup in ``controller``'s hierarchy (cgroup
    v1), found by its container ID under its node's cgroup root."""
    (status,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == container]
    container_id = status["containerID"].split("://", 1)[1]
    node = pod["spec"]["nodeName"]
    matches = list(Path(f"/sys/fs/cgroup/{controller}/ixt-{node}").rglob(container_id))
    assert len(matches) == 1, (controller, container_id, matches)
    return matches[0]


def container_pids(pod: dict[str, Any], container: str) -> list[int]:
    """A running container's host PIDs, lowest (its first process) first."""
    procs = container_cgroup(pod, container, "pids") / "cgroup.procs"
    return sorted(int(p) for p in procs.read_text().split())


def make_cgroup_root(name: str) -> None:
    """``/<name>`` in every hierarchy, cpuset initialised from its parent (v1 needs cpus and mems
    before a child can hold a task)."""
    for hierarchy in cgroup_hierarchies():
        path = hierarchy / name
        path.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (path / knob).exists() and not (path / knob).read_text().strip():
                (path / knob).write_text((hierarchy / knob).read_text())


def cgroup_pids(name: str) -> set[int]:
    pids: set[int] = set()
    for hierarchy in cgroup_hierarchies():
        base = hierarchy / name
        if not base.exists():
            continue
        for procs in base.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def remove_cgroup_root(name: str) -> None:
    """Remove ``/<name>`` and everything under it, deepest first (a cgroup is removed with rmdir)."""
    for hierarchy in cgroup_hierarchies():
        base = hierarchy / name
        if not base.exists():
            continue
        for path in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                path.rmdir()
        with contextlib.suppress(OSError):
            base.rmdir()


# --------------------------------------------------------------------------- processes


def processes_matching(needle: str) -> list[int]:
    """PIDs whose command line contains ``needle``."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                out.append(int(proc.name))
    return out


def kill_all(pids: set[int] | list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@dataclasses.dataclass
class RealNode:
    """One real node: its containerd (in the node's mount and network namespaces), kubelet and
    kube-proxy. ``close()`` stops them and removes everything the node made."""

    spec: RealNodeSpec
    api: KubeAPI
    log_dir: Path
    containerd_bin: Path
    containerd: Process | None = None
    kubelet: Process | None = None
    kube_proxy: Process | None = None
    kubelet_argv: list[str] = dataclasses.field(default_factory=list)
    """How ``start_real_node`` started the kubelet, for :meth:`restart_kubelet`."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def socket(self) -> Path:
        return self.spec.root / "containerd.sock"

    def nsenter(self) -> list[str]:
        """The prefix that runs a command in this node's network and mount namespaces."""
        assert self.containerd is not None
        return [
            "nsenter",
            f"--net=/run/netns/{self.spec.netns}",
            f"--mount=/proc/{self.containerd.pid}/ns/mnt",
            "--",
        ]

    def ctr(self, *args: str) -> str:
        return run(
            [str(self.containerd_bin / "ctr"), "--address", str(self.socket), "--namespace", "k8s.io", *args]
        )

    def import_image(self, archive: Path) -> None:
        self.ctr("images", "import", str(archive))

    def run_in_image(self, image: str, argv: Sequence[str]) -> str:
        """Run ``argv`` in a container of ``image`` on this node's containerd (not through the
        kubelet), as ``docker run --rm`` would; its output. The container's cgroup is under the
        node's root, so nothing is left on the host."""
        name = f"check-{os.getpid()}-{time.monotonic_ns()}"
        return run(
            [
                *self.nsenter(),
                str(self.containerd_bin / "ctr"), "--address", str(self.socket), "--namespace", "k8s.io",
                "run", "--rm", f"--cgroup=/{self.spec.netns}/{name}", image, name, *argv,
            ]
        )  # fmt: skip

    def image_size(self, image: str) -> str:
        """The size containerd lists for ``image`` (its compressed layers)."""
        for line in self.ctr("images", "ls").splitlines():
            fields = line.split()
            if fields and fields[0] == image:
                return " ".join(fields[3:5])
        raise LookupError(image)

    def node(self) -> dict[str, Any] | None:
        status, body = self.api.request("GET", f"/api/v1/nodes/{self.name}")
        return body if status == 200 and isinstance(body, dict) else None

    def ready(self) -> bool:
        conditions = (self.node() or {}).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def restart_kubelet(self, grace_s: float = 10.0) -> None:
        """Stop the kubelet (SIGTERM, as ``systemctl restart`` does) and start it again with the same
        command line, in containerd's mount namespace as before. Its log goes on in the same file.
        The pods' containers are containerd's: they keep running meanwhile."""
        assert self.kubelet is not None and self.kubelet_argv
        self.kubelet.stop(grace_s=grace_s)
        self.kubelet = start_process(f"kubelet-{self.name}", self.kubelet_argv, self.log_dir)

    def restart_containerd(self, grace_s: float = 10.0) -> None:
        """Stop containerd (SIGTERM) and start it again in the node's mount namespace, which must
        outlive it: the kubelet, the shims and every later ``nsenter()`` live in that namespace,
        whose bind mounts (``/var/lib/kubelet``, ``/run/containerd``, ``/dev``, ...) only the
        launcher made. An open descriptor of the namespace holds it while no containerd runs (the
        kubelet and the shims would too, but nothing here relies on them), and the new containerd
        enters it by that descriptor; its shims, which outlived the old one, are found again in the
        namespace's ``/run/containerd``."""
        assert self.containerd is not None
        holder = os.open(f"/proc/{self.containerd.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.containerd.stop(grace_s=grace_s)
            namespace = f"/proc/{os.getpid()}/fd/{holder}"
            argv = [
                "nsenter", f"--net=/run/netns/{self.spec.netns}", f"--mount={namespace}", "--",
                str(self.containerd_bin / "containerd"), "--config", str(self.spec.root / "containerd.toml"),
            ]  # fmt: skip
            env = {**os.environ, "PATH": f"{self.containerd_bin}:{os.environ.get('PATH', '')}"}
            self.containerd = start_process(f"containerd-{self.name}", argv, self.log_dir, env=env)
            wait_until(
                lambda: unix_socket_ready(self.socket),
                f"containerd of {self.name} again",
                60,
                interval=0.05,
                process=self.containerd,
            )
        finally:
            os.close(holder)

    def close(self) -> None:
        # The node's iptables rules go with its network namespace: nothing to clean after kube-proxy.
        for process in (self.kube_proxy, self.kubelet):
            if process is not None:
                process.stop(grace_s=5)
        if self.containerd is not None:
            self.containerd.stop(grace_s=5)
        # Shims and containers outlive containerd by design: kill them by socket and by cgroup.
        for _ in range(3):
            kill_all(processes_matching(f"-address {self.socket}"))
            kill_all(cgroup_pids(self.spec.netns))
            time.sleep(0.2)
        remove_cgroup_root(self.spec.netns)
        with contextlib.suppress(Exception):
            self.api.request("DELETE", f"/api/v1/nodes/{self.name}")
        _quiet(["ip", "netns", "del", self.spec.netns])
        _quiet(["ip", "route", "del", self.spec.pod_cidr])
        shutil.rmtree(self.spec.root, ignore_errors=True)


def node_kubeconfig(api: KubeAPI, path: Path) -> Path:
    """The admin kubeconfig, with the apiserver at the host bridge address nodes can reach."""
    url = f"https://{HOST_ADDRESS}:{api.url.rsplit(':', 1)[1]}"
    return write_kubeconfig(path, url, api.ca_path, api.token)


def kubelet_config(spec: RealNodeSpec) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": spec.address,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{spec.root}/containerd.sock",
        "failSwapOn": False,
        "failCgroupV1": False,
        # containerd 2 reports cgroupfs through the CRI RuntimeConfig call (its runc shim's
        # SystemdCgroup is off) and the kubelet uses that; containerd 1.7 does not answer the call,
        # and the kubelet falls back to this.
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{spec.netns}",
        "nodeStatusUpdateFrequency": "2s",
        "syncFrequency": "10s",
        "registerNode": True,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
    }


def kube_proxy_config(hostname: str, address: str, kubeconfig: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": hostname,
        "bindAddress": address,
        "healthzBindAddress": f"{address}:{KUBE_PROXY_PORTS[1]}",
        "metricsBindAddress": f"{address}:{KUBE_PROXY_PORTS[0]}",
        "clusterCIDR": CLUSTER_CIDR,
        "nodePortAddresses": [f"{address}/32"],
        # 0: leave the machine's conntrack settings alone.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def start_kube_proxy(
    binaries: K8sBinaries,
    name: str,
    address: str,
    kubeconfig: Path,
    work: Path,
    log_dir: Path,
    prefix: Sequence[str],
) -> Process:
    config = work / f"kube-proxy-{name}.yaml"
    config.write_text(yaml.safe_dump(kube_proxy_config(name, address, kubeconfig)))
    return start_process(
        f"kube-proxy-{name}", [*prefix, str(binaries.kube_proxy), f"--config={config}", "--v=2"], log_dir
    )


def start_real_node(
    binaries: K8sBinaries,
    api: KubeAPI,
    spec: RealNodeSpec,
    log_dir: Path,
    images: Sequence[Path],
    *,
    runtime: NodeRuntime,
    pause_image: str,
    labels: dict[str, str] | None = None,
) -> RealNode:
    """Network, containerd (images imported), kubelet and kube-proxy of ``spec``; returns once the
    kubelet runs (``wait_ready`` waits for the Node)."""
    node = RealNode(spec=spec, api=api, log_dir=log_dir, containerd_bin=runtime.containerd_bin)
    try:
        write_node_files(spec, pause_image, runtime)
        setup_node_network(spec)
        make_cgroup_root(spec.netns)
        launcher = spec.root / "launch.sh"
        launcher.write_text(launcher_script(spec, runtime.containerd_bin))
        node.containerd = start_process(
            f"containerd-{spec.name}",
            ["nsenter", f"--net=/run/netns/{spec.netns}", "--",
             "unshare", "--mount", "--propagation", "private", "--", "sh", str(launcher)],
            log_dir,
        )  # fmt: skip
        wait_until(
            lambda: unix_socket_ready(node.socket),
            f"containerd of {spec.name}",
            60,
            interval=0.1,
            process=node.containerd,
        )
        for archive in images:
            node.import_image(archive)
        kubeconfig = node_kubeconfig(api, spec.root / "kubeconfig")
        config = spec.root / "kubelet-config.yaml"
        config.write_text(yaml.safe_dump(kubelet_config(spec)))
        argv = [
            *node.nsenter(),
            str(binaries.kubelet),
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--cert-dir={spec.root / 'pki'}",
            f"--hostname-override={spec.name}",
            f"--node-ip={spec.address}",
            "--v=2",
        ]
        if labels:
            argv.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())))
        node.kubelet_argv = argv
        node.kubelet = start_process(f"kubelet-{spec.name}", argv, log_dir)
        node.kube_proxy = start_kube_proxy(
            binaries,
            spec.name,
            spec.address,
            kubeconfig,
            spec.root,
            log_dir,
            ["nsenter", f"--net=/run/netns/{spec.netns}", "--"],
        )
    except BaseException:
        node.close()
        raise
    return node


def kube_proxy_synced(address: str) -> bool:
    """Whether the kube-proxy on ``address`` has written its IPv4 rules at least once: /livez's
    per-family ``lastUpdated`` is set by a finished sync (/healthz would also want a Node of the
    proxy's name, which the control plane's lacks)."""
    try:
        with urllib.request.urlopen(f"http://{address}:{KUBE_PROXY_PORTS[1]}/livez", timeout=2) as response:
            health = json.loads(response.read())
    except (OSError, ValueError):
        return False
    updated = str((health.get("status") or {}).get("IPv4", {}).get("lastUpdated", ""))
    return bool(updated) and not updated.startswith("0001-")


def wait_node_ready(node: RealNode, timeout_s: float = 120.0) -> None:
    assert node.kubelet is not None
    wait_until(node.ready, f"Node {node.name} Ready", timeout_s, interval=0.25, process=node.kubelet)
    wait_until(
        lambda: unix_socket_ready(node.spec.root / "kubelet" / "device-plugins" / "kubelet.sock"),
        f"the device-plugin registration socket of {node.name}",
        30,
        interval=0.25,
        process=node.kubelet,
    )


# --------------------------------------------------------------------------- checks


def leftovers(
    nodes: Sequence[RealNodeSpec] = REAL_NODES, keep: Sequence[tuple[str, str, str]] = ()
) -> list[str]:
    """What of a real-node cluster still exists on this machine: processes, network namespaces,
    links, iptables chains (but the KUBE-* rules of ``keep``, there before it), cgroups, mounts,
    directories. Empty after a clean ``down``."""
    kept = {tuple(rule) for rule in keep}
    found: list[str] = []
    for needle in ("containerd-shim", str(TIER_ROOT), "kube-proxy-ix", "--config=/var/lib/ix-gpu-tier"):
        for pid in processes_matching(needle):
            if pid != os.getpid():
                found.append(f"process {pid} ({needle})")
    for spec in nodes:
        if Path(f"/run/netns/{spec.netns}").exists():
            found.append(f"network namespace {spec.netns}")
        if Path(f"/sys/class/net/{spec.netns}").exists():
            found.append(f"link {spec.netns}")
        for hierarchy in cgroup_hierarchies():
            if (hierarchy / spec.netns).exists():
                found.append(f"cgroup {hierarchy / spec.netns}")
    if Path(f"/sys/class/net/{HOST_BRIDGE}").exists():
        found.append(f"bridge {HOST_BRIDGE}")
    found += [
        f"{command} -t {table}: {line}"
        for command, table, line in kube_chains()
        if (command, table, line) not in kept
    ]
    rules = run(["iptables", "-w", "-S"], check=False)
    found += [f"iptables: {line}" for line in rules.splitlines() if FILTER_CHAIN in line]
    for line in Path("/proc/self/mounts").read_text().splitlines():
        if str(TIER_ROOT) in line or "ix-gpu-dev" in line:
            found.append(f"mount {line}")
    if TIER_ROOT.exists() and any(TIER_ROOT.iterdir()):
        found.append(f"directory {TIER_ROOT}: {sorted(p.name for p in TIER_ROOT.iterdir())}")
    return found + host_settings.pending()


def ensure_mount_points() -> list[str]:
    """Create the MOUNT_POINTS the host lacks; returns those created (``remove_mount_points``)."""
    created = []
    for path in MOUNT_POINTS:
        if not Path(path).exists():
            Path(path).mkdir(parents=True)
            created.append(path)
    return created


def remove_mount_points(created: Sequence[str]) -> None:
    for path in reversed(created):
        with contextlib.suppress(OSError):
            Path(path).rmdir()


# --------------------------------------------------------------------------- the set of nodes

IMAGES_SCRIPT = Path(__file__).resolve().parent / "build-images.sh"
PACKAGES_SCRIPT = Path(__file__).resolve().parent / "node-packages.sh"


@dataclasses.dataclass(frozen=True)
class Images:
    """The images build-images.sh made (the pause image's and the project image's references and
    docker archives), and the runtime the nodes run (node_runtime.py; flat, so a cluster's state
    file holds it as strings)."""

    pause_ref: str
    pause_archive: Path
    project_ref: str
    project_repository: str
    project_tag: str
    project_archive: Path
    training_operator_ref: str
    training_operator_archive: Path
    library_check_ref: str
    library_check_archive: Path
    hostile_root_refs: dict[str, str]
    """Each hostile root's case (tests/support/hostile_roots.py IMAGE_CASES) → its image."""
    hostile_root_archives: tuple[str, ...]
    containerd_bin: Path
    containerd_version: str
    runc: Path

    @property
    def runtime(self) -> NodeRuntime:
        return NodeRuntime(Path(self.containerd_bin), self.containerd_version, Path(self.runc))


def build_images() -> Images:
    """Install the node packages if missing, build (or find cached) the images, containerd and runc."""
    last_lines = {}
    for script in (PACKAGES_SCRIPT, IMAGES_SCRIPT):
        result = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(
                f"tests/k8s/{script.name} failed ({result.returncode}):\n{result.stderr[-6000:]}"
            )
        last_lines[script] = (result.stdout.strip().splitlines() or [""])[-1]
    data = json.loads((Path(last_lines[IMAGES_SCRIPT]) / "images.json").read_text())
    runtime = find_runtime()
    return Images(
        pause_ref=data["pause"]["ref"],
        pause_archive=Path(data["pause"]["archive"]),
        project_ref=data["ix-gpu"]["ref"],
        project_repository=data["ix-gpu"]["repository"],
        project_tag=data["ix-gpu"]["tag"],
        project_archive=Path(data["ix-gpu"]["archive"]),
        training_operator_ref=data["training-operator"]["ref"],
        training_operator_archive=Path(data["training-operator"]["archive"]),
        library_check_ref=data["library-check"]["ref"],
        library_check_archive=Path(data["library-check"]["archive"]),
        hostile_root_refs={case: image["ref"] for case, image in data["hostile-roots"].items()},
        hostile_root_archives=tuple(image["archive"] for image in data["hostile-roots"].values()),
        containerd_bin=runtime.containerd_bin,
        containerd_version=runtime.containerd_version,
        runc=runtime.runc,
    )


class RealNodes:
    """The real nodes of a mini cluster, and the host side they need: ``prepare()`` before the
    apiserver starts (images, mount points, the host network), ``start()`` once it runs (a
    kube-proxy for the control plane, then the nodes), ``close()`` removes all of it."""

    def __init__(self, specs: Sequence[RealNodeSpec] = REAL_NODES) -> None:
        self.specs = tuple(specs)
        self.nodes: dict[str, RealNode] = {}
        self.host_proxy: Process | None = None
        self.images: Images | None = None
        self.kube_proxy_binary: Path | None = None
        self._created_mount_points: list[str] = []
        self._lock: int | None = None

    apiserver_args: ClassVar[dict[str, str]] = {
        "advertise_address": HOST_ADDRESS,
        "service_cidr": SERVICE_CIDR,
    }

    def prepare(self) -> Images:
        """Raises :class:`host_settings.HostUnfit` (nothing changed) when this machine cannot run
        real nodes. The host settings are changed only once the images are built, just before the
        host network that needs them (a pytest session ending meanwhile elsewhere puts recorded
        settings back while no tier bridge exists); ``close()`` puts them back."""
        reason = host_settings.unfit_reason()
        if reason:
            raise host_settings.HostUnfit(reason)
        self._take_the_machine()
        misc_devices()  # the GPUs' stand-ins exist on this kernel
        self.images = build_images()
        self._created_mount_points = ensure_mount_points()
        TIER_ROOT.mkdir(parents=True, exist_ok=True)
        HOST_CHAINS_BEFORE.write_text(json.dumps(kube_chains()))
        host_settings.apply()
        setup_host_network(self.specs)
        return self.images

    def start(
        self, binaries: K8sBinaries, api: KubeAPI, log_dir: Path, labels: dict[str, str] | None = None
    ) -> dict[str, RealNode]:
        assert self.images is not None, "prepare() first"
        self.kube_proxy_binary = binaries.kube_proxy
        TIER_ROOT.mkdir(parents=True, exist_ok=True)
        self.host_proxy = start_kube_proxy(
            binaries, "control-plane", HOST_ADDRESS, api.kubeconfig, TIER_ROOT, log_dir, []
        )
        images = self.images
        archives = (
            images.pause_archive,
            images.project_archive,
            images.training_operator_archive,
            images.library_check_archive,
            *map(Path, images.hostile_root_archives),
        )
        for spec in self.specs:
            self.nodes[spec.name] = start_real_node(
                binaries,
                api,
                spec,
                log_dir,
                archives,
                runtime=images.runtime,
                pause_image=images.pause_ref,
                labels=labels,
            )
        for node in self.nodes.values():
            wait_node_ready(node)
        # Every kube-proxy has synced its rules: until the control plane's has, the apiserver's calls
        # to a webhook's ClusterIP are refused (it first waits 30 s for a Node of its name, which
        # the control plane does not have).
        proxies = [(HOST_ADDRESS, self.host_proxy)] + [
            (n.spec.address, n.kube_proxy) for n in self.nodes.values()
        ]
        for address, process in proxies:
            assert process is not None
            wait_until(
                lambda address=address: kube_proxy_synced(address),
                f"kube-proxy on {address} synced",
                90,
                interval=0.5,
                process=process,
            )
        return self.nodes

    def _take_the_machine(self) -> None:
        self._lock = take_machine()

    def close(self) -> None:
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                node.close()
        self.nodes.clear()
        if self.host_proxy is not None:
            self.host_proxy.stop(grace_s=5)
        if self._lock is not None:
            cleanup(self.specs, self.kube_proxy_binary)
            remove_mount_points(self._created_mount_points)
            self._lock = None


def cleanup(specs: Sequence[RealNodeSpec] = REAL_NODES, kube_proxy: Path | None = None) -> None:
    """Remove whatever a real-node cluster left, idempotently (``down`` after a supervisor died):
    processes, cgroups, network namespaces and links, the host's kube-proxy rules and filter chain,
    node directories."""
    for spec in specs:
        for _ in range(3):
            kill_all(processes_matching(f"-address {spec.root}/containerd.sock"))
            kill_all(processes_matching(f"--config={spec.root}"))
            kill_all(processes_matching(f"--config {spec.root}"))
            kill_all(cgroup_pids(spec.netns))
            time.sleep(0.1)
        remove_cgroup_root(spec.netns)
        _quiet(["ip", "route", "del", spec.pod_cidr])
    kill_all(processes_matching(f"--config={TIER_ROOT}/kube-proxy-"))
    before: list[tuple[str, str, str]] = []
    with contextlib.suppress(OSError, ValueError):
        before = [tuple(rule) for rule in json.loads(HOST_CHAINS_BEFORE.read_text())]  # type: ignore[misc]
    if kube_proxy is not None and kube_proxy.exists():
        _quiet([str(kube_proxy), "--cleanup"])  # its chains in the host's iptables
    remove_kube_chains(keep=before)
    teardown_host_network(specs)
    shutil.rmtree(TIER_ROOT, ignore_errors=True)
    host_settings.restore()  # last: nothing of the tier routes through the host any more
