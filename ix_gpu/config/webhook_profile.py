"""What a webhook config profile says a GPU container gets: driver volumes, device nodes, env,
privileged, scheduling; and the Kubernetes name types its fields are checked as.

Split from :mod:`ix_gpu.config.webhook_config` (workloads, policy, the whole config, its defaults
and its JSON Schema), which re-exports what callers read from here.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, field_validator, model_validator

from ix_gpu.config import k8s_names
from ix_gpu.config.schema_base import StrictModel

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

NonEmpty = Annotated[str, Field(min_length=1)]


def _rule(check: Callable[[str], list[str]]) -> AfterValidator:
    """One of :mod:`k8s_names`' rules as a validator, so the error is located at the field."""

    def validate(value: str) -> str:
        if problems := check(value):
            raise ValueError("; ".join(problems))
        return value

    return AfterValidator(validate)


def _schema(**schema: Any) -> Any:
    """What JSON Schema can say of the same rule (a pattern, a length), for editors and for the
    chart's values schema, which then refuses those values before anything is installed."""
    return Field(json_schema_extra=schema)


DnsLabel = Annotated[
    str,
    _rule(k8s_names.dns1123_label),
    _schema(pattern=k8s_names.DNS1123_LABEL_RE, maxLength=k8s_names.DNS1123_LABEL_MAX),
]
DnsSubdomain = Annotated[
    str,
    _rule(k8s_names.dns1123_subdomain),
    _schema(pattern=k8s_names.DNS1123_SUBDOMAIN_RE, maxLength=k8s_names.DNS1123_SUBDOMAIN_MAX),
]
QualifiedName = Annotated[str, _rule(k8s_names.qualified_name), _schema(pattern=k8s_names.QUALIFIED_NAME_RE)]
LabelValue = Annotated[
    str,
    _rule(k8s_names.label_value),
    _schema(pattern=k8s_names.LABEL_VALUE_RE, maxLength=k8s_names.LABEL_VALUE_MAX),
]
EnvName = Annotated[str, _rule(k8s_names.env_var_name), _schema(pattern=k8s_names.ENV_VAR_NAME_RE)]
AbsolutePath = Annotated[str, _rule(k8s_names.absolute_path), _schema(pattern=k8s_names.ABSOLUTE_PATH_RE)]
ResourcePattern = Annotated[
    str, _rule(k8s_names.extended_resource_pattern), _schema(pattern=k8s_names.RESOURCE_PATTERN_RE)
]
TolerationKey = Annotated[
    str,
    _rule(lambda key: k8s_names.qualified_name(key) if key else []),
    _schema(pattern="^$|" + k8s_names.QUALIFIED_NAME_RE),
]
NamespacePattern = Annotated[
    str, _rule(k8s_names.namespace_name_or_pattern), _schema(pattern=k8s_names.NAMESPACE_PATTERN_RE)
]


class ConfigModel(StrictModel):
    """A config model whose attribute docstrings become descriptions in :func:`json_schema`."""

    model_config = ConfigDict(use_attribute_docstrings=True)


class HostPathType(StrEnum):
    """``hostPath.type`` as Kubernetes spells it (empty string is the unchecked default)."""

    UNSET = ""
    DIRECTORY_OR_CREATE = "DirectoryOrCreate"
    DIRECTORY = "Directory"
    FILE_OR_CREATE = "FileOrCreate"
    FILE = "File"
    SOCKET = "Socket"
    CHAR_DEVICE = "CharDevice"
    BLOCK_DEVICE = "BlockDevice"


class HostPathVolume(ConfigModel):
    """A hostPath volume plus where it is mounted in each GPU container."""

    name: DnsLabel
    host_path: AbsolutePath
    type: HostPathType | None = None
    mount_path: AbsolutePath
    read_only: bool = False


class EnvMode(StrEnum):
    SET_IF_ABSENT = "set-if-absent"
    """Add the variable only if the container does not define it (the user wins)."""
    PREPEND_PATH = "prepend-path"
    """Treat the value as a ``:``-separated list and put ours first unless already present."""
    APPEND_PATH = "append-path"
    """As prepend-path, but ours goes last."""
    PREPEND_PATH_IF_SET = "prepend-path-if-set"
    """As prepend-path where the container's spec sets the variable; where it does not, nothing is
    added, so a value the image's ``ENV`` sets (which the webhook cannot see, and which any
    container ``env`` entry would replace) stands. For drivers the node puts in the container's
    linker cache: the device plugin with ``deviceListStrategy: cdi``, and DRA."""
    APPEND_PATH_IF_SET = "append-path-if-set"
    """As prepend-path-if-set, but ours goes last."""
    OVERRIDE = "override"
    """Always set our value."""


