"""The apiserver's rules for the values the webhook puts into a Pod, written once.

A webhook config value that Kubernetes refuses does not fail where it is written: it fails on
*every* GPU pod the webhook mutates, cluster-wide, with the apiserver's message and not ours. So
each value is checked at load time by the rule the apiserver applies to the field it lands in.
Each function mirrors one Kubernetes function (named beside it, as of Kubernetes 1.35) and returns
its problems, empty when the value is valid, the way apimachinery's ``Is...`` functions do.

Where Kubernetes' rule depends on the version, the rule of the oldest supported version (the
chart's ``kubeVersion``, 1.30) applies, so a valid config is valid on every supported cluster.

Pure functions and regular expressions: no pydantic, so both processes and the chart's schema
generator can use them. The ``*_RE`` patterns are plain RE2/ECMA syntax, and go into the JSON
Schema too.
"""

from __future__ import annotations

import re

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
QUALIFIED_NAME_MAX = 63
LABEL_VALUE_MAX = 63

DNS1123_LABEL_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_NAME_PART = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
QUALIFIED_NAME_RE = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?" + _NAME_PART + "$"
"""Without the length limits (253 for the prefix, 63 for the name), which :func:`qualified_name` adds."""
LABEL_VALUE_RE = r"^(" + _NAME_PART + ")?$"
ENV_VAR_NAME_RE = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
ABSOLUTE_PATH_RE = r"^/"
RESOURCE_PATTERN_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[-A-Za-z0-9_.*?]+$"
"""What :func:`extended_resource_pattern` accepts, roughly: a literal domain, then a name or a glob."""
NAMESPACE_PATTERN_RE = r"^[-a-z0-9*?]+$"
"""What :func:`namespace_name_or_pattern` accepts, roughly."""

_DNS1123_LABEL = re.compile(DNS1123_LABEL_RE)
_DNS1123_SUBDOMAIN = re.compile(DNS1123_SUBDOMAIN_RE)
_NAME = re.compile("^" + _NAME_PART + "$")
_LABEL_VALUE = re.compile(LABEL_VALUE_RE)
_ENV_VAR_NAME = re.compile(ENV_VAR_NAME_RE)
_GLOB = frozenset("*?")
_ANY_GLOB = frozenset("*?[")


def dns1123_label(value: str) -> list[str]:
    """k8s.io/apimachinery/pkg/util/validation.IsDNS1123Label (volume names, namespace names)."""
    problems = []
    if len(value) > DNS1123_LABEL_MAX:
        problems.append(f"must be no more than {DNS1123_LABEL_MAX} characters")
    if not _DNS1123_LABEL.match(value):
        problems.append("must be a DNS label: lower case letters, digits and '-', alphanumeric at both ends")
    return problems


def dns1123_subdomain(value: str) -> list[str]:
    """k8s.io/apimachinery/pkg/util/validation.IsDNS1123Subdomain (runtimeClassName, label prefixes)."""
    problems = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        problems.append(f"must be no more than {DNS1123_SUBDOMAIN_MAX} characters")
    if not _DNS1123_SUBDOMAIN.match(value):
        problems.append(
            "must be a DNS subdomain: lower case letters, digits, '-' and '.', alphanumeric at both ends"
        )
    return problems


def qualified_name(value: str) -> list[str]:
    """k8s.io/apimachinery/pkg/util/validation.IsQualifiedName: label keys (nodeSelector, node
    affinity, tolerations), ``[prefix/]name`` with a DNS subdomain prefix and a 63-character name."""
    parts = value.split("/")
    if len(parts) > 2:
        return ["must be a qualified name, [prefix/]name, with at most one '/'"]
    name = parts[-1]
    problems = []
    if len(parts) == 2:
        if not parts[0]:
            problems.append("prefix part must be non-empty")
        else:
            problems.extend(f"prefix part {p}" for p in dns1123_subdomain(parts[0]))
    if not name:
        problems.append("name part must be non-empty")
    elif len(name) > QUALIFIED_NAME_MAX:
        problems.append(f"name part must be no more than {QUALIFIED_NAME_MAX} characters")
    if name and not _NAME.match(name):
        problems.append(
            "name part must be letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
        )
    return problems


