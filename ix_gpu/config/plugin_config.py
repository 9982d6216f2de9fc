"""The device plugin's configuration: the vendor ConfigMap's keys verbatim, NVIDIA's format, and ours.

Operators already run Iluvatar's plugin with a ConfigMap whose ``ix-config`` key holds (4.4's
manifests, with ``usevolcano: true`` in the Volcano one; ``sharing`` where they share chips)::

    resourceName: "iluvatar.com/gpu"
    flags:
      splitboard: false
      usevolcano: false
      reset_gpu: false
    sharing:
      timeSlicing:
        replicas: 4

That document must load unchanged, so the Iluvatar device plugin's keys keep their spelling
(``splitboard`` is one lowercase word, ``reset_gpu`` has an underscore). Our additions live under
clearly named keys next to them and all have defaults, so a vendor file never needs them. Unknown
keys are errors naming the key (and, for a file, its line): a typo such as ``replica: 4`` silently
ignored would advertise 1 device where 4 were meant.

Operators coming from NVIDIA's k8s-device-plugin bring its ``api/config/v1`` file instead::

    version: v1
    flags:
      migStrategy: none
    sharing:
      timeSlicing:
        renameByDefault: true
        failRequestsGreaterThanOne: true
        resources:
          - name: nvidia.com/gpu
            replicas: 4

Both formats are one schema: ``timeSlicing.replicas: R`` is shorthand for one ``resources`` entry
naming the plugin's own resource, so ``renameByDefault`` and ``failRequestsGreaterThanOne`` mean the
same in either. NVIDIA keys fall in three groups (docs/configuration.md's table lists each): those we have an
equivalent for are mapped onto it (``deviceIDStrategy``, ``sharedDevicesAllocationPolicy``); those
that cannot change what a pod gets are accepted and reported by :meth:`PluginConfig.notices`; those
that ask for something ix-gpu does not do (MIG, MPS, CDI, GPUDirect) are errors naming the key,
because accepting them would fail the workload later, far from the cause.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from ix_gpu.config.input_files import CONFIG_MAX_BYTES, read_capped
from ix_gpu.config.plugin_flags import (
    NVIDIA_DEVICE_LIST_STRATEGIES,
    VENDOR_FLAGS,
    Flags,
    NvidiaGfdFlags,
    NvidiaPluginFlags,
)
from ix_gpu.config.plugin_runtime import (
    SHARED_SUFFIX,
    DeviceIdStrategy,
    DeviceListStrategy,
    DeviceSelection,
    ReplicaPolicy,
    RuntimeConfig,
    SharedEntry,
    qualify,
)
from ix_gpu.config.plugin_sharing import SharedResource, Sharing, TimeSlicing, resource_name_problem
from ix_gpu.config.schema_base import StrictModel, parse_document, parse_yaml
from ix_gpu.config.text import shown

DEFAULT_PATH = "/ixconfig/ix-config"
"""Where the Iluvatar device plugin's DaemonSet mounts the ConfigMap (volume ``ixc`` at ``/ixconfig``,
key ``ix-config``)."""

NVIDIA_CONFIG_VERSION = "v1"

NVIDIA_ALLOCATION_POLICY = {"distributed": ReplicaPolicy.SPREAD, "packed": ReplicaPolicy.PACK}
"""``flags.plugin.sharedDevicesAllocationPolicy`` → ``allocation.replicaPolicy``."""


# -- the rest of ours -------------------------------------------------------------------------------


class Health(StrictModel):
    interval_seconds: float = Field(default=5.0, gt=0, le=3600)
    """How often chips are polled; the vendor plugin polls every 5 s."""
    recover_after: int = Field(default=3, ge=1)
    """Consecutive healthy checks before an Unhealthy device is advertised Healthy again.
    Recovery at all is the point (NVIDIA's plugin never recovers); the streak keeps a flapping
    chip from being handed to one pod after another."""


class Allocation(StrictModel):
    replica_policy: ReplicaPolicy = ReplicaPolicy.SPREAD


class Cdi(StrictModel):
    spec_dir: str = "/var/run/cdi"
    """Where the CDI spec is written (``<vendor>-<class>.json``), with ``deviceListStrategy: cdi``
    or ``ix-gpu cdi generate``; the container runtime's CDI spec directory."""
    driver_root: str | None = None
    """Host directory of the driver, mounted read-only into GPU containers (default: the
    vendor's, ``/usr/local/corex``; none for NVIDIA, whose toolkit provides the driver)."""

    @field_validator("spec_dir", "driver_root")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"must be an absolute path, got {shown(value)}")
        return value


