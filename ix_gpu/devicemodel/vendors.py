"""GPU vendors we know how to serve, and the facts about each that both processes rely on.

The webhook uses these to build its built-in default profiles; the plugin uses them to name device
nodes and the environment variable through which a container learns which GPUs it was given.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Vendor:
    """Static facts about one GPU vendor's software stack on a node."""

    name: str
    resource_name: str
    """Extended resource the device plugin advertises and pods request."""
    device_node_template: str
    """Per-GPU character device, formatted with the GPU's minor number."""
    control_nodes: tuple[str, ...]
    """Device nodes every GPU container needs besides its own GPUs (may be absent on old drivers)."""
    driver_root: str
    """Host directory holding the user-space driver libraries and tools."""
    library_dir: str
    """Directory that must be on LD_LIBRARY_PATH inside the container."""
    visible_devices_env: str
    """Environment variable the runtime/libraries read to restrict visible GPUs."""
    pci_vendor_id: int
    runtime_provides_driver: bool = False
    """The vendor's container runtime hook (or CDI) puts the driver libraries into GPU containers,
    so the webhook's built-in profile mounts none and sets no LD_LIBRARY_PATH: a hostPath would
    shadow the toolkit in the user's image and fail on nodes without that directory."""

    device_class: str | None = None
    """The DRA DeviceClass through which pods claim this vendor's GPUs (``ix-gpu dra`` and the
    chart's ``dra.enabled`` create it for Iluvatar); None where we ship no DRA driver."""

    @property
    def device_classes(self) -> tuple[str, ...]:
        """The DeviceClasses the chart creates for the driver: :attr:`device_class`, which selects
        the form ``splitboard`` picks (a board or a chip), and ``any.<device_class>``, which selects
        boards and chips alike for a claim that picks one by attribute (:mod:`ix_gpu.dra.devices`)."""
        return (self.device_class, f"{ANY_FORM_PREFIX}{self.device_class}") if self.device_class else ()

    def device_node(self, minor: int) -> str:
        return self.device_node_template.format(minor=minor)


ANY_FORM_PREFIX = "any."

ILUVATAR = Vendor(
    name="iluvatar",
    resource_name="iluvatar.com/gpu",
    device_node_template="/dev/iluvatar{minor}",
    control_nodes=("/dev/itrctl",),
    driver_root="/usr/local/corex",
    library_dir="/usr/local/corex/lib64",
    visible_devices_env="IX_VISIBLE_DEVICES",
    pci_vendor_id=0x1E3E,
    device_class="gpu.iluvatar.com",
)

NVIDIA = Vendor(
    name="nvidia",
    resource_name="nvidia.com/gpu",
    device_node_template="/dev/nvidia{minor}",
    control_nodes=("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"),
    # The CUDA layout of hand-written GPU pods (LD_LIBRARY_PATH=/usr/local/cuda/lib64). Not mounted by
    # the built-in profile: the NVIDIA container toolkit provides the driver
    # (examples/nvidia-hostpath-driver.yaml is the profile for hosts that want the mount).
    driver_root="/usr/local/cuda",
    library_dir="/usr/local/cuda/lib64",
    visible_devices_env="NVIDIA_VISIBLE_DEVICES",
    pci_vendor_id=0x10DE,
    runtime_provides_driver=True,
)

VENDORS: dict[str, Vendor] = {v.name: v for v in (ILUVATAR, NVIDIA)}