def label_value(value: str) -> list[str]:
    """k8s.io/apimachinery/pkg/util/validation.IsValidLabelValue (nodeSelector and toleration
    values, node affinity values): empty, or up to 63 of ``[A-Za-z0-9_.-]``, alphanumeric at both ends."""
    problems = []
    if len(value) > LABEL_VALUE_MAX:
        problems.append(f"must be no more than {LABEL_VALUE_MAX} characters")
    if not _LABEL_VALUE.match(value):
        problems.append(
            "must be a label value: letters, digits, '-', '_' and '.', starting and ending with a letter "
            "or digit (or empty)"
        )
    return problems


def env_var_name(value: str) -> list[str]:
    """k8s.io/apimachinery/pkg/util/validation.IsEnvVarName. Kubernetes 1.32+ may accept any printable
    ASCII but '=' (IsRelaxedEnvVarName, feature RelaxedEnvironmentVariableValidation); 1.30 does not."""
    problems = []
    if not _ENV_VAR_NAME.match(value):
        problems.append(
            "must be an environment variable name: letters, digits, '_', '-' and '.', not starting "
            "with a digit"
        )
    if value in (".", "..") or value.startswith(".."):
        problems.append("must not be '.' or '..', nor start with '..'")
    return problems


def absolute_path(value: str) -> list[str]:
    """hostPath.path and volumeMounts[].mountPath: absolute (what the kubelet needs: a relative
    mountPath fails at container start), and no ``..`` element (k8s.io/kubernetes/pkg/apis/core/
    validation.validatePathNoBacksteps, applied to hostPath.path)."""
    problems = []
    if not value.startswith("/"):
        problems.append("must be an absolute path")
    if ".." in value.split("/"):
        problems.append("must not contain '..'")
    return problems


def extended_resource_name(value: str) -> list[str]:
    """A resource a device plugin advertises and a container asks for: k8s.io/kubernetes/pkg/apis/
    core/helper.IsExtendedResourceName, as validateContainerResourceName applies it. ``domain/name``
    where the domain is not (and does not end with) ``kubernetes.io``, so never a native resource
    (``cpu``, ``memory``, ``hugepages-2Mi``), and ``requests.<value>`` is a qualified name (which
    is how quota names it)."""
    if "/" not in value:
        return [
            f"must be an extended resource, domain/name; {value!r} would be a native resource (cpu, memory…)"
        ]
    if "kubernetes.io/" in value:
        return ["must not be in the kubernetes.io domain (native resources)"]
    if value.startswith("requests."):
        return ["must not start with 'requests.'"]
    return qualified_name("requests." + value)


def extended_resource_pattern(value: str) -> list[str]:
    """An extended resource name, or a glob over the *name* part of one (``nvidia.com/mig-*``).

    The domain stays literal: a glob there (``*``, ``*/gpu``, ``*.io/x``) could match ``cpu``,
    ``memory`` or a ``kubernetes.io`` resource, and the webhook would then read a CPU request as a
    GPU count. ``*`` and ``?`` are the glob characters (fnmatch's; ``[...]`` is refused, since the
    chart translates globs into CEL)."""
    domain, sep, name = value.partition("/")
    if not sep or not _GLOB & set(name) or _GLOB & set(domain) or "[" in value:
        if _ANY_GLOB & set(value):
            return [
                "a resource glob is domain/name-glob with '*' or '?' only in the name part "
                f"(e.g. nvidia.com/mig-*), so it can never match a native resource; got {value!r}"
            ]
        return extended_resource_name(value)
    # The literal parts must fit a name: check the name with each glob character standing for "a".
    problems = extended_resource_name(f"{domain}/{_sample(name)}")
    return [f"{p} (in the glob {value!r})" for p in problems]


