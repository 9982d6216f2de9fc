"""The prepared claims, kept in one JSON file so that a restarted plugin still knows them.

The kubelet calls NodeUnprepareResources for a claim after the pod is gone, maybe long after the
plugin that prepared it was restarted; without this file the new process would not know which CDI
spec to remove. It also makes Prepare cheap and stable when the kubelet retries: the answer is the
one given the first time.

Written atomically (temporary file, fsync, rename, as :func:`ix_gpu.node.devices.cdi.write_spec`
writes a CDI spec), after the CDI spec on prepare and after the spec's removal on unprepare: a
crash in between leaves at worst a spec with no record, and Unprepare removes a claim's spec by its
path, record or not. A file that cannot be read is moved aside, not trusted and not fatal: the
node's GPU pods must still start.

The whole file is written on every prepare and unprepare, so its cost grows with the claims a
node holds: it is compact JSON from the C encoder, and each claim's plain form is built once, not
on every save (``dataclasses.asdict`` and an indented dump took 7 ms per save at 200 claims).

During a rolling update two instances of the plugin share the file (:mod:`ix_gpu.dra.sockets`):
the kubelet may prepare a claim through one and unprepare it through the other. So every
read-modify-write runs in :meth:`Checkpoint.shared`: an exclusive ``flock`` on ``<file>.lock``
beside it, and the file read again if another process replaced it since this one last read or
wrote it (its inode, mtime and size; a write is a rename, so a new inode). Alone on a node this
costs a lock and a ``stat`` per call.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ix_gpu.node.devices.cdi import write_atomic

log = logging.getLogger(__name__)

KIND = "IxGpuDraCheckpoint"
VERSION = 1


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    spec_file: str
    """The CDI spec written for this claim (an absolute path)."""


def _claim_from(raw: dict[str, Any]) -> PreparedClaim:
    devices = tuple(
        PreparedDevice(
            request_names=tuple(d["request_names"]),
            pool=d["pool"],
            device=d["device"],
            cdi_device_ids=tuple(d["cdi_device_ids"]),
            share_id=d.get("share_id"),
        )
        for d in raw["devices"]
    )
    return PreparedClaim(raw["uid"], raw["namespace"], raw["name"], devices, raw["spec_file"])


def _plain(claim: PreparedClaim) -> dict[str, Any]:
    """The claim as the file holds it (what ``dataclasses.asdict`` gives, without its cost)."""
    return {
        "uid": claim.uid,
        "namespace": claim.namespace,
        "name": claim.name,
        "devices": [
            {
                "request_names": list(d.request_names),
                "pool": d.pool,
                "device": d.device,
                "cdi_device_ids": list(d.cdi_device_ids),
                "share_id": d.share_id,
            }
            for d in claim.devices
        ],
        "spec_file": claim.spec_file,
    }


class Checkpoint:
    """The file and its content; not thread-safe (the caller holds one lock around changes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        """The file as this process last read or wrote it (inode, mtime, size); None: absent."""
        self._lock_fd: int | None = None
        self.lock_wait = 10.0
        """Seconds :meth:`shared` waits for another instance's lock before it gives up."""
        self.claims: dict[str, PreparedClaim] = self._load()
        self._plain: dict[str, tuple[PreparedClaim, dict[str, Any]]] = {}
        """uid → (the claim, its plain form), reused while the claim is the same object."""

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Held around every read-modify-write of :attr:`claims` (waits up to :attr:`lock_wait`,
        then ``OSError``): no other instance writes meanwhile, and :attr:`claims` is what the file
        holds now."""
        if self._lock_fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = self.path.with_name(f"{self.path.name}.lock")
            self._lock_fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._take_lock(self._lock_fd)
        try:
            if self._stamp() != self._seen:
                self.claims = self._load()
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _take_lock(self, fd: int) -> None:
        """Bounded: an instance that holds the lock for long (a write stuck on the disk) costs a
        call an error the kubelet retries, not a worker thread for as long as it lasts."""
        deadline = time.monotonic() + self.lock_wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OSError(
                        f"{self.path}.lock held by another process for {self.lock_wait:g}s"
                    ) from None
                time.sleep(0.005)

    def _load(self) -> dict[str, PreparedClaim]:
        self._seen = self._stamp()
        try:
            raw = json.loads(self.path.read_bytes())
            if raw.get("kind") != KIND or raw.get("version") != VERSION:
                raise ValueError(f"not a version {VERSION} {KIND}")
            return {uid: _claim_from(claim) for uid, claim in raw["claims"].items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = self.path.with_name(f"{self.path.name}.unreadable-{int(time.time())}")
            log.error("checkpoint %s unreadable (%s); moved to %s, starting empty", self.path, exc, aside)
            with contextlib.suppress(OSError):
                self.path.rename(aside)
            return {}

    def _plain_claims(self) -> dict[str, dict[str, Any]]:
        plain = {}
        for uid, claim in sorted(self.claims.items()):
            cached = self._plain.get(uid)
            if cached is None or cached[0] is not claim:
                cached = self._plain[uid] = (claim, _plain(claim))
            plain[uid] = cached[1]
        for gone in self._plain.keys() - self.claims.keys():
            del self._plain[gone]
        return plain

    def save(self) -> None:
        document = {"kind": KIND, "version": VERSION, "claims": self._plain_claims()}
        write_atomic((json.dumps(document, separators=(",", ":")) + "\n").encode(), self.path)
        self._seen = self._stamp()
