"""The device plugin config's sharing keys (``sharing.timeSlicing``, both forms) and the resource
names they may give: the part of the schema that decides how many times each device is advertised.

The Iluvatar plugin's ``timeSlicing.replicas`` and NVIDIA's ``timeSlicing.resources`` list are one
schema (see :mod:`ix_gpu.config.plugin_config`); what they mean for a node's devices is decided
where the vendor's resource is known, in :func:`ix_gpu.node.devices.sharing.plan_sharing`, which
the device plugin and the DRA plugin both read.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from ix_gpu.config.plugin_runtime import DeviceSelection
from ix_gpu.config.schema_base import StrictModel
from ix_gpu.config.text import shown

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_MIG_INDEX = re.compile(r"\d+:\d+")


def resource_name_problem(value: str, *, bare: bool) -> str | None:
    """Why the kubelet would refuse ``value`` as an extended resource name (None when it would not).

    ``bare``: a name without ``domain/`` is allowed (NVIDIA's ``name: gpu``); the plugin qualifies
    it with its own resource's domain. Said at load time, not in a registration retry loop."""
    domain, sep, name = value.rpartition("/")
    if not sep and bare:
        ok = len(name) <= 63 and _NAME.fullmatch(name) is not None
        return (
            None
            if ok
            else f"must be a resource name such as 'gpu' or 'vendor.example/gpu', got {shown(value)}"
        )
    if (
        not sep
        or "." not in domain
        or len(domain) > 253
        or _DNS_SUBDOMAIN.fullmatch(domain) is None
        or len(name) > 63
        or _NAME.fullmatch(name) is None
    ):
        return f"must look like 'vendor.example/name', got {shown(value)}"
    return None


# -- sharing ----------------------------------------------------------------------------------------


def _device_selection(value: Any) -> DeviceSelection:
    if value == "all":
        return "all"
    if isinstance(value, (bool, float)):
        raise ValueError(f"must be 'all', a count or a list of device indices or UUIDs, got {shown(value)}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"a count of devices must be at least 1, got {value}")
        return value
    if isinstance(value, str):
        raise ValueError(f"the only word accepted is 'all', got {shown(value)}")
    if not isinstance(value, list) or not value:
        raise ValueError(
            f"must be 'all', a count or a non-empty list of device indices or UUIDs, got {shown(value)}"
        )
    refs: list[int | str] = []
    for item in value:
        ref: int | str
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            ref = item
        elif isinstance(item, str) and item.isascii() and item.isdigit():
            ref = int(item)
        elif isinstance(item, str) and (_MIG_INDEX.fullmatch(item) or item.startswith("MIG-")):
            raise ValueError(f"{shown(item)} is a MIG device: MIG is not supported by ix-gpu")
        elif isinstance(item, str) and item and item.strip() == item:
            ref = item
        else:
            raise ValueError(f"a device is a chip index (0, 1, ...) or a chip UUID, got {shown(item)}")
        if ref in refs:
            raise ValueError(f"lists device {shown(ref)} twice")
        refs.append(ref)
    return tuple(refs)


class SharedResource(StrictModel):
    """One ``sharing.timeSlicing.resources`` entry (NVIDIA's ``ReplicatedResource``)."""

    name: str
    """The resource whose devices are shared: ``gpu`` (the plugin's domain) or ``domain/name``."""
    rename: str | None = None
    """Advertise the shared devices under this name instead."""
    replicas: int
    devices: DeviceSelection = "all"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if problem := resource_name_problem(value, bare=True):
            raise ValueError(problem)
        return value

    @field_validator("rename")
    @classmethod
    def _rename(cls, value: str | None) -> str | None:
        if value is not None and (problem := resource_name_problem(value, bare=True)):
            raise ValueError(problem)
        return value

    @field_validator("replicas")
    @classmethod
    def _shares(cls, value: int) -> int:
        # As NVIDIA's: an entry with one replica shares nothing, and would still rename.
        if value < 2:
            raise ValueError(f"must be at least 2 (an entry shares its devices), got {value}")
        return value

    @field_validator("devices", mode="plain")
    @classmethod
    def _devices(cls, value: Any) -> DeviceSelection:
        return _device_selection(value)


class TimeSlicing(StrictModel):
    replicas: int = 1
    """Each physical device is advertised this many times, as ``<id>::<i>`` (the Iluvatar plugin's key)."""
    rename_by_default: bool = False
    """Shared devices are advertised as ``<resource>.shared`` unless an entry names a ``rename``."""
    fail_requests_greater_than_one: bool = False
    """Reject a container asking for more than one shared device: two replicas of one GPU are not
    twice the GPU, and a user asking for 2 usually believes they are."""
    resources: tuple[SharedResource, ...] = ()
    """NVIDIA's form: replicas per resource name; entries for resources this plugin does not serve
    are ignored (one file may serve several kinds of node)."""

    @field_validator("replicas")
    @classmethod
    def _at_least_one(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"must be at least 1 (1 means no sharing), got {value}")
        return value

    @model_validator(mode="after")
    def _one_form(self) -> TimeSlicing:
        if "replicas" in self.model_fields_set and self.resources:
            raise ValueError(
                "give replicas (the Iluvatar plugin's form) or resources (NVIDIA's form), not both"
            )
        seen: dict[str, int] = {}
        for n, entry in enumerate(self.resources):
            if entry.name in seen:
                raise ValueError(
                    f"resources[{n}].name {shown(entry.name)} repeats resources[{seen[entry.name]}].name"
                )
            seen[entry.name] = n
            renamed = entry.rename != entry.name if entry.rename is not None else self.rename_by_default
            if renamed and entry.devices != "all":
                # NVIDIA then advertises the unselected devices under the old name and the shared
                # ones under the new: two resources. This plugin registers one resource name.
                raise ValueError(
                    f"resources[{n}].devices selects some devices of a renamed resource "
                    f"({'rename' if entry.rename is not None else 'renameByDefault'}): the others would "
                    "need a second resource name, and ix-gpu serves one; use devices: all, or do not rename"
                )
        return self


class Sharing(StrictModel):
    time_slicing: TimeSlicing = Field(default_factory=TimeSlicing)
    mps: Any = None
    """NVIDIA's MPS sharing: refused, it needs NVIDIA's MPS control daemon."""

    @field_validator("time_slicing", mode="before")
    @classmethod
    def _shares_something(cls, value: Any) -> Any:
        # As NVIDIA's plugin: a timeSlicing that names nothing to share is a mistake (a key lost in
        # an edit), not "no sharing"; omit the section for that.
        names_nothing = isinstance(value, dict) and (
            value.get("resources") == [] or ("replicas" not in value and not value.get("resources"))
        )
        if names_nothing:
            raise ValueError(
                "no resources specified: give replicas (the Iluvatar plugin's form) or a non-empty "
                "resources list (NVIDIA's); leave timeSlicing out for no sharing"
            )
        return value

    @field_validator("mps")
    @classmethod
    def _no_mps(cls, value: Any) -> None:
        if value is not None:
            raise ValueError("MPS is NVIDIA's and not supported by ix-gpu; share with sharing.timeSlicing")
        return None
