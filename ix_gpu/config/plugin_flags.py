"""The device plugin config's ``flags``: the Iluvatar plugin's (``splitboard``, ``usevolcano``,
``reset_gpu``, in the spelling of its 4.4 ConfigMap, which must load unchanged) and NVIDIA's
(``api/config/v1`` ``Flags``, with ``flags.plugin`` and ``flags.gfd``).

What each NVIDIA flag does here is in docs/configuration.md's table: mapped onto ours, accepted and
reported as without effect (:meth:`ix_gpu.config.plugin_config.PluginConfig.notices`), or refused
where it asks for something ix-gpu does not do.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from ix_gpu.config.plugin_runtime import DeviceIdStrategy, DeviceListStrategy
from ix_gpu.config.schema_base import StrictModel
from ix_gpu.config.text import shown

NVIDIA_DEVICE_LIST_STRATEGIES = {"envvar": DeviceListStrategy.ENVVAR, "cdi-cri": DeviceListStrategy.CDI}
"""NVIDIA's ``flags.plugin.deviceListStrategy`` values we serve, and what they mean here."""

VENDOR_FLAGS = {"splitboard": "SPLIT_BOARD", "usevolcano": "USE_VOLCANO", "reset_gpu": "RESET_GPU"}
"""The Iluvatar plugin's flags, each also a command-line flag (``--<key>``) and an environment
variable of its own (the plugin's 4.4 ``cmd/main.go``): the command line wins over the variable,
the variable over the file, as there. The node agents' flags (:mod:`ix_gpu.node.agent`, which
must not import pydantic) declare the same table; a test holds them equal."""


class NvidiaPluginFlags(StrictModel):
    """NVIDIA's ``flags.plugin``: settings of its device plugin proper."""

    pass_device_specs: bool | None = None
    device_list_strategy: str | list[str] | None = None
    device_id_strategy: DeviceIdStrategy | None = Field(default=None, alias="deviceIDStrategy")
    cdi_annotation_prefix: str | None = None
    nvidia_ctk_path: str | None = Field(default=None, alias="nvidiaCTKPath")
    container_driver_root: str | None = None
    shared_devices_allocation_policy: Literal["distributed", "packed"] | None = None

    @field_validator("device_list_strategy")
    @classmethod
    def _known_strategies(cls, value: str | list[str] | None) -> str | list[str] | None:
        strategies = [value] if isinstance(value, str) else value or []
        others = [s for s in strategies if s not in NVIDIA_DEVICE_LIST_STRATEGIES]
        if others or (value is not None and not strategies):
            raise ValueError(
                f"only {' and '.join(map(repr, NVIDIA_DEVICE_LIST_STRATEGIES))} are supported (the "
                f"visible-devices variable is always set), got {shown(others[0] if others else value)}"
            )
        return value

    @property
    def list_strategy(self) -> DeviceListStrategy | None:
        """Ours for theirs: CDI when ``cdi-cri`` is among them (the variable is always set)."""
        if self.device_list_strategy is None:
            return None
        strategies = (
            [self.device_list_strategy]
            if isinstance(self.device_list_strategy, str)
            else self.device_list_strategy
        )
        return DeviceListStrategy.CDI if "cdi-cri" in strategies else DeviceListStrategy.ENVVAR


class NvidiaGfdFlags(StrictModel):
    """NVIDIA's ``flags.gfd``: settings of gpu-feature-discovery, which reads the same file."""

    oneshot: bool | None = None
    no_timestamp: bool | None = None
    sleep_interval: str | int | float | None = None
    output_file: str | None = None
    machine_type_file: str | None = None


class Flags(StrictModel):
    """``flags``: the Iluvatar plugin's three (spelled as its ConfigMap spells them) and NVIDIA's."""

    splitboard: bool = False
    """True: every chip is a device. False (vendor default): one device per board."""
    usevolcano: bool = False
    """Bind the chips Volcano's scheduler chose for the pod (its ``iluvatar.com/DevVolcano``
    annotation) instead of the kubelet's choice (:mod:`ix_gpu.plugin.offer.volcano`)."""
    reset_gpu: bool = Field(default=False, alias="reset_gpu")
    """Reset the chips of every allocation before the new pod gets them, so no tenant inherits
    another's memory or state (:mod:`ix_gpu.node.gpu_reset`)."""

    # NVIDIA's flags (api/config/v1 ``Flags``); what each does here is in docs/configuration.md's table.
    mig_strategy: str | None = None
    fail_on_init_error: bool | None = None
    nvidia_driver_root: str | None = None
    nvidia_dev_root: str | None = None
    mps_root: str | None = None
    gdrcopy_enabled: bool | None = None
    gds_enabled: bool | None = None
    mofed_enabled: bool | None = None
    use_node_feature_api: bool | None = Field(default=None, alias="useNodeFeatureAPI")
    device_discovery_strategy: str | None = None
    plugin: NvidiaPluginFlags | None = None
    gfd: NvidiaGfdFlags | None = None

    @field_validator("mig_strategy")
    @classmethod
    def _no_mig(cls, value: str | None) -> str | None:
        if value is None or value == "none":
            return value
        if value in ("single", "mixed"):
            raise ValueError(f"MIG is not supported by ix-gpu: only 'none' is accepted, got {shown(value)}")
        raise ValueError(f"unknown MIG strategy {shown(value)}: only 'none' is accepted")

    @field_validator("gdrcopy_enabled", "gds_enabled", "mofed_enabled")
    @classmethod
    def _no_extra_devices(cls, value: bool | None) -> bool | None:
        # NVIDIA then adds GDRCopy/GDS/MOFED device nodes to every container; a pod that relies on
        # them would fail at run time here, far from this file.
        if value:
            raise ValueError("ix-gpu does not inject these devices: only false is accepted")
        return value
