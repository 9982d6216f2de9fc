"""The CDI spec for the advertised devices, and how it is written to disk.

Container runtimes that people run today (containerd 1.7+, CRI-O) inject devices through CDI: the
device plugin answers Allocate with fully qualified device names (``iluvatar.com/gpu=<name>``),
and the runtime applies the edits a spec file under ``/var/run/cdi`` lists for those names. The
spec has one CDI device per advertised device (time-slicing replicas included, so any ID the
kubelet hands back resolves), each with its chips' device nodes; the edits every device shares
are the control nodes, the driver root mounted read-only, and a hook that adds the driver's library
directory to the container's linker cache (:mod:`ix_gpu.node.devices.ldcache_hook`).

What is not in the spec: any environment variable. A CDI ``env`` edit sets a variable, and the
runtime applies CDI edits last, so ``LD_LIBRARY_PATH`` in the spec replaced the image's value, the
pod's, and the list the webhook had merged; the linker cache finds the driver without touching it.

Nor the visible-devices variable (``IX_VISIBLE_DEVICES``): CDI applies each requested device's
edits in turn, and two devices setting one variable would leave the last one's value; Allocate
sets it for the whole request instead, as with the ``envvar`` strategy. For a
vendor whose container toolkit provides the driver (NVIDIA), the spec mounts no driver libraries.

The spec is JSON (which every CDI reader accepts, and which keeps YAML out of the plugin) at
``<dir>/<vendor>-<class>.json``, written atomically: a runtime reading it mid-write would fail
the container.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ix_gpu.devicemodel.vendors import Vendor
from ix_gpu.node.devices.device_list import DeviceList
from ix_gpu.node.devices.ldcache_hook import ldcache_hook

CDI_VERSION = "0.5.0"
"""The oldest version with every field we write; runtimes refuse specs newer than they know, and
containerd 1.7 knows 0.5.0."""
DEFAULT_CDI_DIR = "/var/run/cdi"
DRIVER_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")

_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")
_NOT_NAME_CHAR = re.compile(r"[^A-Za-z0-9_.:-]")


class CdiError(ValueError):
    """The advertised devices cannot be described as CDI devices (a name clash)."""


def device_name(device_id: str) -> str:
    """The CDI device name for a device ID: the ID itself when CDI allows it (UUIDs and
    ``<uuid>::<n>`` replicas do), else the ID with each disallowed character replaced by ``_``
    and any leading or trailing non-alphanumerics trimmed."""
    if _NAME.fullmatch(device_id):
        return device_id
    name = _NOT_NAME_CHAR.sub("_", device_id).strip("_.:-")
    if not name:
        raise CdiError(f"device ID {device_id!r} has no character a CDI device name may hold")
    return name


def qualified_name(vendor: Vendor, device_id: str) -> str:
    """What Allocate puts in ``cdi_devices``: ``<vendor>/<class>=<name>``."""
    return f"{vendor.resource_name}={device_name(device_id)}"


def spec_path(directory: str | Path, vendor: Vendor) -> Path:
    return Path(directory) / f"{vendor.resource_name.replace('/', '-')}.json"


def cdi_spec(
    devices: DeviceList,
    vendor: Vendor,
    control_nodes: Sequence[str],
    *,
    driver_root: str | None = None,
) -> dict[str, Any]:
    """The spec for ``devices``. ``driver_root`` is the host directory to mount (default: the
    vendor's); it is mounted at the same path, and its library directory goes into the linker cache."""
    entries: list[dict[str, Any]] = []
    owners: dict[str, str] = {}
    for device in devices.devices:
        name = device_name(device.id)
        if (other := owners.setdefault(name, device.id)) != device.id:
            raise CdiError(f"device IDs {other!r} and {device.id!r} both become CDI name {name!r}")
        nodes = [{"path": vendor.device_node(chip.minor)} for chip in device.physical.chips]
        entries.append({"name": name, "containerEdits": {"deviceNodes": nodes}})
    common: dict[str, Any] = {"deviceNodes": [{"path": path} for path in control_nodes]}
    if not vendor.runtime_provides_driver:
        root = driver_root or vendor.driver_root
        library_dir = vendor.library_dir
        if root != vendor.driver_root and library_dir.startswith(vendor.driver_root + "/"):
            library_dir = root + library_dir[len(vendor.driver_root) :]
        common["mounts"] = [{"hostPath": root, "containerPath": root, "options": list(DRIVER_MOUNT_OPTIONS)}]
        common["hooks"] = [ldcache_hook([library_dir])]
    spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": vendor.resource_name, "devices": entries}
    if any(common.values()):
        spec["containerEdits"] = {key: value for key, value in common.items() if value}
    return spec


def render(spec: dict[str, Any]) -> bytes:
    return (json.dumps(spec, indent=2) + "\n").encode()


def write_spec(spec: dict[str, Any], path: Path) -> bool:
    """Write ``spec`` to ``path`` atomically (a temporary file in the same directory, fsynced,
    then renamed over it); False when the file already holds exactly this spec."""
    content = render(spec)
    try:
        if path.read_bytes() == content:
            return False
    except FileNotFoundError:
        pass
    write_atomic(content, path)
    return True


def write_atomic(content: bytes, path: Path) -> None:
    """``path`` holds ``content`` or what it held before, whatever happens: a temporary file in
    the same directory, fsynced, renamed over it (mode 0644). Raises ``OSError``. A container
    runtime reading CDI specs, or a restarted plugin reading its checkpoint, never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
