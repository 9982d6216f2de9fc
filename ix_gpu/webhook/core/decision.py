"""What the mutation core decides, and the namespace facts it decides with.

Modelled on controller-runtime's admission helpers: the outcome has a name (mutated, unchanged,
skipped, denied), so the service maps it to HTTP, audit annotations and metrics in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Decision(StrEnum):
    MUTATED = "mutated"
    """Ops were produced."""
    UNCHANGED = "unchanged"
    """A GPU workload that already has everything (e.g. a reinvocation): no ops."""
    SKIPPED = "skipped"
    """Not ours to touch: opted out, excluded namespace, no GPU request, unknown kind, ..."""
    DENIED = "denied"


@dataclass(frozen=True, slots=True)
class NamespaceFacts:
    """What the webhook knows about the namespace of the object.

    ``known=False`` means the namespace could not be looked up (no cluster access, API server
    unreachable): opt-outs by namespace annotation or label cannot be honoured, and neither can
    Pod Security levels be checked; the core then stays on the safe side.
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    known: bool = True

    @classmethod
    def unknown(cls, name: str) -> NamespaceFacts:
        return cls(name=name, known=False)


@dataclass(slots=True)  # not frozen: a frozen __init__ costs 3x, and one is made per review
class MutationResult:
    decision: Decision
    ops: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    reason: str = ""
    """Why it was skipped or denied, or what was injected — one line for audit logs and users."""
    profiles: tuple[str, ...] = ()
    pod_security_unchecked: bool = False
    """hostPath was injected while the namespace's Pod Security level was unknown."""
    allowed_unknown: str = ""
    """``namespace`` or ``claim``: what ``allow-unmodified`` let through without its injection,
    counted (``ix_gpu_admission_allowed_unmodified_total``) and alerted on."""

    def __init__(
        self,
        decision: Decision,
        ops: list[dict[str, Any]] | None = None,
        warnings: list[str] | None = None,
        reason: str = "",
        profiles: tuple[str, ...] = (),
        pod_security_unchecked: bool = False,
        allowed_unknown: str = "",
    ) -> None:
        # Written out, not generated: mypyc compiles this one (see docs/design.md).
        self.decision = decision
        self.ops = [] if ops is None else ops
        self.warnings = [] if warnings is None else warnings
        self.reason = reason
        self.profiles = profiles
        self.pod_security_unchecked = pod_security_unchecked
        self.allowed_unknown = allowed_unknown

    @property
    def allowed(self) -> bool:
        return self.decision is not Decision.DENIED


def skipped(reason: str, warnings: list[str] | None = None) -> MutationResult:
    return MutationResult(Decision.SKIPPED, reason=reason, warnings=warnings or [])


def denied(reason: str, warnings: list[str] | None = None) -> MutationResult:
    return MutationResult(Decision.DENIED, reason=reason, warnings=warnings or [])