def namespace_name_or_pattern(value: str) -> list[str]:
    """A namespace name (k8s.io/apimachinery/pkg/api/validation.ValidateNamespaceName: a DNS label)
    or a glob over namespace names with ``*`` and ``?`` (``team-*``). The chart sends exact names
    to a namespaceSelector and globs to CEL, which reads ``[...]`` differently from fnmatch."""
    if "[" in value:
        return ["a namespace glob takes '*' and '?' only"]
    if not _GLOB & set(value):
        return dns1123_label(value)
    if value.strip("*") == "":
        return []
    return [f"{p} (in the glob {value!r})" for p in dns1123_label(_sample(value))]


def _sample(glob: str) -> str:
    """The literal characters of a glob at their places, each ``?`` as ``a`` and each ``*`` as
    nothing, except at an end, where it stands for ``a``: enough to check that the literal parts
    break no rule of the name (first and last character, allowed characters, length)."""
    body = glob.replace("?", "a")
    start = "a" if body.startswith("*") else ""
    end = "a" if body.endswith("*") and len(body) > 1 else ""
    return start + body.replace("*", "") + end


def is_pattern(value: str) -> bool:
    """Whether a name field holds a glob (fnmatch's characters) rather than a literal name."""
    return bool(_ANY_GLOB & set(value))


def _int64(text: str) -> bool:
    """Go's strconv.ParseInt(text, 10, 64) succeeds (as the scheduler parses Gt/Lt values)."""
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        return False
    return -(2**63) <= int(text) < 2**63


def node_selector_requirement(key: str, operator: str, values: tuple[str, ...]) -> list[str]:
    """k8s.io/kubernetes/pkg/apis/core/validation.ValidateNodeSelectorRequirement, plus what the
    scheduler needs of Gt and Lt (k8s.io/component-helpers/scheduling/corev1/nodeaffinity parses the
    one value with strconv.ParseInt; a value it cannot parse matches no node, so every pod stays
    Pending). Problems name the field (``key``, ``values``)."""
    problems = [f"key: {p}" for p in qualified_name(key)]
    if operator in ("In", "NotIn") and not values:
        problems.append(f"values: operator {operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        problems.append(f"values: operator {operator} takes no values")
    if operator in ("Gt", "Lt") and (len(values) != 1 or not _int64(values[0])):
        problems.append(f"values: operator {operator} needs one integer value")
    for index, value in enumerate(values):
        problems.extend(f"values[{index}]: {p}" for p in label_value(value))
    return problems


def toleration(
    key: str | None, operator: str, value: str | None, effect: str | None, seconds: int | None
) -> list[str]:
    """k8s.io/kubernetes/pkg/apis/core/validation.ValidateTolerations (operators Equal and Exists;
    Gt and Lt need a feature gate that 1.35 still has off). An absent and an empty key are the same
    there: the empty key tolerates every taint, so it needs operator Exists."""
    problems = [f"key: {p}" for p in qualified_name(key)] if key else []
    if not key and operator != "Exists":
        problems.append("operator: an empty key needs operator Exists (it matches every taint)")
    if seconds is not None and effect != "NoExecute":
        problems.append("effect: tolerationSeconds needs effect NoExecute")
    if operator == "Exists" and value:
        problems.append("value: operator Exists takes no value")
    if operator == "Equal" and value:
        problems.extend(f"value: {p}" for p in label_value(value))
    return problems


__all__ = [
    "absolute_path",
    "dns1123_label",
    "dns1123_subdomain",
    "env_var_name",
    "extended_resource_name",
    "extended_resource_pattern",
    "is_pattern",
    "label_value",
    "namespace_name_or_pattern",
    "node_selector_requirement",
    "qualified_name",
    "toleration",
]
