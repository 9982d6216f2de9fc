"""What the running device plugin is started with (:class:`PluginSettings`): made by the start-up
(:mod:`ix_gpu.plugin.startup`) from the flags and what :func:`ix_gpu.node.agent.start_node` made
ready, read by :class:`ix_gpu.plugin.server.app.PluginApp`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ix_gpu.kube.apiserver import ApiServer
    from ix_gpu.node.node_config import NodeLabelReader
    from ix_gpu.plugin.server.allocation_gate import DevicePluginGate


@dataclass(frozen=True)
class PluginSettings:
    device_plugin_dir: Path
    config_path: Path | None = None
    """Re-read on every health check; ``None`` runs on the defaults."""
    metrics_port: int | None = None
    metrics_host: str = "::"  # both IP families: ix_gpu.serving.guarded_http.listen_socket
    node_name: str | None = None
    api_server: ApiServer | None = None
    """Where to publish node labels (``labels.enabled``); ``None`` outside a cluster."""
    config_dir: Path | None = None
    """A directory of named configs (a mounted ConfigMap): the node label
    ``ix-gpu.io/device-plugin.config`` picks one (:mod:`.node_config`); ``config_path`` is then
    the one chosen at start."""
    default_config: str | None = None
    node_config: NodeLabelReader | None = None
    """Reads the node's config label; ``None`` without cluster access (the default applies)."""
    allocation: DevicePluginGate | None = None
    """Whether this node's GPUs are the device plugin's to hand out (the node's
    ``ix-gpu.io/gpu.allocation`` label, the DRA driver's slices); ``None``: always."""
    telemetry_interval: float = 10.0
    """How often the chips' telemetry may be read for ``/metrics`` (:mod:`ix_gpu.node.telemetry`);
    0: none."""
    pod_resources_socket: Path | None = None
    """The kubelet's PodResources socket, read with the telemetry for each chip's holders
    (:mod:`.pod_resources`); None: chips are shown without their pods."""
    dra_driver: str | None = None
    """The DRA driver whose claims' devices on this node are ours (for attribution)."""
    socket_id: str | None = None
    """Makes the plugin's socket its own (``iluvatar-gpu-<id>.sock``): two instances on a node
    during a rolling update (:mod:`.plugin_sockets`); None: the vendor's name."""
    vendor_overrides: dict[str, bool] | None = None
    """The Iluvatar flags given on the command line or in the environment; they win over every
    config the plugin reads, at start and on reload."""
