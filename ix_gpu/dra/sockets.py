"""The DRA plugin's two sockets, and those of another instance on the node during a rolling update.

From Kubernetes 1.33 the kubelet keeps every registered instance of a DRA driver, each by its own
endpoint, and sends calls to the most recently registered one that is connected; when that one's
registration socket goes, it falls back to the other. So a DaemonSet may roll with ``maxSurge: 1``:
the new pod serves and registers beside the old one, and claims are prepared throughout. That
needs sockets of its own per instance (``--socket-id``, the pod's UID in the chart):
``<registry-dir>/<driver>-<id>-reg.sock`` and ``<plugins-dir>/<driver>/dra-<id>.sock``. Without an
id the names are the single-instance ones, ``<driver>-reg.sock`` and ``dra.sock``: a kubelet before
1.33 keeps one instance per driver, and the old pod's exit would unregister the driver under the
new one, so there the DaemonSet must not surge (``docs/dra.md``, "Rolling updates").

Both instances share the plugin directory and what is in it: the checkpoint
(:class:`ix_gpu.dra.checkpoint.Checkpoint` locks and re-reads it), the CDI specs, and the node's
ResourceSlices, which only the newest instance that serves writes (:func:`newer_instance_serves`):
an upgrade that changes the config would otherwise have two instances take turns rewriting them.
"""

from __future__ import annotations

import re
from pathlib import Path

from ix_gpu.serving import unix_sockets

DRA_SOCKET = "dra.sock"


def dra_socket_name(socket_id: str | None) -> str:
    return f"dra-{socket_id}.sock" if socket_id else DRA_SOCKET


def registration_socket_name(driver: str, socket_id: str | None = None) -> str:
    return f"{driver}-{socket_id}-reg.sock" if socket_id else f"{driver}-reg.sock"


DRA_SOCKETS = re.compile(r"dra(-[A-Za-z0-9-]+)?\.sock")


def registration_sockets(driver: str) -> re.Pattern[str]:
    """Registration sockets of ``driver``'s instances, with or without an id."""
    return re.compile(rf"{re.escape(driver)}(-[A-Za-z0-9-]+)?-reg\.sock")


def _created(path: Path) -> tuple[int, str]:
    """When a socket was bound (its file's mtime; the name breaks a tie); (-1, ...) when gone."""
    try:
        return path.stat().st_mtime_ns, path.name
    except OSError:
        return -1, path.name


def newer_instance_serves(own: Path) -> Path | None:
    """The DRA socket of an instance that started serving after this one and serves now, if any
    (blocking, briefly): that instance publishes the node's slices."""
    mine = _created(own)
    newer = [path for path in unix_sockets.instances(own.parent, DRA_SOCKETS, own) if _created(path) > mine]
    return next((path for path in newer if unix_sockets.accepts(path)), None)


def remove_stale(dra_socket: Path, registration_socket: Path, driver: str) -> None:
    """Before serving: remove the sockets of instances that died without removing them. The
    kubelet then unregisters a dead instance (its registration socket is gone) instead of keeping
    it beside this one until its own restart."""
    unix_sockets.remove_stale(registration_socket.parent, registration_sockets(driver), registration_socket)
    unix_sockets.remove_stale(dra_socket.parent, DRA_SOCKETS, dra_socket)