class Labels(StrictModel):
    enabled: bool = False
    """Publish product/count/memory/replicas node labels (needs RBAC to patch the node)."""


class GpuReset(StrictModel):
    """Ours, beside ``flags.reset_gpu``: how a reset is bounded."""

    timeout_seconds: float = Field(default=60.0, gt=0, le=600)
    """A reset that has not finished by then fails the allocation (the tool is killed). Resetting
    a chip takes a few seconds; the kubelet waits for Allocate without a bound of its own."""


class NvidiaResourcePattern(StrictModel):
    pattern: str
    name: str


class NvidiaResources(StrictModel):
    """NVIDIA's top-level ``resources`` (rename by product pattern), which NVIDIA's own plugin
    ignores with a warning today; so does this one."""

    gpus: tuple[NvidiaResourcePattern, ...] = ()
    mig: tuple[NvidiaResourcePattern, ...] = ()


class PluginConfig(StrictModel):
    """The whole ``ix-config`` document."""

    version: str | None = None
    """NVIDIA's format version; only ``v1`` exists. Our format has none."""
    resource_name: str | None = None
    """Extended resource to advertise; the vendor's (``iluvatar.com/gpu``) when absent."""
    flags: Flags = Field(default_factory=Flags)
    resources: NvidiaResources | None = None
    sharing: Sharing = Field(default_factory=Sharing)
    health: Health = Field(default_factory=Health)
    device_id_strategy: DeviceIdStrategy = DeviceIdStrategy.UUID
    device_list_strategy: DeviceListStrategy = DeviceListStrategy.ENVVAR
    cdi: Cdi = Field(default_factory=Cdi)
    allocation: Allocation = Field(default_factory=Allocation)
    labels: Labels = Field(default_factory=Labels)
    gpu_reset: GpuReset = Field(default_factory=GpuReset)
    imex: Any = None
    """NVIDIA's IMEX channels (multi-node NVLink): refused."""

    @field_validator("version")
    @classmethod
    def _known_version(cls, value: str | None) -> str | None:
        if value is not None and value != NVIDIA_CONFIG_VERSION:
            raise ValueError(
                f"unknown version {shown(value)}: only {NVIDIA_CONFIG_VERSION} (NVIDIA's format) is known"
            )
        return value

    @field_validator("resource_name")
    @classmethod
    def _qualified(cls, value: str | None) -> str | None:
        if value is not None and (problem := resource_name_problem(value, bare=False)):
            raise ValueError(problem)
        return value

    @field_validator("sharing")
    @classmethod
    def _no_reset_of_shared_chips(cls, value: Sharing, info: ValidationInfo) -> Sharing:
        flags = info.data.get("flags")
        slicing = value.time_slicing
        if isinstance(flags, Flags) and flags.reset_gpu and (slicing.replicas > 1 or slicing.resources):
            raise ValueError(
                "time-slicing shares each chip among pods, and flags.reset_gpu: true would reset a chip "
                "under the pods already on it whenever another is given a replica: use one or the other"
            )
        return value

    @field_validator("imex")
    @classmethod
    def _no_imex(cls, value: Any) -> None:
        if value is not None:
            raise ValueError("IMEX channels are NVIDIA's and not supported by ix-gpu")
        return None

    # An NVIDIA key and ours for the same setting may both be given only when they agree; the
    # check runs where ours was given (so the error names it), the mapping in ``_from_nvidia``.

    @field_validator("device_id_strategy")
    @classmethod
    def _agrees_with_nvidia_id_strategy(
        cls, value: DeviceIdStrategy, info: ValidationInfo
    ) -> DeviceIdStrategy:
        theirs = _nvidia_plugin_flags(info).device_id_strategy
        if theirs is not None and theirs != value:
            raise ValueError(f"{value} contradicts flags.plugin.deviceIDStrategy: {theirs}; set one of them")
        return value

    @field_validator("device_list_strategy")
    @classmethod
    def _agrees_with_nvidia_list_strategy(
        cls, value: DeviceListStrategy, info: ValidationInfo
    ) -> DeviceListStrategy:
        theirs = _nvidia_plugin_flags(info).list_strategy
        if theirs is not None and theirs != value:
            raise ValueError(
                f"{value} contradicts flags.plugin.deviceListStrategy "
                f"({_nvidia_plugin_flags(info).device_list_strategy}); set one of them"
            )
        return value

    @field_validator("allocation")
    @classmethod
    def _agrees_with_nvidia_policy(cls, value: Allocation, info: ValidationInfo) -> Allocation:
        theirs = _nvidia_plugin_flags(info).shared_devices_allocation_policy
        given = "replica_policy" in value.model_fields_set
        if theirs is not None and given and NVIDIA_ALLOCATION_POLICY[theirs] != value.replica_policy:
            raise ValueError(
                f"replicaPolicy: {value.replica_policy} contradicts "
                f"flags.plugin.sharedDevicesAllocationPolicy: {theirs}; set one of them"
            )
        return value

    @model_validator(mode="after")
    def _from_nvidia(self) -> PluginConfig:
        plugin = self.flags.plugin
        if plugin is None:
            return self
        update: dict[str, Any] = {}
        if plugin.device_id_strategy is not None:
            update["device_id_strategy"] = plugin.device_id_strategy
        if plugin.list_strategy is not None:
            update["device_list_strategy"] = plugin.list_strategy
        if plugin.shared_devices_allocation_policy is not None:
            policy = NVIDIA_ALLOCATION_POLICY[plugin.shared_devices_allocation_policy]
            update["allocation"] = self.allocation.model_copy(update={"replica_policy": policy})
        return self.model_copy(update=update) if update else self

    @property
    def replicas(self) -> int:
        """The Iluvatar plugin's ``sharing.timeSlicing.replicas``; what a resource gets is decided per
        resource by :func:`ix_gpu.node.devices.sharing.plan_sharing`."""
        return self.sharing.time_slicing.replicas

    def notices(self) -> tuple[str, ...]:
        """One line per NVIDIA key that was accepted but changes nothing here, for the log: the
        operator should know which of their settings are not in effect."""
        flags, plugin = self.flags, self.flags.plugin
        out: list[str] = []

        def ignored(key: str, why: str) -> None:
            out.append(f"{key} is ignored: {why}")

        if flags.fail_on_init_error is False:
            ignored(
                "flags.failOnInitError: false", "the plugin exits when no backend can start, and is restarted"
            )
        for key, value in (
            ("nvidiaDriverRoot", flags.nvidia_driver_root),
            ("nvidiaDevRoot", flags.nvidia_dev_root),
        ):
            if value not in (None, "/"):
                ignored(f"flags.{key}", "device nodes and sysfs are read under the --root directory")
        if flags.mps_root is not None:
            ignored("flags.mpsRoot", "MPS is not supported")
        if flags.use_node_feature_api:
            ignored("flags.useNodeFeatureAPI", "ix-gpu labels nodes itself (labels.enabled)")
        if flags.device_discovery_strategy not in (None, "auto"):
            ignored("flags.deviceDiscoveryStrategy", "the backend is chosen with ix-gpu plugin --backend")
        if plugin is not None:
            if plugin.pass_device_specs is False:
                ignored("flags.plugin.passDeviceSpecs: false", "device nodes are always passed in Allocate")
            for key, value in (
                ("cdiAnnotationPrefix", plugin.cdi_annotation_prefix),
                ("nvidiaCTKPath", plugin.nvidia_ctk_path),
                ("containerDriverRoot", plugin.container_driver_root),
            ):
                if value is not None:
                    ignored(f"flags.plugin.{key}", "it serves NVIDIA's CDI device-list strategies only")
        if flags.gfd is not None:
            ignored("flags.gfd", "it configures gpu-feature-discovery, not the device plugin")
        if self.resources is not None and (self.resources.gpus or self.resources.mig):
            ignored(
                "resources",
                "as by NVIDIA's plugin; rename with sharing.timeSlicing.resources[].rename or resourceName",
            )
        return tuple(out)

    def runtime(self) -> RuntimeConfig:
        """The plain, pydantic-free form the running plugin holds (:mod:`.plugin_runtime`)."""
        slicing = self.sharing.time_slicing
        return RuntimeConfig(
            digest=self.digest(),
            resource_name=self.resource_name,
            splitboard=self.flags.splitboard,
            replicas=slicing.replicas,
            rename_by_default=slicing.rename_by_default,
            fail_requests_greater_than_one=slicing.fail_requests_greater_than_one,
            shared_resources=tuple(
                SharedEntry(name=e.name, replicas=e.replicas, devices=e.devices, rename=e.rename)
                for e in slicing.resources
            ),
            health_interval_seconds=self.health.interval_seconds,
            recover_after=self.health.recover_after,
            device_id_strategy=self.device_id_strategy,
            device_list_strategy=self.device_list_strategy,
            cdi_spec_dir=self.cdi.spec_dir,
            cdi_driver_root=self.cdi.driver_root,
            replica_policy=self.allocation.replica_policy,
            labels_enabled=self.labels.enabled,
            usevolcano=self.flags.usevolcano,
            reset_gpu=self.flags.reset_gpu,
            reset_timeout_seconds=self.gpu_reset.timeout_seconds,
            notices=self.notices(),
        )


