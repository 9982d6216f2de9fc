"""The device plugin's settings as the running plugin reads them: plain, frozen data.

The ``ix-config`` schema (:mod:`ix_gpu.config.plugin_config`: our format and NVIDIA's, errors
with field and line) is pydantic, and pydantic with those models costs a process about 12 MiB. The
plugin runs on every GPU node for months, so it holds only this compiled form:
:meth:`PluginConfig.runtime` makes it after validation, which the plugin does in a short-lived
child process (:mod:`ix_gpu.node.config_loader`). Everything here is importable without
pydantic; ``tests/plugin/test_plugin_process.py`` checks that the process never imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, TypeAlias

SHARED_SUFFIX = ".shared"
"""What ``renameByDefault`` appends to a shared resource's name, as NVIDIA's plugin does."""


def qualify(name: str, like: str) -> str:
    """``gpu`` → ``<domain of like>/gpu``; a qualified name stays as it is. NVIDIA qualifies bare
    names with ``nvidia.com``; here the domain is that of the resource the plugin serves."""
    return name if "/" in name else f"{like.partition('/')[0]}/{name}"


class DeviceIdStrategy(StrEnum):
    """What the visible-devices variable lists: chip UUIDs (stable) or library indices."""

    UUID = "uuid"
    INDEX = "index"


class DeviceListStrategy(StrEnum):
    """How Allocate hands the devices to the container runtime."""

    ENVVAR = "envvar"
    """Device specs (the chips' device nodes and the control nodes) plus the visible-devices
    variable, which every runtime understands."""
    CDI = "cdi"
    """Fully qualified CDI device names (``iluvatar.com/gpu=<id>``) that the runtime resolves in
    the spec the plugin writes under ``cdi.specDir``, plus the visible-devices variable; no device
    specs (the CDI spec has the nodes). Needs containerd 1.7+ or CRI-O with CDI enabled."""


class ReplicaPolicy(StrEnum):
    """How GetPreferredAllocation picks time-sliced replicas."""

    SPREAD = "spread"
    """Prefer the least-used physical GPU: neighbours share as little as possible."""
    PACK = "pack"
    """Prefer already-used physical GPUs: keep whole GPUs free for large requests."""


DeviceSelection: TypeAlias = Literal["all"] | int | tuple[int | str, ...]
"""Which devices of a resource are shared: ``"all"``, the first N (an int), or a tuple of chip
indices (ints) and UUIDs (strings), as NVIDIA's ``devices`` field allows minus its MIG forms."""


@dataclass(frozen=True)
class SharedEntry:
    """One ``sharing.timeSlicing.resources`` entry (NVIDIA's ``ReplicatedResource``), validated."""

    name: str
    replicas: int
    devices: DeviceSelection = "all"
    rename: str | None = None


@dataclass(frozen=True)
class RuntimeConfig:
    """A validated ``ix-config``, flattened to what the plugin reads (see the module docstring).
    Built only by :meth:`PluginConfig.runtime`, so the defaults live in one place: the schema."""

    digest: str
    """Identifies the settings (not the file's bytes): a reload with the same digest changes nothing."""
    resource_name: str | None
    splitboard: bool
    replicas: int
    """The Iluvatar plugin's ``sharing.timeSlicing.replicas``."""
    rename_by_default: bool
    fail_requests_greater_than_one: bool
    shared_resources: tuple[SharedEntry, ...]
    health_interval_seconds: float
    recover_after: int
    device_id_strategy: DeviceIdStrategy
    device_list_strategy: DeviceListStrategy
    cdi_spec_dir: str
    cdi_driver_root: str | None
    replica_policy: ReplicaPolicy
    labels_enabled: bool
    usevolcano: bool
    """Bind the chips Volcano's scheduler wrote on the pod instead of the kubelet's choice."""
    reset_gpu: bool
    """Reset an allocation's chips before the pod gets them."""
    reset_timeout_seconds: float
    notices: tuple[str, ...]
    """Accepted settings that change nothing here (NVIDIA keys), one line each, for the log."""
