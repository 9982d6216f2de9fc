"""The kubelet's DRA node service (``v1.DRAPlugin``) and plugin registration, as grpclib handlers.

Thin on purpose: protobuf in, :class:`ix_gpu.dra.prepare.Preparer` calls, protobuf out. Each claim
runs in a worker thread, since reading it from the API server blocks, and the claims of one call
run side by side. A failing claim gets its error in its own entry of the answer, whatever failed
(an exception nobody foresaw included), and is counted by reason (:data:`ix_gpu.dra.claims.
FAILURE_REASONS`); the other claims of the call are prepared all the same. The kubelet retries
only the claims whose entry has an error. The call itself fails only for a request that is not one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import TypeVar

from google.protobuf.message import Message
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from ix_gpu.dra.api import dra_v1_pb2 as dra
from ix_gpu.dra.api import pluginregistration_v1_pb2 as reg
from ix_gpu.dra.api.dra_v1_grpc import DRAPluginBase
from ix_gpu.dra.api.pluginregistration_v1_grpc import RegistrationBase
from ix_gpu.dra.checkpoint import PreparedDevice
from ix_gpu.dra.claims import ClaimError, ClaimRef
from ix_gpu.dra.health_stream import HEALTH_SERVICES
from ix_gpu.dra.metrics import DraMetrics
from ix_gpu.dra.prepare import Preparer

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SERVICES = ("v1.DRAPlugin", *HEALTH_SERVICES)
"""What GetInfo lists in ``supported_versions``: for DRA these are gRPC service names. The
kubelet (1.34 to 1.37) takes the first node service it also knows (v1 and v1beta1 exist; v1 is
served here) and, with ResourceHealthStatus, the newest health service it knows; it ignores the
names it does not know."""

Request = TypeVar("Request")
Response = TypeVar("Response")
Answer = TypeVar("Answer", bound=Message)
"""One claim's answer in a call's response (prepare or unprepare)."""


async def _request(stream: Stream[Request, Response]) -> Request:
    request = await stream.recv_message()
    if request is None:
        raise GRPCError(Status.INVALID_ARGUMENT, "no request message")
    return request


async def _each_claim(
    claims: Sequence[dra.Claim],
    answer: Callable[[dra.Claim], Awaitable[Answer]],
    answers: MutableMapping[str, Answer],
) -> None:
    """Each claim of one call answered on its own and at the same time (one claim's slow API read
    or failure is not another's), into ``answers`` by claim uid."""
    results = await asyncio.gather(*(answer(claim) for claim in claims))
    for claim, result in zip(claims, results, strict=True):
        answers[claim.uid].CopyFrom(result)


def _device(prepared: PreparedDevice) -> dra.Device:
    device = dra.Device(
        request_names=list(prepared.request_names),
        pool_name=prepared.pool,
        device_name=prepared.device,
        cdi_device_ids=list(prepared.cdi_device_ids),
    )
    if prepared.share_id is not None:
        device.share_id = prepared.share_id
    return device


def _failure(exc: Exception, what: str) -> ClaimError:
    """``exc`` as a :class:`ClaimError`: itself, or for anything unforeseen an ``internal`` one,
    logged with its traceback (a bug to find, which the kubelet's event alone would not show)."""
    if isinstance(exc, ClaimError):
        return exc
    log.error("%s failed unexpectedly", what, exc_info=exc)
    return ClaimError(f"{what}: internal error: {type(exc).__name__}: {exc}"[:1000], "internal")


def _error_text(failure: ClaimError) -> str:
    """What the kubelet puts in the pod's events: the message and the reason it is counted under,
    so that an event and a rise of ``ix_gpu_dra_prepare_failures_total`` can be matched."""
    return f"{failure} (reason: {failure.reason})"


class DraServicer(DRAPluginBase):
    def __init__(self, preparer: Preparer, metrics: DraMetrics | None = None) -> None:
        self.preparer = preparer
        self.metrics = metrics or DraMetrics()

    async def _prepare_one(self, claim: dra.Claim) -> dra.NodePrepareResourceResponse:
        ref = ClaimRef(claim.namespace, claim.name, claim.uid)
        started = time.monotonic()
        try:
            devices = await asyncio.to_thread(self.preparer.prepare, ref)
        except Exception as exc:  # one claim's failure, whatever it is, is not its neighbours'
            failure = _failure(exc, f"prepare of claim {ref}")
            log.warning("prepare failed: %s", failure)
            self.metrics.prepares.labels(result="error").inc()
            self.metrics.prepare_failures.labels(reason=failure.reason).inc()
            return dra.NodePrepareResourceResponse(error=_error_text(failure))
        self.metrics.prepare_seconds.observe(time.monotonic() - started)
        self.metrics.prepares.labels(result="success").inc()
        return dra.NodePrepareResourceResponse(devices=[_device(d) for d in devices])

    async def _unprepare_one(self, claim: dra.Claim) -> dra.NodeUnprepareResourceResponse:
        try:
            await asyncio.to_thread(self.preparer.unprepare, claim.uid)
        except Exception as exc:  # as in prepare: this claim's answer, not the call's
            failure = _failure(exc, f"unprepare of claim {claim.namespace}/{claim.name} ({claim.uid})")
            log.warning("unprepare of claim %s/%s failed: %s", claim.namespace, claim.name, failure)
            self.metrics.unprepares.labels(result="error").inc()
            self.metrics.unprepare_failures.labels(reason=failure.reason).inc()
            return dra.NodeUnprepareResourceResponse(error=_error_text(failure))
        self.metrics.unprepares.labels(result="success").inc()
        return dra.NodeUnprepareResourceResponse()

    async def NodePrepareResources(
        self, stream: Stream[dra.NodePrepareResourcesRequest, dra.NodePrepareResourcesResponse]
    ) -> None:
        request = await _request(stream)
        response = dra.NodePrepareResourcesResponse()
        await _each_claim(request.claims, self._prepare_one, response.claims)
        await stream.send_message(response)

    async def NodeUnprepareResources(
        self, stream: Stream[dra.NodeUnprepareResourcesRequest, dra.NodeUnprepareResourcesResponse]
    ) -> None:
        request = await _request(stream)
        response = dra.NodeUnprepareResourcesResponse()
        await _each_claim(request.claims, self._unprepare_one, response.claims)
        await stream.send_message(response)


class RegistrationServicer(RegistrationBase):
    """What the kubelet's plugin watcher asks on the registration socket."""

    def __init__(self, driver: str, endpoint: str) -> None:
        self.info = reg.PluginInfo(
            type=PLUGIN_TYPE, name=driver, endpoint=endpoint, supported_versions=list(SERVICES)
        )
        self.registered = False
        self.last_error = ""

    async def GetInfo(self, stream: Stream[reg.InfoRequest, reg.PluginInfo]) -> None:
        await _request(stream)
        await stream.send_message(self.info)

    async def NotifyRegistrationStatus(
        self, stream: Stream[reg.RegistrationStatus, reg.RegistrationStatusResponse]
    ) -> None:
        status = await _request(stream)
        self.registered, self.last_error = status.plugin_registered, status.error
        if status.plugin_registered:
            log.info("registered with the kubelet as %s (endpoint %s)", self.info.name, self.info.endpoint)
        else:
            log.error("the kubelet refused the registration: %s", status.error)
        await stream.send_message(reg.RegistrationStatusResponse())