def _nvidia_plugin_flags(info: ValidationInfo) -> NvidiaPluginFlags:
    flags = info.data.get("flags")
    return flags.plugin if isinstance(flags, Flags) and flags.plugin is not None else NvidiaPluginFlags()


# -- loading ------------------------------------------------------------------------------------------


def parse_plugin_config(data: Any, source: str = "config") -> PluginConfig:
    """Validate an already-parsed document; errors name ``source`` and the field."""
    return parse_document(PluginConfig, data, source)


def parse_plugin_yaml(content: bytes | str, source: str) -> PluginConfig:
    """Parse and validate an ``ix-config`` file's content; errors name ``source``, the line and the
    field (``line 7: flags.migStrategy: ...``), as the webhook's config errors do."""
    return parse_yaml(PluginConfig, content, source)


def with_vendor_flags(config: PluginConfig, overrides: dict[str, bool], source: str) -> PluginConfig:
    """``config`` with the Iluvatar flags given on the command line or in the environment
    (:data:`VENDOR_FLAGS`), which win over the file's; validated again, so a flag that contradicts
    the file (``--reset_gpu`` with replicas) is an error naming both."""
    if not overrides:
        return config
    document = config.model_dump(by_alias=True, exclude_unset=True, warnings=False)
    document.setdefault("flags", {}).update(overrides)
    given = ", ".join(f"{key}={str(value).lower()}" for key, value in sorted(overrides.items()))
    return parse_plugin_config(document, f"{source} with the flags {given}")


def load_plugin_config(path: str | Path) -> PluginConfig:
    """Load ``path``; every failure is a :class:`ConfigError` naming the file and the field."""
    return parse_plugin_yaml(read_capped(path, CONFIG_MAX_BYTES), str(path))


__all__ = [
    "DEFAULT_PATH",
    "NVIDIA_ALLOCATION_POLICY",
    "NVIDIA_CONFIG_VERSION",
    "NVIDIA_DEVICE_LIST_STRATEGIES",
    "SHARED_SUFFIX",
    "VENDOR_FLAGS",
    "Allocation",
    "Cdi",
    "DeviceIdStrategy",
    "DeviceListStrategy",
    "DeviceSelection",
    "Flags",
    "GpuReset",
    "Health",
    "Labels",
    "NvidiaGfdFlags",
    "NvidiaPluginFlags",
    "NvidiaResources",
    "PluginConfig",
    "ReplicaPolicy",
    "SharedResource",
    "Sharing",
    "TimeSlicing",
    "load_plugin_config",
    "parse_plugin_config",
    "parse_plugin_yaml",
    "qualify",
    "resource_name_problem",
    "with_vendor_flags",
]
