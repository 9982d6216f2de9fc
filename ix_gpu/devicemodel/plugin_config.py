"""The device plugin's configuration: the vendor ConfigMap's keys, verbatim, plus ours.

Operators already run Iluvatar's plugin with a ConfigMap whose ``ix-config`` key holds::

    flags:
      splitboard: false
    sharing:
      timeSlicing:
        replicas: 4

That document must load unchanged, so the seed's keys keep their spelling (``splitboard`` is one
lowercase word, not ``splitBoard``). Our additions live under clearly named keys next to them and
all have defaults, so a vendor file never needs them. Unknown keys are errors naming the key: a
typo such as ``replica: 4`` silently ignored would advertise 1 device where 4 were meant.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from ix_gpu.devicemodel.schema_base import ConfigError, StrictModel, load_yaml_file, parse_document

DEFAULT_PATH = "/ixconfig/ix-config"
"""Where the seed's DaemonSet mounts the ConfigMap (volume ``ixc`` at ``/ixconfig``, key ``ix-config``)."""


class Flags(StrictModel):
    splitboard: bool = False
    """True: every chip is a device. False (vendor default): one device per board."""


class TimeSlicing(StrictModel):
    replicas: int = 1
    """Each physical device is advertised this many times, as ``<id>::<i>``."""
    fail_requests_greater_than_one: bool = False
    """Reject a container asking for more than one shared device: two replicas of one GPU are not
    twice the GPU, and a user asking for 2 usually believes they are."""

    @field_validator("replicas")
    @classmethod
    def _at_least_one(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"must be at least 1 (1 means no sharing), got {value}")
        return value


class Sharing(StrictModel):
    time_slicing: TimeSlicing = Field(default_factory=TimeSlicing)


class Health(StrictModel):
    interval_seconds: float = Field(default=5.0, gt=0, le=3600)
    """How often chips are polled; the vendor plugin polls every 5 s."""
    recover_after: int = Field(default=3, ge=1)
    """Consecutive healthy checks before an Unhealthy device is advertised Healthy again.
    Recovery at all is the point (NVIDIA's plugin never recovers); the streak keeps a flapping
    chip from being handed to one pod after another."""


class DeviceIdStrategy(StrEnum):
    """What the visible-devices variable lists: chip UUIDs (stable) or library indices."""

    UUID = "uuid"
    INDEX = "index"


class ReplicaPolicy(StrEnum):
    """How GetPreferredAllocation picks time-sliced replicas."""

    SPREAD = "spread"
    """Prefer the least-used physical GPU: neighbours share as little as possible."""
    PACK = "pack"
    """Prefer already-used physical GPUs: keep whole GPUs free for large requests."""


class Allocation(StrictModel):
    replica_policy: ReplicaPolicy = ReplicaPolicy.SPREAD


class Labels(StrictModel):
    enabled: bool = False
    """Publish product/count/memory/replicas node labels (needs RBAC to patch the node)."""


class PluginConfig(StrictModel):
    """The whole ``ix-config`` document."""

    resource_name: str | None = None
    """Extended resource to advertise; the vendor's (``iluvatar.com/gpu``) when absent."""
    flags: Flags = Field(default_factory=Flags)
    sharing: Sharing = Field(default_factory=Sharing)
    health: Health = Field(default_factory=Health)
    device_id_strategy: DeviceIdStrategy = DeviceIdStrategy.UUID
    allocation: Allocation = Field(default_factory=Allocation)
    labels: Labels = Field(default_factory=Labels)

    @field_validator("resource_name")
    @classmethod
    def _qualified(cls, value: str | None) -> str | None:
        # The kubelet rejects a Register for a resource that is not ``domain/name``; say it here,
        # at load time, instead of in a registration retry loop.
        if value is None:
            return None
        domain, sep, name = value.partition("/")
        if not sep or not domain or not name or "." not in domain or "/" in name:
            raise ValueError(f"must look like 'vendor.example/name', got {value!r}")
        return value

    @property
    def replicas(self) -> int:
        return self.sharing.time_slicing.replicas


def parse_plugin_config(data: Any, source: str = "config") -> PluginConfig:
    return parse_document(PluginConfig, data, source)


def load_plugin_config(path: str | Path) -> PluginConfig:
    """Load ``path``; every failure is a :class:`ConfigError` naming the file and the field."""
    return load_yaml_file(PluginConfig, path)


__all__ = [
    "DEFAULT_PATH",
    "Allocation",
    "ConfigError",
    "DeviceIdStrategy",
    "Flags",
    "Health",
    "Labels",
    "PluginConfig",
    "ReplicaPolicy",
    "Sharing",
    "TimeSlicing",
    "load_plugin_config",
    "parse_plugin_config",
]
