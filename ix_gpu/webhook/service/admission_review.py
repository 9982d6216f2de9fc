"""The AdmissionReview v1 envelope: parse what the apiserver sends, build what it expects back.

Only the envelope is validated (apiVersion, kind, request.uid, request.operation, request.object).
The object itself stays a plain dict from orjson: the mutation core reads the few fields it needs
and tolerates the rest, and validating a whole Pod through pydantic would cost more than the
mutation itself on the admission hot path.

Everything here is pure (bytes in, bytes out), so the HTTP layer cannot add behaviour by accident
and dry runs are side-effect free by construction.
"""

from __future__ import annotations

from binascii import b2a_base64
from dataclasses import dataclass
from typing import Any

import orjson

from ix_gpu.config.text import one_line, shown
from ix_gpu.webhook.core.decision import Decision, MutationResult

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"

MAX_BODY_BYTES = 3 * 1024 * 1024
"""The apiserver caps request bodies at 3 MiB; anything larger is not from it."""

# Operations whose request must carry the object being admitted.
_OBJECT_REQUIRED = frozenset(("CREATE", "UPDATE"))
_AUDIT_VALUE_LIMIT = 1024


class ReviewError(ValueError):
    """A body that is not an AdmissionReview v1 request; ``str()`` is the one-line 400 message."""


@dataclass(slots=True)  # not frozen: a frozen __init__ costs 3x, and one is made per review
class ReviewRequest:
    uid: str
    operation: str
    kind: str
    """``request.kind.kind`` (the resource's kind as the apiserver names it), else the object's."""
    namespace: str
    name: str
    obj: dict[str, Any] | None
    dry_run: bool

    def __init__(
        self,
        uid: str,
        operation: str,
        kind: str,
        namespace: str,
        name: str,
        obj: dict[str, Any] | None,
        dry_run: bool,
    ) -> None:
        # Written out, not generated: mypyc compiles this one (see docs/design.md).
        self.uid = uid
        self.operation = operation
        self.kind = kind
        self.namespace = namespace
        self.name = name
        self.obj = obj
        self.dry_run = dry_run


def _short(value: Any) -> str:
    """A bounded, one-line rendering of user input for error messages."""
    return shown(value, 57).replace("\n", " ").replace("\r", " ")


def _str_field(container: dict[str, Any] | None, key: str) -> str:
    value = container.get(key) if container is not None else None
    return value if isinstance(value, str) else ""


def parse_review(body: bytes) -> ReviewRequest:
    """Parse and check the envelope of an AdmissionReview request (raises :class:`ReviewError`)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ReviewError(f"body is not valid JSON: {one_line(exc)}") from None
    if not isinstance(doc, dict):
        raise ReviewError(f"body must be a JSON object (an AdmissionReview), got {type(doc).__name__}")
    if doc.get("apiVersion") != API_VERSION:
        raise ReviewError(f"apiVersion must be {API_VERSION}, got {_short(doc.get('apiVersion'))}")
    if doc.get("kind") != KIND:
        raise ReviewError(f"kind must be {KIND}, got {_short(doc.get('kind'))}")
    request = doc.get("request")
    if not isinstance(request, dict):
        raise ReviewError("request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request.uid is missing or not a non-empty string")
    operation = request.get("operation")
    if not isinstance(operation, str) or not operation:
        raise ReviewError("request.operation is missing or not a non-empty string")
    obj = request.get("object")
    if obj is None:
        if operation in _OBJECT_REQUIRED:
            raise ReviewError(f"request.object is required for {operation}")
    elif not isinstance(obj, dict):
        raise ReviewError(f"request.object must be an object, got {type(obj).__name__}")

    metadata = obj.get("metadata") if obj is not None else None
    if not isinstance(metadata, dict):
        metadata = None
    request_kind = request.get("kind")
    if not isinstance(request_kind, dict):
        request_kind = None
    kind = _str_field(request_kind, "kind") or _str_field(obj, "kind")
    return ReviewRequest(
        uid=uid,
        operation=operation,
        kind=kind,
        namespace=_str_field(request, "namespace") or _str_field(metadata, "namespace"),
        name=(
            _str_field(request, "name")
            or _str_field(metadata, "name")
            or _str_field(metadata, "generateName")
        ),
        obj=obj,
        dry_run=request.get("dryRun") is True,
    )


def _bounded(text: str) -> str:
    return text if len(text) <= _AUDIT_VALUE_LIMIT else text[: _AUDIT_VALUE_LIMIT - 3] + "..."


def review_response(
    uid: str,
    result: MutationResult,
    *,
    status_code: int = 403,
) -> bytes:
    """The AdmissionReview v1 response for a core decision.

    ``patchType``/``patch`` appear only when there are ops (the apiserver rejects a patchType
    without a patch). ``auditAnnotations`` record what was injected or why nothing was, so audit
    logs answer "why did my pod get / not get the driver" without the webhook's own logs.
    """
    decision = result.decision
    allowed = decision is not Decision.DENIED
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    patch = b""
    if result.ops and allowed:
        response["patchType"] = "JSONPatch"
        response["patch"] = ""  # the base64 text goes in below, as bytes
        patch = b2a_base64(orjson.dumps(result.ops), newline=False)
    if result.warnings:
        response["warnings"] = bounded_warnings(result.warnings)
    if not allowed:
        response["status"] = {"code": status_code, "message": one_line(result.reason, MAX_MESSAGE_CHARS)}
    # ``_value_``: the plain attribute behind ``.value``, which is a descriptor call on 3.11.
    audit = {"decision": decision._value_}
    if result.reason:
        audit["reason"] = _bounded(result.reason)
    response["auditAnnotations"] = audit
    answer = orjson.dumps({"apiVersion": API_VERSION, "kind": KIND, "response": response})
    if not patch:
        return answer
    # Spliced in rather than decoded to a str for orjson to check and copy again: 2-3 KB of
    # base64 per GPU pod. The first `"patch":""` is our key: a string before it (the uid) has
    # every quote in it escaped, so it cannot hold that sequence.
    at = answer.index(_EMPTY_PATCH) + len(_EMPTY_PATCH) - 1
    return answer[:at] + patch + answer[at:]


_EMPTY_PATCH = b'"patch":""'


def internal_error_result(message: str) -> MutationResult:
    """A denial for a bug on our side: failing closed matches ``failurePolicy: Fail``."""
    return MutationResult(Decision.DENIED, reason=f"internal error in the ix-gpu webhook: {message}")


MAX_WARNINGS = 20
"""The apiserver keeps about 4 KB of warning text per request and drops the rest; a pod with a
thousand conflicting containers would otherwise make us build and send a megabyte of them."""


MAX_MESSAGE_CHARS = 2048
"""A warning or denial quotes user values (a conflicting nodeSelector value, a key); keep it short."""


def bounded_warnings(warnings: list[str]) -> list[str]:
    if len(warnings) > MAX_WARNINGS:
        kept = warnings[: MAX_WARNINGS - 1]
        warnings = [*kept, f"... and {len(warnings) - len(kept)} more warnings"]
    return [w if len(w) <= MAX_MESSAGE_CHARS else one_line(w, MAX_MESSAGE_CHARS) for w in warnings]


def error_body(message: str) -> bytes:
    """The one-line JSON body of a 4xx answer to something that is not a usable review."""
    return orjson.dumps({"error": one_line(message)})
