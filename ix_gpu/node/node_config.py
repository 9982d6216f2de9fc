"""Per-node plugin configs: which of the ConfigMap's named configs this node uses.

A mixed cluster needs different ``splitboard``/``replicas`` per node. As with NVIDIA's plugin, the
ConfigMap holds several named configs (one key each, mounted as a directory) and the operator
labels a node ``ix-gpu.io/device-plugin.config=<name>``; a node without the label (or a plugin
outside a cluster) uses the default config.

The node is watched, not re-read on a timer (:class:`NodeLabelReader`): a list and a watch of
this one Node (``fieldSelector=metadata.name=<node>``, served from the apiserver's watch cache),
so a quiet cluster costs the apiserver one idle connection per agent and no request, where a
``GET`` a minute from each of 5,000 nodes' two agents was 167 requests a second. A label change
reaches the node within the watch's latency.

A list or watch that fails keeps what was heard before (the last known good node) and is retried
with backoff; a Node deleted and registered again keeps its last facts meanwhile: an apiserver
restart must change nothing a node offers.

When the label names a config the ConfigMap does not have, the node keeps the config it is using
and says so (log and metric) until the label or the ConfigMap is fixed: switching to the default
instead could change the node's advertised capacity under running pods because of a typo.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ix_gpu.config.text import one_line
from ix_gpu.devicemodel import labels
from ix_gpu.kube.list_watch import ApiListWatch
from ix_gpu.kube.watched_cache import WatchedCache
from ix_gpu.node.allocator import NodeFacts

if TYPE_CHECKING:
    from ix_gpu.kube.apiserver import ApiServer

log = logging.getLogger(__name__)

DEFAULT_NAME = "default"
FIRST_ANSWER_WAIT = 2.0
"""Seconds start-up waits for the node's first answer (and the device plugin's first device list
for its watches'): a node that joins with a label is configured by it from the start."""


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


class NodeLabelReader(WatchedCache):
    """This node's labels and allocatable (:class:`NodeFacts`), from a watch of this Node: the
    :data:`labels.DEVICE_PLUGIN_CONFIG` label for the config, the allocation label and
    allocatable for :mod:`ix_gpu.node.allocator` (the DRA plugin reads its node through
    this class too). While the watch fails the last facts stay (module doc)."""

    log = log

    def __init__(
        self,
        api: ApiServer,
        node: str,
        *,
        on_error: Callable[[str], None] | None = None,
        backoff: tuple[float, float] = (1.0, 30.0),
        watch_timeout: int = 300,
    ) -> None:
        """``on_error``: called with the message of each failed list or watch (a metric)."""
        self.what = f"node {node}"
        super().__init__(
            ApiListWatch(api, "/api/v1/nodes", self.what, field_selector=f"metadata.name={node}"),
            watch_timeout=watch_timeout,
            backoff=backoff,
        )
        self.api = api
        self.node = node
        self.on_error = on_error
        self._facts: NodeFacts | None = None

    def _entry(self, obj: Any) -> tuple[str, NodeFacts] | None:
        metadata = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(metadata, dict) or metadata.get("name") != self.node:
            # Only this Node is an answer: anything else read as a node without labels would move
            # a DRA node to the device plugin (both would hand out its chips).
            self.log.warning("ignored an answer that is not Node %s: %s", self.node, one_line(str(obj), 120))
            return None
        return self.node, NodeFacts.from_node(obj)

    def _changed(self) -> None:
        found = self._items.get(self.node)
        if found is not None:
            self._facts = found

    def _watch_failed(self) -> None:
        if self.on_error is not None and self._last_error is not None:
            self.on_error(self._last_error)

    def start_and_wait(self, timeout: float) -> NodeLabelReader:
        """Start watching and wait up to ``timeout`` seconds for the first answer (start-up
        decisions read it; without one they take their defaults)."""
        self.start()
        self.wait_synced(timeout)
        return self

    def facts(self) -> NodeFacts | None:
        """The node as last heard (None: never); the last known while the apiserver fails."""
        return self._facts

    def value(self) -> str | None:
        """The config label's value (None: absent); the last known one while the apiserver fails."""
        facts = self.facts()
        return None if facts is None else facts.labels.get(labels.DEVICE_PLUGIN_CONFIG)
