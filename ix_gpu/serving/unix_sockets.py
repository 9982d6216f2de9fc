"""The unix sockets of other instances of one node agent in a directory: which serve, and which a
dead instance left behind.

A DaemonSet rolling with ``maxSurge`` runs two pods of an agent on a node for a moment, each on a
socket of its own (``--socket-id``). Each agent asks two things of the other's sockets: does
another instance serve now (the device plugin then skips its farewell; the DRA plugin leaves the
ResourceSlice to the newer one), and which sockets serve nobody (an instance killed, or a node
rebooted into a new pod, never removed its own): those are removed, so the kubelet forgets them
and a node's directory does not gather one file per rollout. Serving is told by a connection being
accepted, the only test that does not trust a file that outlived its process.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
from pathlib import Path

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 0.2


def instances(directory: Path, name: re.Pattern[str], own: Path | None) -> list[Path]:
    """The sockets in ``directory`` whose file name matches ``name`` in full, ``own`` left out."""
    try:
        entries = list(directory.iterdir())
    except OSError:
        return []
    return [entry for entry in entries if entry != own and name.fullmatch(entry.name) and entry.is_socket()]


def accepts(path: Path) -> bool:
    """Whether something serves on ``path`` (it accepts a connection; blocking, briefly)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(CONNECT_TIMEOUT_S)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False  # nobody listens: an instance that died without removing its socket
    except OSError:
        return True  # a timeout (a full backlog) or another error: something is there, leave it
    finally:
        probe.close()
    return True


def serving(directory: Path, name: re.Pattern[str], own: Path | None) -> list[Path]:
    """The other instances' sockets that something serves on."""
    return [path for path in instances(directory, name, own) if accepts(path)]


def remove_stale(directory: Path, name: re.Pattern[str], own: Path | None) -> None:
    """Remove the other instances' sockets that nothing serves on any more."""
    for path in instances(directory, name, own):
        if not accepts(path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            log.info("removed %s: nothing serves on it any more", path)
