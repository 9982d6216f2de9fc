"""The device plugin's socket in the kubelet's directory, and those of other instances of it.

A DaemonSet rolling with ``maxSurge`` runs two plugin pods on a node for a moment: the new one
serves and registers while the old one still serves. Each needs a socket of its own (``--socket-id``,
the pod's UID in the chart): with one name, the new pod's bind takes the old one's path, the
kubelet refuses the second registration (``device plugin already connected``), and the old pod's
exit removes the file the new one serves on. Kubernetes 1.37's device manager keeps one endpoint per
socket path and a resource's devices until its last endpoint goes; older ones keep the newest
(below, what the plugin does about them).

The old instance, stopping, must not send its farewell (every device Unhealthy) when another
instance serves: the kubelet applies a ListAndWatch update to the resource, whichever endpoint sent
it, so the farewell would empty the node under the new instance. :func:`sibling_serving` tells.

A socket whose plugin died without removing it (killed, a node rebooted into a new pod) refuses
connections; the next instance to serve removes it, so a node's directory does not fill with one
file per rollout.
"""

from __future__ import annotations

import re
from pathlib import Path

from ix_gpu.serving import unix_sockets


def socket_name_for(resource_name: str, socket_id: str | None = None) -> str:
    """``iluvatar.com/gpu`` → ``iluvatar-gpu.sock`` (the name the vendor plugin's liveness probe
    looked for, kept where there is one instance), or ``iluvatar-gpu-<id>.sock`` with an id."""
    domain, _, name = resource_name.partition("/")
    stem = f"{domain.split('.')[0]}-{name}".replace("/", "-")
    return f"{stem}-{socket_id}.sock" if socket_id else f"{stem}.sock"


def _pattern(resource_name: str) -> re.Pattern[str]:
    """This resource's plugin sockets: ``iluvatar-gpu.sock`` and ``iluvatar-gpu-<id>.sock``."""
    stem = socket_name_for(resource_name).removesuffix(".sock")
    return re.compile(rf"{re.escape(stem)}(-[A-Za-z0-9-]+)?\.sock")


def sibling_serving(directory: Path, resource_name: str, own: Path | None) -> Path | None:
    """Another instance's socket that a plugin serves on, if any (blocking, briefly)."""
    return next(iter(unix_sockets.serving(directory, _pattern(resource_name), own)), None)


def remove_stale(directory: Path, resource_name: str, own: Path | None) -> None:
    """Remove the sockets of instances that serve no more (their plugin died without cleaning up)."""
    unix_sockets.remove_stale(directory, _pattern(resource_name), own)
