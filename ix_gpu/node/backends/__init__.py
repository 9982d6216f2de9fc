"""Discovery backends behind one interface (:mod:`.base`), and choosing one.

``ixml`` (libixml via ctypes), ``nvml`` (pynvml), ``devfs`` (device nodes and sysfs only) and
``fake`` (a YAML file, watched by the node layer, :func:`ix_gpu.node.fake_devices_file.fake_backend`,
because a backend imports no process plumbing). ``auto`` tries ixml, then nvml, then devfs. Each
backend module is imported only when chosen, so a node without NVML never imports pynvml. Backends may import
:mod:`ix_gpu.devicemodel` and :mod:`ix_gpu.config`, never the server, the device list or the
process plumbing (child interpreters, file watching).
"""

from __future__ import annotations

import logging
from pathlib import Path

from ix_gpu.node.backends.base import Backend, BackendError

log = logging.getLogger(__name__)

BACKENDS = ("auto", "ixml", "nvml", "devfs", "fake")


def make_backend(kind: str, *, root: Path = Path("/")) -> Backend:
    """Build a hardware backend; :class:`BackendError` says why it cannot start (library missing...).
    ``fake`` is made from its devices file by the node layer instead."""
    if kind == "fake":
        raise ValueError("the fake backend is made from its devices file (ix_gpu.node.fake_devices_file)")
    if kind == "ixml":
        from ix_gpu.node.backends.ixml import IxmlBackend

        return IxmlBackend(root=root)
    if kind == "nvml":
        from ix_gpu.node.backends.nvml import NvmlBackend

        return NvmlBackend(root=root)
    if kind == "devfs":
        from ix_gpu.node.backends.devfs import DevfsBackend

        return DevfsBackend(root=root)
    if kind == "auto":
        reasons = []
        for candidate in ("ixml", "nvml"):
            try:
                backend = make_backend(candidate, root=root)
            except BackendError as exc:
                reasons.append(f"{candidate}: {exc}")
                continue
            log.info("backend auto: using %s", candidate)
            return backend
        log.info("backend auto: no management library (%s); using devfs", "; ".join(reasons))
        return make_backend("devfs", root=root)
    raise ValueError(f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")
