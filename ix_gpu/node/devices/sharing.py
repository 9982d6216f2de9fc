"""Which resource the plugin advertises, and which of its devices are time-sliced how many times.

The config says it in one of two forms (see :mod:`ix_gpu.config.plugin_config`; the plugin
holds it as :class:`RuntimeConfig`): the Iluvatar plugin's
``timeSlicing.replicas`` for the plugin's own resource, or NVIDIA's ``timeSlicing.resources`` list,
whose entries name a resource (``gpu`` meaning the plugin's domain) and may rename it or select
some of its devices. Deciding needs the resource the plugin serves, which comes from the backend's
vendor, so it happens here and not in the config schema: one ConfigMap may hold entries for
``nvidia.com/gpu`` and ``iluvatar.com/gpu`` and serve both kinds of node.

The result names exactly one resource. The config schema already refuses the one NVIDIA form that
would need two (a renamed entry that selects only some devices: the others keep the old name).
"""

from __future__ import annotations

from dataclasses import dataclass

from ix_gpu.config.plugin_runtime import SHARED_SUFFIX, DeviceSelection, RuntimeConfig, qualify

ENTRIES_KEY = "sharing.timeSlicing.resources"
REPLICAS_KEY = "sharing.timeSlicing.replicas"


@dataclass(frozen=True)
class SharingPlan:
    resource: str
    """The extended resource the plugin registers: renamed when the shared devices are."""
    base: str
    """The resource before any rename: ``resourceName``, else the vendor's."""
    replicas: int
    """Replicas per shared device; 1 when nothing is shared."""
    devices: DeviceSelection
    """Which devices are shared (all of them unless an entry selects some)."""
    key: str
    """The config key that decided it, for messages about the selection."""
    notes: tuple[str, ...]
    """Accepted settings that change nothing here, one line each, for the log."""

    @property
    def shared(self) -> bool:
        return self.replicas > 1


def plan_sharing(config: RuntimeConfig, vendor_resource: str) -> SharingPlan:
    """What ``config`` means for a plugin whose vendor advertises ``vendor_resource``. Pure and
    cheap: called for every device-list build and for the resource name."""
    base = config.resource_name or vendor_resource
    notes = list(config.notices)
    replicas, key = config.replicas, REPLICAS_KEY
    devices: DeviceSelection = "all"
    rename: str | None = None
    if config.shared_resources:
        entries = config.shared_resources
        matching = [(n, e) for n, e in enumerate(entries) if qualify(e.name, base) == base]
        if not matching:
            names = ", ".join(sorted({qualify(e.name, base) for e in entries}))
            notes.append(f"{ENTRIES_KEY} has no entry for {base} (only {names}): its devices are not shared")
            replicas = 1
        else:
            n, entry = matching[0]
            for other, _ in matching[1:]:
                notes.append(f"{ENTRIES_KEY}[{other}] is ignored: {ENTRIES_KEY}[{n}] already names {base}")
            replicas, devices, key = entry.replicas, entry.devices, f"{ENTRIES_KEY}[{n}]"
            rename = qualify(entry.rename, base) if entry.rename is not None else None
    if replicas > 1 and rename is None and config.rename_by_default:
        rename = base + SHARED_SUFFIX
    resource = rename if replicas > 1 and rename is not None else base
    return SharingPlan(
        resource=resource, base=base, replicas=replicas, devices=devices, key=key, notes=tuple(notes)
    )
