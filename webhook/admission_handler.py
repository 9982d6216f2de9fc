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
from typing import Any

from devicemodel.webhook_config import NamespaceLookupFailure
from webhook.admission_review import (
    ReviewError,
    ReviewRequest,
    error_body,
    internal_error_result,
    parse_review,
    review_response,
)
from webhook.compiled_config import CompiledConfig
from webhook.decision import Decision, MutationResult, NamespaceFacts, denied
from webhook.hot_reload import LiveConfig
from webhook.json_logging import info_line
from webhook.metrics import OTHER, UNKNOWN, ServiceMetrics
from webhook.mutation import mutate
from webhook.namespace_cache import NamespaceLookupFailed, NamespaceSource

log = logging.getLogger("ix_gpu.admission")


class AdmissionHandler:
    def __init__(self, config: LiveConfig, namespaces: NamespaceSource, metrics: ServiceMetrics) -> None:
        self._config = config
        self._namespaces = namespaces
        self._metrics = metrics

    async def handle(self, body: bytes, started: float) -> tuple[int, bytes]:
        """Answer one request body: (200, AdmissionReview) or (400, one-line JSON error)."""
        try:
            review = parse_review(body)
        except ReviewError as exc:
            return self.reject(400, str(exc), started)
        config = self._config.current
        try:
            result = await self._decide(review, config)
        except Exception as exc:
            log.exception("admission failed", extra={"fields": {"uid": review.uid}})
            self._metrics.internal_errors.inc()
            result = internal_error_result(" ".join(str(exc).split())[:200] or type(exc).__name__)
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

    async def _decide(self, review: ReviewRequest, config: CompiledConfig) -> MutationResult:
        obj = review.obj
        if review.operation != "CREATE" or obj is None or not self._is_workload(obj, config):
            # Not ours to mutate: the core says why without needing the namespace.
            return mutate(obj, review.operation, NamespaceFacts.unknown(review.namespace), config)
        if not review.namespace or config.namespace_excluded(review.namespace):
            return mutate(obj, review.operation, NamespaceFacts(review.namespace), config)
        facts = self._namespaces.cached_facts(review.namespace)
        if facts is not None:
            return mutate(obj, review.operation, facts, config)
        # Not in memory. Known facts can only add reasons to skip or to hold back host access, so
        # a skip computed without them stands, and most objects (no GPU) never cost a lookup.
        provisional = mutate(obj, review.operation, NamespaceFacts.unknown(review.namespace), config)
        if provisional.decision is Decision.SKIPPED:
            return provisional
        try:
            facts = await self._namespaces.facts(review.namespace)
        except NamespaceLookupFailed as exc:
            return self._lookup_failed(config, str(exc))
        return mutate(obj, review.operation, facts, config)

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
