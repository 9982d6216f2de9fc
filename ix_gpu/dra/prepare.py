"""NodePrepareResources and NodeUnprepareResources for one claim: CDI spec, checkpoint, idempotency.

Prepare writes one CDI spec per claim (``<cdi dir>/<kind>-claim-<uid>.json``, built by
:func:`ix_gpu.node.devices.cdi.cdi_spec`, so the device nodes, control nodes and driver mount are
the device plugin's) and answers CDI device IDs ``<kind>=<claim uid>-<device>``. The claim uid in
each name keeps them unique across spec files of one kind, which CDI requires, and apart from the
device plugin's own spec. The visible-devices variable goes into the claim's spec: there is no
Allocate call to set it. A claim that took shares of a shared device (:mod:`ix_gpu.dra.devices`)
also gets :data:`MEMORY_SHARE_ENV`, the MiB it was given of each chip it sees, in the order of the
visible-devices variable (a share of a board is split over the board's chips by their memory):
advisory, for the application to size itself by; nothing enforces it.

The kubelet retries Prepare until every claim has an error-free answer, and may call it again
after its own restart: a claim in the checkpoint whose spec still exists is answered from the
checkpoint without asking the API server. A spec that vanished (``/var/run`` is a tmpfs, gone
after a reboot, while the checkpoint is not) is written again from the claim. Unprepare of a
claim nobody knows is a success, as the API requires, and still removes a spec left by a crash
between writing it and recording it.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ix_gpu.devicemodel.vendors import Vendor
from ix_gpu.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from ix_gpu.dra.claims import ClaimError, ClaimRef, allocated
from ix_gpu.dra.devices import DraDevice
from ix_gpu.node.backends.base import Chip
from ix_gpu.node.devices.cdi import CdiError, cdi_spec, qualified_name, write_spec
from ix_gpu.node.devices.device_list import Device, DeviceList
from ix_gpu.node.gpu_reset import ResetFailed

log = logging.getLogger(__name__)

_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_SUFFIX.update({f"{s}i": 1 << (10 * (n + 1)) for n, s in enumerate(("K", "M", "G", "T", "P", "E"))})
_MEMORY = re.compile(r"(\d{1,30})(|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)")


def memory_mib(quantity: str) -> int | None:
    """A memory quantity as the scheduler writes it (canonical: whole number, one suffix) in whole
    MiB; None for any other form. Not :mod:`ix_gpu.devicemodel.quantities`: its Fraction brings
    the decimal module into a process that stays small."""
    found = _MEMORY.fullmatch(quantity.strip())
    return int(found[1]) * _SUFFIX[found[2]] >> 20 if found else None


MEMORY_SHARE_ENV = "IX_GPU_MEMORY_SHARE_MIB"


def _per_chip(device: DraDevice, given: int | None) -> list[int]:
    """What a claim was given of ``device`` (all of it when ``given`` is None: taken whole), per
    chip in the device's order: a board's share spread over its chips as their memory is."""
    total = device.physical.memory_mib
    mib = total if given is None else given
    return [mib * chip.memory_mib // total if total else 0 for chip in device.physical.chips]


_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}")
"""What a Kubernetes uid looks like; anything else never becomes part of a file name."""


@dataclass(kw_only=True, eq=False)
class Preparer:
    """Thread-safe: the servicer runs each claim in a worker thread (the API read blocks). Safe
    beside another instance on the node too: the checkpoint is read and written under its file
    lock (:meth:`ix_gpu.dra.checkpoint.Checkpoint.shared`)."""

    driver: str
    pool: str
    vendor: Vendor
    cdi_dir: Path
    checkpoint: Checkpoint
    read_claim: Callable[[ClaimRef], dict[str, Any]]
    devices: Callable[[], Mapping[str, DraDevice]]
    control_nodes: Callable[[], Sequence[str]]
    driver_root: str | None = None
    refusal: Callable[[], str | None] = lambda: None
    """Why no new claim may be prepared now (None: it may); see :mod:`ix_gpu.node.allocator`."""
    reset: Callable[[Sequence[Chip]], object] | None = None
    """``flags.reset_gpu``: resets a new claim's chips before its spec is written (blocking;
    raises :class:`ix_gpu.node.gpu_reset.ResetFailed`); None: no reset. A claim answered from the
    checkpoint (the kubelet asking again) is never reset: its pod may be running."""
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def spec_path(self, uid: str) -> Path:
        if not _UID.fullmatch(uid):
            raise ClaimError(f"claim uid {uid[:80]!r} is not a Kubernetes uid", "invalid")
        return self.cdi_dir / f"{self.vendor.resource_name.replace('/', '-')}-claim-{uid}.json"

    def prepare(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        """The claim's devices with their CDI IDs; :class:`ClaimError` says why not, and its
        reason is one of :data:`ix_gpu.dra.claims.FAILURE_REASONS` (the servicer counts it)."""
        path = self.spec_path(ref.uid)
        with self._lock, self.checkpoint.shared():
            known = self.checkpoint.claims.get(ref.uid)
            if known is not None and (not known.spec_file or Path(known.spec_file).exists()):
                return known.devices
        if (why := self.refusal()) is not None:
            raise ClaimError(f"claim {ref}: not preparing it: {why}", "refused")
        try:
            claim = self.read_claim(ref)
        except OSError as exc:
            raise ClaimError(f"claim {ref}: cannot read it from the API server: {exc}", "read") from None
        results = allocated(claim, ref, self.driver, self.pool)
        inventory = self.devices()
        missing = [r.device for r in results if r.device not in inventory]
        if missing:
            raise ClaimError(f"claim {ref}: device {missing[0]} is not on this node now", "no_device")
        ours: dict[str, DraDevice] = {r.device: inventory[r.device] for r in results}
        prepared = tuple(
            PreparedDevice(
                request_names=(r.request,),
                pool=self.pool,
                device=r.device,
                cdi_device_ids=(qualified_name(self.vendor, f"{ref.uid}-{r.device}"),) if ours else (),
                share_id=r.share_id,
            )
            for r in results
        )
        shares: dict[str, int] = {}
        for r in results:
            if r.memory is not None and r.device in ours:
                mib = memory_mib(r.memory)
                if mib is None:  # advisory only: the claim is prepared without it
                    log.warning(
                        "claim %s: device %s consumed memory %r, not a quantity read here",
                        ref,
                        r.device,
                        r.memory,
                    )
                    continue
                shares[r.device] = shares.get(r.device, 0) + mib
        if self.reset is not None and ours:
            self._reset(ref, list(ours.values()))
        spec = self._spec(ref.uid, list(ours.values()), shares) if ours else None
        with self._lock, self.checkpoint.shared():
            try:
                if spec is not None:
                    write_spec(spec, path)
                self.checkpoint.claims[ref.uid] = PreparedClaim(
                    ref.uid, ref.namespace, ref.name, prepared, str(path) if spec is not None else ""
                )
                self.checkpoint.save()
            except OSError as exc:
                what = f"{exc.filename or path}: {exc.strerror or exc}"
                raise ClaimError(f"claim {ref}: cannot write {what}", "write") from None
        log.info("prepared claim %s: %s", ref, ", ".join(d.device for d in prepared) or "no devices of ours")
        return prepared

    def _reset(self, ref: ClaimRef, devices: list[DraDevice]) -> None:
        """Reset the claim's chips (whole chips and boards: with ``reset_gpu`` nothing is shared),
        unless one of them is prepared for another claim, which the scheduler's counters forbid
        and a reset would pull from under that claim's pod."""
        assert self.reset is not None
        chips = {chip.uuid: chip for d in devices for chip in d.physical.chips}
        inventory = self.devices()
        with self._lock, self.checkpoint.shared():
            others = [c for uid, c in self.checkpoint.claims.items() if uid != ref.uid]
        for other in others:
            for prepared in other.devices:
                held = inventory.get(prepared.device)
                taken = [c.uuid for c in held.physical.chips if c.uuid in chips] if held else []
                if taken:
                    raise ClaimError(
                        f"claim {ref}: chip {taken[0]} is prepared for claim {other.namespace}/{other.name}; "
                        "it is not reset under that claim's pod",
                        "reset",
                    )
        try:
            self.reset(list(chips.values()))
        except ResetFailed as exc:
            raise ClaimError(f"claim {ref}: {exc}", "reset") from None

    def _spec(self, uid: str, devices: list[DraDevice], shares: Mapping[str, int]) -> dict[str, Any]:
        entries = tuple(Device(id=f"{uid}-{d.name}", physical=d.physical) for d in devices)
        listed = DeviceList(
            physical=tuple(d.physical for d in devices),
            devices=entries,
            replicas=1,
            by_id={e.id: e for e in entries},
        )
        try:
            spec = cdi_spec(listed, self.vendor, self.control_nodes(), driver_root=self.driver_root)
        except CdiError as exc:
            raise ClaimError(str(exc), "cdi") from None
        visible = ",".join(chip.uuid for d in devices for chip in d.physical.chips)
        edits = spec.setdefault("containerEdits", {})
        edits["env"] = [*edits.get("env", []), f"{self.vendor.visible_devices_env}={visible}"]
        if shares:
            mib = ",".join(str(m) for d in devices for m in _per_chip(d, shares.get(d.name)))
            edits["env"].append(f"{MEMORY_SHARE_ENV}={mib}")
        return spec

    def unprepare(self, uid: str) -> None:
        """Remove the claim's spec and record; :class:`ClaimError` (``invalid``, ``write``) when
        the uid is none or the spec or checkpoint cannot be written."""
        path = self.spec_path(uid)
        with self._lock, self.checkpoint.shared():
            known = self.checkpoint.claims.get(uid)
            spec = Path(known.spec_file if known is not None and known.spec_file else path)
            try:
                spec.unlink(missing_ok=True)
                if known is not None:
                    del self.checkpoint.claims[uid]
                    self.checkpoint.save()
            except OSError as exc:
                what = f"{exc.filename or spec}: {exc.strerror or exc}"
                raise ClaimError(f"claim {uid}: cannot unprepare it: {what}", "write") from None
            if known is not None:
                log.info("unprepared claim %s/%s (%s)", known.namespace, known.name, uid)
