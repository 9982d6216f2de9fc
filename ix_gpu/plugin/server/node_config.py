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

A read that fails keeps what was read before (the last known good node), and is retried sooner
than the interval (:class:`~ix_gpu.runtime.periodic_read.PeriodicRead`): an apiserver restart must
change nothing a node offers, and the node is current again soon after.

When the label names a config the ConfigMap does not have, the node keeps the config it is using
and says so (log and metric) until the label or the ConfigMap is fixed: switching to the default
instead could change the node's advertised capacity under running pods because of a typo.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ix_gpu.config.text import one_line
from ix_gpu.devicemodel import labels
from ix_gpu.devicemodel.allocation import NodeFacts
from ix_gpu.runtime.periodic_read import PeriodicRead

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
    this class too). A read that fails keeps the last answer (:class:`PeriodicRead`)."""

    def __init__(
        self,
        api: ApiServer,
        node: str,
        interval: float = 60.0,
        *,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        """``on_error``: called with the message of each failed read (a metric)."""
        self.api = api
        self.node = node
        self.interval = interval
        self.read = PeriodicRead(f"node {node}", self._read, interval, logger=log, on_error=on_error)

    def _read(self) -> NodeFacts:
        path = f"/api/v1/nodes/{urllib.parse.quote(self.node)}?resourceVersion=0"
        node = self.api.request("GET", path, timeout=10, max_bytes=1 << 20)
        metadata = node.get("metadata") if isinstance(node, dict) else None
        if not isinstance(metadata, dict) or metadata.get("name") != self.node:
            # Only this Node is an answer: anything else read as a node without labels would move
            # a DRA node to the device plugin (both would hand out its chips).
            raise ValueError(f"the answer is not Node {self.node}: {one_line(str(node), 120)}")
        return NodeFacts.from_node(node)

    def facts(self) -> NodeFacts | None:
        """The node as last read (None: never read); the last known while the apiserver fails."""
        return self.read.get()

    def value(self) -> str | None:
        """The config label's value (None: absent); the last known one while the apiserver fails."""
        facts = self.facts()
        return None if facts is None else facts.labels.get(labels.DEVICE_PLUGIN_CONFIG)
