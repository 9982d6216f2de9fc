"""One admission, start to finish: envelope → namespace facts → mutation core → response.

This is the only place that combines the pure pieces with the service's live state (current
config, namespace source) and its side channels (metrics, one structured log line). It knows
nothing about HTTP beyond "a status code and bytes", so the FastAPI layer stays a thin adapter.

Nothing here writes anywhere except metrics and logs, so ``request.dryRun`` needs no special
path: a dry run is answered exactly like the real request would be.
"""

from __future__ import annotations

import logging
import pickle
import time
import traceback
from collections.abc import Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any

from ix_gpu.config.text import one_line
from ix_gpu.config.webhook_config import NamespaceLookupFailure
from ix_gpu.process.json_logging import info_line
from ix_gpu.webhook.core.claims import UNKNOWN_CLAIMS, ClaimFacts
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import Decision, MutationResult, NamespaceFacts, denied
from ix_gpu.webhook.core.mutation import mutate
from ix_gpu.webhook.service.admission_review import (
    ReviewError,
    ReviewRequest,
    error_body,
    internal_error_result,
    parse_review,
    review_response,
)
from ix_gpu.webhook.service.claim_cache import ClaimCache, ClaimName, MissRecorder
from ix_gpu.webhook.service.hot_reload import LiveConfig
from ix_gpu.webhook.service.limits import HeavyLane, Limits, OverBudget, WorkerDied
from ix_gpu.webhook.service.metrics import OTHER, UNKNOWN, ServiceMetrics
from ix_gpu.webhook.service.namespace_cache import NamespaceLookupFailed, NamespaceSource

log = logging.getLogger("ix_gpu.admission")


@dataclass(frozen=True, slots=True)
class LookupFailed:
    """The namespace could not be read (handed to the core's second pass as what is known)."""

    reason: str


Later = Coroutine[Any, Any, tuple[int, bytes]]
"""An answer that has to wait for I/O: run it as a task (see :meth:`AdmissionHandler.answer`)."""

Known = NamespaceFacts | LookupFailed | None
"""What the caller already knows of the review's namespace (None: only what is in memory)."""


@dataclass(slots=True)  # not frozen: a frozen __init__ costs 3x, and one is made per review
class Answer:
    """What one review came to: plain data, because it may be computed in a forked child (see
    :class:`.limits.HeavyLane`) and the parent does the side effects (metrics, the log line).

    (Its ``__init__`` is the generated one, interpreted, unlike the other per-review dataclasses':
    it comes back from the child pickled, and unpickling a compiled class calls a written-out
    ``__init__`` without arguments.)"""

    status: int
    body: bytes
    fields: dict[str, Any] | None = None
    """The log line's fields of a review; None when the request never became one (a 400)."""
    metric_kind: str = UNKNOWN
    decision: str = "error"
    pod_security_unchecked: bool = False
    allowed_unknown: str = ""
    """What allow-unmodified let through uninjected (``namespace``, ``claim``), for its counter."""
    namespace_hit: bool = False
    """The namespace's facts came from memory (counted as a lookup hit)."""
    internal_error: str | None = None
    """A bug's traceback, for the parent to log."""
    lookup: str | None = None
    """Not answered yet: the namespace to fetch first, then answer again with its facts."""
    claims_missed: tuple[ClaimName, ...] = ()
    """Claims the pod names that the claim caches did not hold (answered per claimLookupFailure)."""


