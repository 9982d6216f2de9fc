"""One admission, start to finish: envelope → namespace facts → mutation core → response.

This is the only place that combines the pure pieces with the service's live state (current
config, namespace source) and its side channels (metrics, one structured log line). It knows
nothing about HTTP beyond "a status code and bytes", so the FastAPI layer stays a thin adapter.

Nothing here writes anywhere except metrics and logs, so ``request.dryRun`` needs no special
path: a dry run is answered exactly like the real request would be.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from ix_gpu.devicemodel.text import one_line
from ix_gpu.devicemodel.webhook_config import NamespaceLookupFailure
from ix_gpu.runtime.json_logging import info_line
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
from ix_gpu.webhook.service.hot_reload import LiveConfig
from ix_gpu.webhook.service.limits import HeavyLane, Limits, OverBudget
from ix_gpu.webhook.service.metrics import OTHER, UNKNOWN, ServiceMetrics
from ix_gpu.webhook.service.namespace_cache import NamespaceLookupFailed, NamespaceSource

log = logging.getLogger("ix_gpu.admission")


Core = Callable[[Any, str, NamespaceFacts, CompiledConfig], Awaitable[MutationResult]]


Parse = Callable[[bytes], Awaitable[ReviewRequest]]


async def _parse_on_loop(body: bytes) -> ReviewRequest:
    return parse_review(body)


async def _mutate_on_loop(
    obj: Any, operation: str, namespace: NamespaceFacts, config: CompiledConfig
) -> MutationResult:
    return mutate(obj, operation, namespace, config)


class AdmissionHandler:
    def __init__(
        self,
        config: LiveConfig,
        namespaces: NamespaceSource,
        metrics: ServiceMetrics,
        limits: Limits | None = None,
    ) -> None:
        self._config = config
        self._namespaces = namespaces
        self._metrics = metrics
        self._limits = limits or Limits()
        self._heavy: HeavyLane | None = None  # made on first use: it needs the running loop

    async def handle(self, body: bytes, started: float) -> tuple[int, bytes]:
        """Answer one request body: (200, AdmissionReview), (400, one-line JSON error), or (503,
        one-line JSON error) for a large review that could not be served within its budget."""
        if len(body) <= self._limits.offload_bytes:
            return await self._handle(body, started, _parse_on_loop, _mutate_on_loop)
        # Large: parse and mutate in the heavy lane, so the loop stays free (see .limits). The
        # budget counts from the request's start (the body's arrival included).
        if self._heavy is None:
            self._heavy = HeavyLane(self._limits.request_budget)
        elapsed = time.perf_counter() - started
        deadline = time.monotonic() + self._limits.request_budget - elapsed
        try:
            async with self._heavy.hold(deadline) as lane:

                async def parse(raw: bytes) -> ReviewRequest:
                    return await lane.run(deadline, partial(parse_review, raw))

                async def core(
                    obj: Any, operation: str, namespace: NamespaceFacts, config: CompiledConfig
                ) -> MutationResult:
                    return await lane.run(deadline, partial(mutate, obj, operation, namespace, config))

                return await self._handle(body, started, parse, core)
        except OverBudget:
            self._metrics.over_budget.inc()
            return self.reject(
                503,
                f"a {len(body)}-byte review could not be served within its "
                f"{self._limits.request_budget:g} s budget; retry shortly",
                started,
            )

    async def _handle(self, body: bytes, started: float, parse: Parse, core: Core) -> tuple[int, bytes]:
        try:
            review = await parse(body)
        except ReviewError as exc:
            return self.reject(400, str(exc), started)
        config = self._config.current
        try:
            result = await self._decide(review, config, core)
        except OverBudget:
            raise
        except Exception as exc:
            log.exception("admission failed", extra={"fields": {"uid": review.uid}})
            self._metrics.internal_errors.inc()
            result = internal_error_result(one_line(exc, 200))
            status_code = 500
        else:
            status_code = 403
        answer = review_response(review.uid, result, status_code=status_code)
        self._record(review, config, result, started)
        return 200, answer

    def reject(self, status: int, message: str, started: float) -> tuple[int, bytes]:
        """Count and log a request that never became a review (bad envelope, size, type, timeout)."""
        self._metrics.count_request(UNKNOWN, UNKNOWN, "error")
        self._metrics.duration.observe(time.perf_counter() - started)
        info_line(log, "admission rejected", {"status": status, "error": message})
        return status, error_body(message)

    async def _decide(self, review: ReviewRequest, config: CompiledConfig, core: Core) -> MutationResult:
        obj = review.obj
        if review.operation != "CREATE" or obj is None or not self._is_workload(obj, config):
            # Not ours to mutate: the core says why without needing the namespace.
            return await core(obj, review.operation, NamespaceFacts.unknown(review.namespace), config)
        if not review.namespace or config.namespace_excluded(review.namespace):
            return await core(obj, review.operation, NamespaceFacts(review.namespace), config)
        facts = self._namespaces.cached_facts(review.namespace)
        if facts is not None:
            return await core(obj, review.operation, facts, config)
        # Not in memory. Known facts can only add reasons to skip or to hold back host access, so
        # a skip computed without them stands, and most objects (no GPU) never cost a lookup.
        provisional = await core(obj, review.operation, NamespaceFacts.unknown(review.namespace), config)
        if provisional.decision is Decision.SKIPPED:
            return provisional
        try:
            facts = await self._namespaces.facts(review.namespace)
        except NamespaceLookupFailed as exc:
            return self._lookup_failed(config, str(exc))
        return await core(obj, review.operation, facts, config)

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
            return denied(f"{reason}; policy.namespaceLookupFailure is deny")
        return MutationResult(
            Decision.SKIPPED,
            warnings=[f"ix-gpu did not inject GPU settings: {reason} (policy.namespaceLookupFailure)"],
            reason=f"{reason}; allowed unmodified by policy.namespaceLookupFailure",
        )

    def _record(
        self, review: ReviewRequest, config: CompiledConfig, result: MutationResult, started: float
    ) -> None:
        obj = review.obj
        kind = review.kind if obj is not None and self._is_workload(obj, config) else OTHER
        self._metrics.count_request(kind, review.operation, result.decision.value)
        if result.pod_security_unchecked:
            self._metrics.unchecked_pod_security.inc()
        elapsed = time.perf_counter() - started
        self._metrics.duration.observe(elapsed)
        info_line(
            log,
            "admission",
            {
                "uid": review.uid,
                "kind": review.kind,
                "namespace": review.namespace,
                "name": review.name,
                "operation": review.operation,
                "dryRun": review.dry_run,
                "result": result.decision.value,
                "ops": len(result.ops),
                "reason": result.reason,
                "durationMs": round(elapsed * 1000, 3),
            },
        )
