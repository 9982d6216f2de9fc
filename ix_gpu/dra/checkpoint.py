"""The prepared claims, kept in one JSON file so that a restarted plugin still knows them.

The kubelet calls NodeUnprepareResources for a claim after the pod is gone, maybe long after the
plugin that prepared it was restarted; without this file the new process would not know which CDI
spec to remove. It also makes Prepare cheap and stable when the kubelet retries: the answer is the
one given the first time.

Written atomically (temporary file, fsync, rename; see :func:`ix_gpu.plugin.devices.cdi.write_spec`),
after the CDI spec on prepare and after the spec's removal on unprepare: a crash in between leaves
at worst a spec with no record, and Unprepare removes a claim's spec by its path, record or not. A
file that cannot be read is moved aside, not trusted and not fatal: the node's GPU pods must still
start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ix_gpu.plugin.devices.cdi import write_spec

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


class Checkpoint:
    """The file and its content; not thread-safe (the caller holds one lock around changes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.claims: dict[str, PreparedClaim] = self._load()

    def _load(self) -> dict[str, PreparedClaim]:
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

    def save(self) -> None:
        document = {
            "kind": KIND,
            "version": VERSION,
            "claims": {uid: asdict(claim) for uid, claim in sorted(self.claims.items())},
        }
        write_spec(document, self.path)