class AdmissionHandler:
    def __init__(
        self,
        config: LiveConfig,
        namespaces: NamespaceSource,
        metrics: ServiceMetrics,
        limits: Limits | None = None,
        claims: ClaimFacts = UNKNOWN_CLAIMS,
    ) -> None:
        self._config = config
        self._namespaces = namespaces
        self._claims = claims
        """DRA claims' device classes: read from memory like cached namespace facts (no lock, so
        a forked child may read them too)."""
        self._metrics = metrics
        self._limits = limits or Limits()
        self._heavy: HeavyLane | None = None  # made on first use: it needs the running loop

    def answer(self, body: bytes, started: float) -> tuple[int, bytes] | Later:
        """Answer one request body: (200, AdmissionReview), (400, one-line JSON error), or (503,
        one-line JSON error) for a large review that could not be served within its budget.

        Returned at once when nothing has to wait, which is the common case: a small review whose
        namespace facts and claims are in memory is parsed, mutated and answered in the caller's
        callback, with no task. Otherwise a coroutine the caller runs as a task: a namespace to
        fetch, a claim the watch has not delivered yet, or a review over ``offload_bytes``, whose
        work goes to the heavy lane (:class:`.limits.HeavyLane`)."""
        config = self._config.current
        if len(body) > self._limits.offload_bytes:
            return self._large_later(body, config, started)
        try:
            review = parse_review(body)
        except ReviewError as exc:
            return self._finish(Answer(400, error_body(str(exc)), fields={"error": str(exc)}), started)
        answer = self._answer_review(review, config, None)
        if answer.lookup is None and not (answer.claims_missed and isinstance(self._claims, ClaimCache)):
            return self._finish(answer, started)
        return self._small_later(review, config, answer, started)

    async def handle(self, body: bytes, started: float) -> tuple[int, bytes]:
        """:meth:`answer`, awaited, for a caller that is a coroutine anyway."""
        answer = self.answer(body, started)
        return answer if isinstance(answer, tuple) else await answer

    async def _small_later(
        self, review: ReviewRequest, config: CompiledConfig, answer: Answer, started: float
    ) -> tuple[int, bytes]:
        """A small review's answer once its namespace is fetched or its claims had their wait."""
        known: Known = None
        if answer.lookup is not None:
            known = await self._lookup(answer.lookup)
            answer = self._answer_review(review, config, known)
        if answer.claims_missed and await self._claims_arrived(answer.claims_missed):
            answer = self._answer_review(review, config, known)
        return self._finish(answer, started)

    async def _large_later(self, body: bytes, config: CompiledConfig, started: float) -> tuple[int, bytes]:
        try:
            answer = await self._answer_large(body, config)
        except OverBudget:
            self._metrics.over_budget.inc()
            return self.reject(
                503,
                f"a {len(body)}-byte review could not be served within its "
                f"{self._limits.request_budget:g} s budget; retry shortly",
                started,
            )
        return self._finish(answer, started)

    async def _claims_arrived(self, names: tuple[ClaimName, ...]) -> bool:
        """Wait (bounded) for claims a review named before the watch delivered them; see
        :mod:`.claim_cache`. Only a watching cache can see them arrive."""
        if not isinstance(self._claims, ClaimCache):
            return False
        arrived = await self._claims.arrival(names)
        self._metrics.claim_waits.labels(outcome="arrived" if arrived else "missing").inc()
        return arrived

    async def _answer_large(self, body: bytes, config: CompiledConfig) -> Answer:
        """Parse and mutate in the heavy lane, so the loop stays free (see .limits). The budget
        counts from the moment the body is complete: it bounds the wait for the lane and the work,
        while a slow upload is the request timeout's business (a flood of uploads would otherwise
        spend every admitted review's budget on arrival, and none would be served)."""
        if self._heavy is None:
            self._heavy = HeavyLane(self._limits.request_budget)
        deadline = time.monotonic() + self._limits.request_budget
        known: Known = None
        waited = False
        while True:
            try:
                encoded = await self._heavy.run(deadline, partial(self._answer_body, body, config, known))
            except WorkerDied as exc:
                return self._internal_error(str(exc))
            answer: Answer = pickle.loads(encoded)
            if answer.lookup is not None and known is None:
                known = await self._lookup(answer.lookup)
            elif answer.claims_missed and not waited:
                # Each run forks afresh, so the next one sees claims that arrived meanwhile.
                waited = True
                if not await self._claims_arrived(answer.claims_missed):
                    return answer
            else:
                return answer

    def _answer_body(self, body: bytes, config: CompiledConfig, known: Known) -> bytes:
        """:meth:`_answer_review` of a raw body, pickled: the heavy lane's work, in the child."""
        try:
            review = parse_review(body)
        except ReviewError as exc:
            answer = Answer(400, error_body(str(exc)), fields={"error": str(exc)})
        else:
            answer = self._answer_review(review, config, known)
        return pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)

    def _answer_review(self, review: ReviewRequest, config: CompiledConfig, known: Known) -> Answer:
        """The review's answer; no I/O and no side effects, so it can run in a forked child."""
        hit = False
        claims = MissRecorder(self._claims)
        obj = review.obj
        workload = obj is not None and self._is_workload(obj, config)
        try:
            decided = self._decide(review, config, known, claims, workload)
            if isinstance(decided, str):
                return Answer(0, b"", lookup=decided)
            result, hit = decided
        except Exception as exc:
            result = internal_error_result(one_line(exc, 200))
            internal_error: str | None = traceback.format_exc()
            status_code = 500
        else:
            internal_error = None
            status_code = 403
        # ``_value_``: the plain attribute behind ``.value``, which is a descriptor call on 3.11.
        decision: str = result.decision._value_
        return Answer(
            200,
            review_response(review.uid, result, status_code=status_code),
            fields={
                "uid": review.uid,
                "kind": review.kind,
                "namespace": review.namespace,
                "name": review.name,
                "operation": review.operation,
                "dryRun": review.dry_run,
                "result": decision,
                "ops": len(result.ops),
                "reason": result.reason,
            },
            metric_kind=review.kind if workload else OTHER,
            decision=decision,
            pod_security_unchecked=result.pod_security_unchecked,
            allowed_unknown=result.allowed_unknown,
            namespace_hit=hit,
            internal_error=internal_error,
            claims_missed=tuple(claims.missed) if claims.missed else (),
        )

    def _decide(
        self,
        review: ReviewRequest,
        config: CompiledConfig,
        known: Known,
        claims: ClaimFacts,
        workload: bool,
    ) -> tuple[MutationResult, bool] | str:
        """(result, whether the namespace's facts came from memory), or the namespace to fetch.
        ``workload``: the object is of a configured kind (:meth:`_is_workload`)."""
        obj, operation, namespace = review.obj, review.operation, review.namespace
        if operation != "CREATE" or obj is None or not workload:
            # Not ours to mutate: the core says why without needing the namespace.
            return mutate(obj, operation, NamespaceFacts.unknown(namespace), config, claims), False
        if not namespace or config.namespace_excluded(namespace):
            return mutate(obj, operation, NamespaceFacts(namespace), config, claims), False
        if isinstance(known, LookupFailed):
            return self._lookup_failed(config, known.reason), False
        if known is not None:
            return mutate(obj, operation, known, config, claims), False
        facts = self._namespaces.cached_facts(namespace)
        if facts is not None:
            return mutate(obj, operation, facts, config, claims), True
        # Not in memory. Known facts can only add reasons to skip or to hold back host access, so
        # a skip computed without them stands, and most objects (no GPU) never cost a lookup.
        provisional = mutate(obj, operation, NamespaceFacts.unknown(namespace), config, claims)
        if provisional.decision is Decision.SKIPPED:
            return provisional, False
        return namespace

    async def _lookup(self, namespace: str) -> NamespaceFacts | LookupFailed:
        try:
            return await self._namespaces.facts(namespace)
        except NamespaceLookupFailed as exc:
            return LookupFailed(str(exc))

    def _internal_error(self, message: str) -> Answer:
        """A review whose worker died: denied as an internal error, as a bug would be."""
        result = internal_error_result(one_line(message, 200))
        return Answer(
            200,
            review_response("", result, status_code=500),
            fields={"result": result.decision.value, "reason": result.reason},
            decision=result.decision.value,
            internal_error=message,
        )

    def _finish(self, answer: Answer, started: float) -> tuple[int, bytes]:
        """The side effects of an answer, in this process: metrics and one log line."""
        if answer.fields is None or answer.status != 200:
            return self.reject(answer.status, (answer.fields or {}).get("error", ""), started)
        if answer.internal_error is not None:
            log.error(
                "admission failed",
                extra={"fields": {"uid": answer.fields.get("uid"), "traceback": answer.internal_error}},
            )
            self._metrics.internal_errors.inc()
        if answer.namespace_hit:
            self._namespaces.count_hit()
        operation = answer.fields.get("operation", UNKNOWN)
        self._metrics.count_request(answer.metric_kind, operation, answer.decision)
        if answer.pod_security_unchecked:
            self._metrics.unchecked_pod_security.inc()
        if answer.allowed_unknown:
            self._metrics.allowed_unmodified.labels(answer.allowed_unknown).inc()
        elapsed = time.perf_counter() - started
        self._metrics.observe_duration(elapsed)
        fields = answer.fields  # this answer's own, and this is its last use
        fields["durationMs"] = round(elapsed * 1000, 3)
        info_line(log, "admission", fields)
        return answer.status, answer.body

    def reject(self, status: int, message: str, started: float) -> tuple[int, bytes]:
        """Count and log a request that never became a review (bad envelope, size, type, timeout)."""
        self._metrics.count_request(UNKNOWN, UNKNOWN, "error")
        self._metrics.observe_duration(time.perf_counter() - started)
        info_line(log, "admission rejected", {"status": status, "error": message})
        return status, error_body(message)

    @staticmethod
    def _is_workload(obj: dict[str, Any], config: CompiledConfig) -> bool:
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if not isinstance(api_version, str) or not isinstance(kind, str):
            return False
        return config.workload(api_version, kind) is not None

    @staticmethod
    def _lookup_failed(config: CompiledConfig, reason: str) -> MutationResult:
        # Whatever the core said without namespace facts — a denial too, since an opted-out
        # namespace would have skipped before quantities were checked — policy decides.
        if config.policy.namespace_lookup_failure is NamespaceLookupFailure.DENY:
            return denied(
                f"{reason}; refused rather than created without its GPU settings "
                "(policy.namespaceLookupFailure: deny): create it again in a moment"
            )
        return MutationResult(
            Decision.SKIPPED,
            warnings=[f"ix-gpu did not inject GPU settings: {reason} (policy.namespaceLookupFailure)"],
            reason=f"{reason}; allowed unmodified by policy.namespaceLookupFailure",
            allowed_unknown="namespace",
        )
