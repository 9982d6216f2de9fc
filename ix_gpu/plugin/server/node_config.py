"""Per-node plugin configs: which of the ConfigMap's named configs this node uses.

A mixed cluster needs different ``splitboard``/``replicas`` per node. As with NVIDIA's plugin, the
ConfigMap holds several named configs (one key each, mounted as a directory) and the operator
labels a node ``ix-gpu.io/device-plugin.config=<name>``; a node without the label (or a plugin
outside a cluster) uses the default config.

The label is re-read on a timer, not watched: one ``GET`` of this node with
``resourceVersion=0`` (answered from the apiserver's watch cache, no etcd read) every
``interval`` seconds costs the apiserver ~17 cheap reads a second for a thousand nodes at the
default 60 s, holds no connection and no extra thread in a process meant to stay small, and
survives apiserver restarts with no re-list logic. Label changes are rare operator actions; a
minute's delay before a node changes its config is what NVIDIA's config-manager also allows for
(it restarts the plugin).

When the label names a config the ConfigMap does not have, the node keeps the config it is using
and says so (log and metric) until the label or the ConfigMap is fixed: switching to the default
instead could change the node's advertised capacity under running pods because of a typo.
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ix_gpu.config.text import one_line
from ix_gpu.devicemodel import labels
from ix_gpu.devicemodel.allocation import NodeFacts

if TYPE_CHECKING:
    from ix_gpu.runtime.kube import ApiServer

log = logging.getLogger(__name__)

DEFAULT_NAME = "default"


def named_configs(directory: Path) -> dict[str, Path]:
    """The configs a mounted ConfigMap directory holds: each visible regular file, by name
    (Kubernetes' ``..data`` and ``..<timestamp>`` entries are hidden)."""
    found: dict[str, Path] = {}
    for entry in sorted(directory.iterdir()):
        if not entry.name.startswith(".") and entry.is_file():
            found[entry.name] = entry
    return found


@dataclass(frozen=True)
class Choice:
    name: str | None
    """The config to use; None: none fits (keep the one in use)."""
    reason: str
    """Why, for the log."""


def choose(names: Collection[str], label: str | None, default: str | None) -> Choice:
    """The config for a node labelled ``label`` (None: no label) among ``names``."""
    if label:
        if label in names:
            return Choice(label, f"node label {labels.DEVICE_PLUGIN_CONFIG}={label}")
        return Choice(
            None,
            f"node label {labels.DEVICE_PLUGIN_CONFIG}={one_line(label, 100)} names no config "
            f"(the ConfigMap has: {', '.join(sorted(names)) or 'none'})",
        )
    if default is not None:
        if default in names:
            return Choice(default, f"the default config {default!r} (no node label)")
        return Choice(None, f"the default config {default!r} is not in the ConfigMap")
    if DEFAULT_NAME in names:
        return Choice(DEFAULT_NAME, f"the config named {DEFAULT_NAME!r} (no node label)")
    if len(names) == 1:
        only = next(iter(names))
        return Choice(only, f"the only config, {only!r} (no node label)")
    return Choice(
        None,
        f"no node label, no --default-config and no config named {DEFAULT_NAME!r} among "
        f"{', '.join(sorted(names)) or 'none'}",
    )


class NodeLabelReader:
    """This node's labels and allocatable (:class:`NodeFacts`), re-read at most every ``interval``:
    the :data:`labels.DEVICE_PLUGIN_CONFIG` label for the config, the allocation label and
    allocatable for :mod:`ix_gpu.devicemodel.allocation` (the DRA plugin reads its node through
    this class too)."""

    def __init__(self, api: ApiServer, node: str, interval: float = 60.0) -> None:
        self.api = api
        self.node = node
        self.interval = interval
        self._read_at: float | None = None
        self._facts: NodeFacts | None = None
        self._last_error: str | None = None

    def facts(self) -> NodeFacts | None:
        """The node as last read (None: never read); the last known while the apiserver fails."""
        now = time.monotonic()
        if self._read_at is not None and now - self._read_at < self.interval:
            return self._facts
        self._read_at = now
        path = f"/api/v1/nodes/{urllib.parse.quote(self.node)}?resourceVersion=0"
        try:
            node = self.api.request("GET", path, timeout=10, max_bytes=1 << 20)
        except (OSError, ValueError) as exc:
            message = one_line(exc, 300)
            if message != self._last_error:
                log.error("cannot read node %s (keeping what was read before): %s", self.node, message)
            self._last_error = message
            return self._facts
        self._last_error = None
        self._facts = NodeFacts.from_node(node)
        return self._facts

    def value(self) -> str | None:
        """The config label's value (None: absent); the last known one while the apiserver fails."""
        facts = self.facts()
        return None if facts is None else facts.labels.get(labels.DEVICE_PLUGIN_CONFIG)
