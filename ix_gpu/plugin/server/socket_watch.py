"""Notice a kubelet restart: ``kubelet.sock`` re-created, or our own socket deleted.

When the kubelet restarts it deletes every socket in the device-plugin directory and creates a new
``kubelet.sock``; a plugin that does not notice stays unregistered forever. Comparing kubelet.sock's
inode number is not enough — a socket deleted and re-created quickly can get the same inode number
back — so we watch the directory with inotify, where a re-creation is an event, not a guess.

inotify is reached through ctypes (no extra dependency). Where it is unavailable, a polling
fallback compares (inode, ctime) of kubelet.sock, which catches all but a same-inode re-creation
within one timestamp tick, and checks that our own socket still exists.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import struct
from pathlib import Path

log = logging.getLogger(__name__)

_IN_MOVED_FROM = 0x40
_IN_MOVED_TO = 0x80
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_IGNORED = 0x8000
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_EVENT_HEADER = struct.Struct("iIII")


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_ctime_ns


class SocketWatch:
    """Counts kubelet.sock (re)creations; wakes a waiter on any relevant change.

    ``kubelet_generation`` increases each time kubelet.sock appears; the registrar compares it with
    the generation it registered against. Spurious wake-ups are fine — the registrar re-checks the
    real state — missed ones are not.
    """

    def __init__(self, directory: Path, kubelet_socket: str = "kubelet.sock") -> None:
        self.directory = directory
        self.kubelet_socket = kubelet_socket
        self.kubelet_generation = 0
        self.changed = asyncio.Event()
        self._fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kubelet_identity = _identity(directory / kubelet_socket)
        self.using_inotify = False

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._open_inotify()

    def _open_inotify(self) -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
            if fd < 0:
                raise OSError(ctypes.get_errno(), "inotify_init1 failed")
            mask = _IN_CREATE | _IN_DELETE | _IN_MOVED_TO | _IN_MOVED_FROM | _IN_DELETE_SELF | _IN_MOVE_SELF
            wd = libc.inotify_add_watch(fd, os.fsencode(self.directory), mask)
            if wd < 0:
                err = ctypes.get_errno()
                os.close(fd)
                raise OSError(err, os.strerror(err))
        except (OSError, AttributeError) as exc:
            if self.using_inotify or self._fd is None:
                log.warning(
                    "inotify unavailable on %s (%s); polling for kubelet restarts", self.directory, exc
                )
            self.using_inotify = False
            return
        assert self._loop is not None
        self._fd = fd
        self._loop.add_reader(fd, self._on_readable)
        self.using_inotify = True

    def _close_inotify(self) -> None:
        if self._fd is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None

    def _on_readable(self) -> None:
        assert self._fd is not None
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        offset, rewatch = 0, False
        while offset + _EVENT_HEADER.size <= len(data):
            _wd, mask, _cookie, length = _EVENT_HEADER.unpack_from(data, offset)
            raw = data[offset + _EVENT_HEADER.size : offset + _EVENT_HEADER.size + length]
            name = raw.split(b"\0", 1)[0].decode(errors="replace")
            offset += _EVENT_HEADER.size + length
            if mask & (_IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED):
                rewatch = True  # the directory itself went away (e.g. host path re-mounted)
            if name == self.kubelet_socket and mask & (_IN_CREATE | _IN_MOVED_TO):
                self.kubelet_generation += 1
                self._kubelet_identity = _identity(self.directory / self.kubelet_socket)
                log.info("kubelet.sock was (re)created: the kubelet restarted")
            self.changed.set()
        if rewatch:
            self._close_inotify()

    def poll(self) -> None:
        """Called periodically: re-arm inotify if the directory was replaced, and without inotify
        detect a kubelet.sock replacement by identity."""
        if self._fd is None and self.directory.is_dir():
            self._open_inotify()
            if self.using_inotify:
                self.changed.set()  # events may have been missed while unwatched
        if not self.using_inotify:
            identity = _identity(self.directory / self.kubelet_socket)
            if identity is not None and identity != self._kubelet_identity:
                self.kubelet_generation += 1
                self.changed.set()
            self._kubelet_identity = identity

    def close(self) -> None:
        self._close_inotify()