class EnvVar(ConfigModel):
    name: EnvName
    value: str
    mode: EnvMode = EnvMode.SET_IF_ABSENT


class DeviceNodes(ConfigModel):
    """Device-node hostPath mounts: the tf-operator GPU discussion's recipe for clusters *without* a
    device plugin.

    Off by default: a device plugin's Allocate already gives a container exactly its GPUs, and
    mounting every ``/dev/nvidia*`` by hostPath would let it see GPUs it was not allocated.
    """

    inject: bool = False
    volumes: tuple[HostPathVolume, ...] = ()


class Privileged(StrEnum):
    NEVER = "never"
    ALLOWED = "allowed"
    """Set ``privileged: true`` where policy permits, otherwise skip with a warning."""
    REQUIRED = "required"
    """Deny the object where ``privileged: true`` cannot be granted."""


class NodeSelectorRequirement(ConfigModel):
    key: QualifiedName
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: tuple[LabelValue, ...] = ()
    """A label value each; for ``Gt`` and ``Lt`` one integer."""

    @model_validator(mode="after")
    def _values_match_operator(self) -> NodeSelectorRequirement:
        if problems := k8s_names.node_selector_requirement(self.key, self.operator, self.values):
            raise ValueError("; ".join(problems))
        return self

    def to_k8s(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "operator": self.operator}
        if self.values:
            out["values"] = list(self.values)
        return out


class Affinity(ConfigModel):
    required_node_expressions: tuple[NodeSelectorRequirement, ...] = ()
    """ANDed into every term of the pod's required node affinity (a new term when it has none)."""


class Toleration(ConfigModel):
    key: TolerationKey | None = None
    """Empty or absent: every taint (then operator Exists)."""
    operator: Literal["Exists", "Equal"] = "Equal"
    value: LabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        problems = k8s_names.toleration(
            self.key, self.operator, self.value, self.effect, self.toleration_seconds
        )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def to_k8s(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class Profile(ConfigModel):
    """What a container asking for a matching GPU resource gets."""

    name: NonEmpty
    resources: tuple[ResourcePattern, ...] = Field(min_length=1)
    """Extended resource names (``domain/name``), exact or with a glob in the name part
    (``nvidia.com/mig-*``); never one that could match ``cpu``, ``memory`` or a ``kubernetes.io`` name."""
    volumes: tuple[HostPathVolume, ...] = ()
    device_nodes: DeviceNodes = DeviceNodes()
    env: tuple[EnvVar, ...] = ()
    privileged: Privileged = Privileged.NEVER
    node_selector: dict[QualifiedName, LabelValue] = Field(default_factory=dict)
    affinity: Affinity = Affinity()
    tolerations: tuple[Toleration, ...] = ()
    runtime_class_name: DnsSubdomain | None = None
    device_classes: tuple[DnsSubdomain, ...] = Field(
        default=(),
        # Left out of dumps while empty, so configs that never name one keep their digest.
        exclude_if=lambda value: not value,
    )
    """DRA DeviceClass names (``gpu.iluvatar.com``): a container that references a pod
    ``resourceClaims`` entry whose claim or claim template requests a device of one of these
    classes gets this profile, as it would for a matching resource in its limits."""

    @field_validator("name")
    @classmethod
    def _profile_name(cls, value: str) -> str:
        if not _DNS_LABEL.match(value):
            raise ValueError("must be lowercase letters, digits and '-'")
        return value

    @model_validator(mode="after")
    def _unique(self) -> Profile:
        mounts = self.all_volumes()
        require_unique("volume name", [v.name for v in mounts])
        require_unique("volume mountPath", [v.mount_path for v in mounts])
        require_unique("env name", [e.name for e in self.env])
        require_unique("device class", list(self.device_classes))
        return self

    def all_volumes(self) -> tuple[HostPathVolume, ...]:
        """Volumes to inject: driver volumes, plus device nodes when the operator turned them on."""
        return self.volumes + (self.device_nodes.volumes if self.device_nodes.inject else ())

    def matches(self, resource: str) -> bool:
        return any(fnmatch.fnmatchcase(resource, pattern) for pattern in self.resources)


def require_unique(what: str, values: list[str], field: str | None = None) -> None:
    """``field``: the list the values come from, so the error names both entries."""
    first: dict[str, int] = {}
    for index, value in enumerate(values):
        if value in first:
            where = f" ({field}[{first[value]}] and {field}[{index}])" if field else ""
            raise ValueError(f"duplicate {what} {value!r}{where}")
        first[value] = index
