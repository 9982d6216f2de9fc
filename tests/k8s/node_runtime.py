"""The container runtime of each real node, and the containerd config it runs.

Two lanes (``IX_GPU_CONTAINERD``, read by containerd.sh): **2.3** by default, containerd v2.3.7
built from the Go module proxy (build-runtime.sh), and **1.7**, Debian's containerd 1.7.24. Both
run the same runc, v1.5.3 from the module proxy (:func:`tests.support.tier_runc.tier_runc`), named
in the config as the runc shim's ``BinaryName`` so no ``runc`` on PATH is ever taken for it.

containerd 2 reads config version 3 (2.3: version 4, below), where the CRI plugin is split into
``io.containerd.cri.v1.images`` (snapshotter, the pinned sandbox image) and
``io.containerd.cri.v1.runtime`` (runtimes, CNI, CDI); containerd 1.7 reads version 2 with all of it
under ``io.containerd.grpc.v1.cri``. CDI is left as containerd 2 ships it (on, specs read from
``/etc/cdi`` and ``/var/run/cdi``; each node binds its own ``/run/cdi``); 1.7 needs it turned on.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

from tests.support.tier_runc import tier_runc

CONTAINERD_SCRIPT = Path(__file__).resolve().parent / "containerd.sh"
CNI_BIN_DIR = "/usr/lib/cni"
"""Debian's containernetworking-plugins (node-packages.sh)."""
DISABLED_PLUGINS = (
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.internal.v1.tracing",
)
"""Snapshotters the nodes do not use (each probes the host at start) and tracing, which exports
nowhere here."""


@dataclasses.dataclass(frozen=True)
class NodeRuntime:
    """The binaries every real node runs: containerd (its shim and ``ctr`` beside it) and runc."""

    containerd_bin: Path
    containerd_version: str
    """``containerd --version``'s release: ``2.3.7``, or ``1.7.24~ds1`` for Debian's."""
    runc: Path

    @property
    def containerd_release(self) -> tuple[int, int]:
        """(major, minor) of ``containerd_version``."""
        major, minor = self.containerd_version.split(".")[:2]
        return int(major), int(minor)


def containerd_version(containerd_bin: Path) -> str:
    """``containerd github.com/containerd/containerd v2.3.7 <revision>`` → ``2.3.7``."""
    out = subprocess.run(
        [str(containerd_bin / "containerd"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    return out.split()[2].removeprefix("v")


def containerd_config(root: Path, pause_image: str, runtime: NodeRuntime) -> str:
    """The config of the node whose directory is ``root``, in the newest version its containerd
    reads (an older one would be migrated at every start, with a warning): 4 from 2.3 on, where the
    listeners moved from ``[grpc]`` and ``[ttrpc]`` to server plugins; 3 for 2.0 to 2.2; 2 for 1.x."""
    release = runtime.containerd_release
    if release < (2, 0):
        return _config_v2(root, pause_image, runtime.runc)
    if release < (2, 3):
        listeners = f"""[grpc]
  address = "{root}/containerd.sock"
"""
        return _config_v3_v4(3, listeners, root, pause_image, runtime.runc)
    # The ttrpc listener (shims talk to containerd on it) is no longer derived from the gRPC one.
    listeners = f"""[plugins.'io.containerd.server.v1.grpc']
  address = "{root}/containerd.sock"
[plugins.'io.containerd.server.v1.ttrpc']
  address = "{root}/containerd.sock.ttrpc"
"""
    return _config_v3_v4(4, listeners, root, pause_image, runtime.runc)


def _disabled() -> str:
    return ", ".join(f'"{name}"' for name in DISABLED_PLUGINS)


def _config_v3_v4(version: int, listeners: str, root: Path, pause_image: str, runc: Path) -> str:
    return f"""version = {version}
root = "{root}/containerd"
state = "/run/containerd"
disabled_plugins = [{_disabled()}]

# containerd 2 logs the CDI device IDs a container is given (which the DRA tests read back) at debug
# level; 1.7 logged them at info.
[debug]
  level = "debug"

{listeners}
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause_image}"

# CDI as containerd 2 ships it: enable_cdi and cdi_spec_dirs at their defaults.
[plugins.'io.containerd.cri.v1.runtime']
  # The sandbox may not raise its own oom_score_adj on this machine (no CAP_SYS_RESOURCE).
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "/etc/cni/net.d"

# NRI is on in containerd 2 (as shipped), but its socket's default path is one per host: each node
# gets its own, or the second containerd would take the first one's.
[plugins.'io.containerd.nri.v1.nri']
  socket_path = "{root}/nri/nri.sock"
"""


def _config_v2(root: Path, pause_image: str, runc: Path) -> str:
    return f"""version = 2
root = "{root}/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", {_disabled()}]

[grpc]
  address = "{root}/containerd.sock"

[debug]
  level = "info"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  # The sandbox may not raise its own oom_score_adj on this machine (no CAP_SYS_RESOURCE).
  restrict_oom_score_adj = true
  # CDI device IDs in CreateContainer (a DRA claim's devices) are resolved from these specs.
  enable_cdi = true
  cdi_spec_dirs = ["/var/run/cdi"]
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "/etc/cni/net.d"
"""


def find_runtime() -> NodeRuntime:
    """The lane's containerd (containerd.sh: built or fetched, or found cached) and the tier's runc."""
    result = subprocess.run(["bash", str(CONTAINERD_SCRIPT)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"tests/k8s/{CONTAINERD_SCRIPT.name} failed ({result.returncode}):\n{result.stderr[-6000:]}"
        )
    containerd_bin = Path((result.stdout.strip().splitlines() or [""])[-1])
    return NodeRuntime(
        containerd_bin=containerd_bin,
        containerd_version=containerd_version(containerd_bin),
        runc=Path(tier_runc()),
    )
