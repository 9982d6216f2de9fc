"""Volcano's choice in Allocate (``flags.usevolcano``): the watch of this node's pods, the kubelet's
PodResources, and the write-back of what was bound. The rules are :mod:`ix_gpu.plugin.offer.volcano`;
the servicer calls :meth:`VolcanoChoice.choose` (its ``choose_devices``) and knows nothing of this.

The pods come from one list + watch (``fieldSelector=spec.nodeName=<node>``, the
:class:`~ix_gpu.kube.watched_cache.WatchedCache` every watch of ours uses), started when
usevolcano is first on (at start or by a reload). The kubelet calls Allocate as soon as it admits
a pod, and the watch may not have shown the pod yet: a request that matches nobody waits for the
pod up to :data:`MATCH_WAIT` seconds (awaiting, so ListAndWatch and the other calls go on) before
binding the kubelet's choice.

After a binding, the pod gets the annotations 4.4 writes (a JSON merge patch of three annotations,
with the pod's uid as precondition: a pod recreated under the name is not written): predicate-time
consumed, ``iluvatar.com/DevKubelet`` (the kubelet's IDs) and ``iluvatar.com/DevRealAlloc`` (the
bound ones), before the kubelet gets the answer, so a plugin restarted later (an upgrade) still
knows what each pod holds. A write that fails is logged and counted; the binding stands and is
remembered here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ix_gpu.config.text import one_line
from ix_gpu.kube.apiserver import ApiServer
from ix_gpu.kube.list_watch import ApiListWatch
from ix_gpu.kube.watched_cache import WatchedCache
from ix_gpu.plugin.offer.allocation import AllocationError
from ix_gpu.plugin.offer.device_state import HEALTHY, Snapshot
from ix_gpu.plugin.offer.volcano import (
    CONSUMED,
    DEV_KUBELET,
    DEV_REAL_ALLOC,
    PREDICATE_TIME,
    REFUSED,
    UNAVAILABLE,
    VOLCANO,
    Decision,
    PodFacts,
    decide,
    holdings,
    match,
    pod_facts,
    resolver,
)
from ix_gpu.plugin.server.pod_resources import PodResourcesReader
from ix_gpu.plugin.server.servicer import Choice

if TYPE_CHECKING:
    from ix_gpu.config.plugin_runtime import RuntimeConfig
    from ix_gpu.plugin.server.metrics import PluginMetrics
    from ix_gpu.plugin.server.settings import PluginSettings

log = logging.getLogger(__name__)

MATCH_WAIT = 2.0
"""Seconds an Allocate waits for its pod to appear in the watch, and for the first list."""
POLL = 0.05
PATCH_TIMEOUT = 3.0
PATCH_TRIES = 2
NEEDS = "NODE_NAME and cluster access (in a Pod, or --kubeconfig)"


class NodePods(WatchedCache):
    """This node's pods, as :class:`PodFacts` by uid."""

    what = "this node's pods"
    log = log

    def __init__(self, api: ApiServer, node: str, on_error: Callable[[str], None] | None = None) -> None:
        watch = ApiListWatch(api, "/api/v1/pods", self.what, field_selector=f"spec.nodeName={node}")
        super().__init__(watch, backoff=(1.0, 30.0))
        self.on_error = on_error

    def _entry(self, obj: Any) -> tuple[str, PodFacts] | None:
        facts = pod_facts(obj)
        return None if facts is None else (facts.uid, facts)

    def _watch_failed(self) -> None:
        if self.on_error is not None and self._last_error is not None:
            self.on_error(self._last_error)

    def pods(self) -> list[PodFacts]:
        return list(self._items.values())


@dataclass(frozen=True)
class Binding:
    """One container request bound for a matched pod, until it is written back."""

    pod: PodFacts
    requested: tuple[str, ...]
    bound: tuple[str, ...]


def write_back(api: ApiServer, binding: Binding) -> None:
    """The pod's annotations after ``binding``, as 4.4 writes them (raises ``OSError``)."""
    pod = binding.pod
    body = {
        "metadata": {
            "uid": pod.uid,  # a precondition: another pod of the same name is refused, not written
            "annotations": {
                PREDICATE_TIME: CONSUMED,
                DEV_KUBELET: ",".join(binding.requested),
                DEV_REAL_ALLOC: ",".join(binding.bound),
            },
        }
    }
    path = f"/api/v1/namespaces/{quote(pod.namespace, safe='')}/pods/{quote(pod.name, safe='')}"
    api.request("PATCH", path, body, content_type="application/merge-patch+json", timeout=PATCH_TIMEOUT)


class VolcanoChoice:
    """The servicer's ``choose_devices``: Volcano's devices when they may be bound."""

    def __init__(
        self,
        settings: PluginSettings,
        metrics: PluginMetrics,
        resource: Callable[[], str],
        *,
        wait: float = MATCH_WAIT,
    ) -> None:
        """``resource``: the resource name the plugin advertises now (its PodResources entries)."""
        self.settings, self.metrics, self.resource, self.wait = settings, metrics, resource, wait
        socket = settings.pod_resources_socket
        self.kubelet = PodResourcesReader(socket) if socket is not None else None
        self.api: ApiServer | None = None
        self.pods: NodePods | None = None
        self.bound: dict[str, tuple[str, tuple[str, ...]]] = {}
        """Pod uid → (its key, the IDs this process bound for it), until the pod is over."""
        self.problem: str | None = None
        self._lock = asyncio.Lock()

    # -- lifecycle -----------------------------------------------------------------------------

    def follow(self, config: RuntimeConfig) -> None:
        """Start the watch when ``config`` turns usevolcano on. It then runs until the plugin
        stops: a config that turns it off and on again finds it synced."""
        if not config.usevolcano or self.pods is not None:
            return
        api = self.settings.api_server or ApiServer.in_cluster()
        node = self.settings.node_name
        if api is None or not node:
            if self.problem is None:
                log.warning(
                    "flags.usevolcano is on, but without %s this node's pods cannot be read: Allocate "
                    "binds the kubelet's choice, as without it",
                    NEEDS,
                )
            self.problem = f"flags.usevolcano needs {NEEDS}; Volcano's choice is not honoured"
            return
        if self.kubelet is None:
            log.warning(
                "flags.usevolcano without --pod-resources-socket: what pods outside Volcano hold is "
                "unknown, so every allocation binds the kubelet's choice"
            )
        errors = self.metrics.api_errors.labels(call="pod_watch")
        self.api, self.problem = api, None
        self.pods = NodePods(api, node, on_error=lambda _message: errors.inc())
        self.pods.start()

    def stop(self) -> None:
        if self.pods is not None:
            self.pods.stop()

    def problems(self) -> list[str]:
        """For ``/healthz``'s notes."""
        watch = None if self.pods is None else self.pods.problem()
        return [p for p in (self.problem, watch) if p is not None]

    # -- Allocate ------------------------------------------------------------------------------

    async def choose(self, containers: list[list[str]], snapshot: Snapshot) -> Choice:
        pods = self.pods
        if pods is None:
            self.metrics.volcano_allocations.labels(result=UNAVAILABLE).inc(len(containers))
            return Choice(containers)
        async with self._lock:  # one choice at a time: two must never take one pod or one chip
            if not pods.ready() and not await asyncio.to_thread(pods.wait_synced, self.wait):
                self.metrics.volcano_allocations.labels(result=REFUSED).inc(len(containers))
                raise AllocationError(
                    f"flags.usevolcano: {pods.what} have not been read from the API server "
                    f"({pods.last_error() or 'no answer yet'}); refused rather than risk binding a "
                    "chip another pod holds"
                )
            bindings: list[Binding] = []
            try:
                chosen = [await self._one(pods, ids, snapshot, bindings) for ids in containers]
            except BaseException:
                self._forget(bindings)
                raise
            return Choice(chosen, partial(self._settle, bindings))

    async def _one(
        self, pods: NodePods, requested: list[str], snapshot: Snapshot, bindings: list[Binding]
    ) -> list[str]:
        """One container request: the decision, logged and counted; a binding for a matched pod."""
        kubelet_held, verified = await self._kubelet_held()
        self._prune(pods.pods(), kubelet_held)
        pod = await self._wait_for_pod(pods, len(requested), kubelet_held)
        resolve = resolver(snapshot.devices)
        health = {d.id: snapshot.health(d) == HEALTHY for d in snapshot.devices.devices}
        bound = {uid: ids for uid, (_, ids) in self.bound.items()}
        held = holdings(pods.pods(), kubelet_held, bound, resolve, verified=verified)
        decision = decide(requested, pod, health, held, resolve, verified)
        self._record(decision, requested)
        if decision.outcome == REFUSED:
            raise AllocationError(decision.reason)
        if decision.pod is not None:
            uid = decision.pod.uid
            self.bound[uid] = (decision.pod.key, self.bound.get(uid, ("", ()))[1] + decision.ids)
            bindings.append(Binding(decision.pod, tuple(requested), decision.ids))
        return list(decision.ids)

    async def _kubelet_held(self) -> tuple[dict[str, tuple[str, ...]], bool]:
        """Pod key → the device IDs of our resource the kubelet lists for it, and whether it
        answered."""
        if self.kubelet is None:
            return {}, False
        await self.kubelet.read()
        resource = self.resource()
        held: dict[str, tuple[str, ...]] = {}
        for container in self.kubelet.containers:
            ids = container.devices.get(resource)
            if ids:
                key = f"{container.namespace}/{container.pod}"
                held[key] = held.get(key, ()) + tuple(ids)
        return held, self.kubelet.up

    async def _wait_for_pod(
        self, pods: NodePods, count: int, kubelet_held: dict[str, tuple[str, ...]]
    ) -> PodFacts | None:
        deadline = time.monotonic() + self.wait
        while True:
            pod = match(pods.pods(), count, taken=self.bound.keys(), busy=kubelet_held.keys())
            if pod is not None or time.monotonic() >= deadline:
                return pod
            await asyncio.sleep(POLL)

    def _prune(self, pods: list[PodFacts], kubelet_held: dict[str, tuple[str, ...]]) -> None:
        """Forget the bindings of pods that are over: terminal, or gone from the watch and from
        the kubelet's list."""
        by_uid = {pod.uid: pod for pod in pods}
        for uid, (key, _) in list(self.bound.items()):
            pod = by_uid.get(uid)
            if (pod is not None and pod.terminal) or (pod is None and key not in kubelet_held):
                del self.bound[uid]

    def _record(self, decision: Decision, requested: list[str]) -> None:
        self.metrics.volcano_allocations.labels(result=decision.outcome).inc()
        pod = decision.pod
        if decision.outcome == VOLCANO and pod is not None:
            log.info(
                "Allocate for pod %s: Volcano's devices %s (the kubelet chose %s)",
                pod.key,
                ",".join(decision.ids),
                ",".join(requested),
            )
        elif decision.outcome == REFUSED:
            log.warning("Allocate refused: %s", decision.reason)
        else:
            who = f"for pod {pod.key}" if pod is not None else f"of {len(requested)} devices"
            log.warning(
                "Allocate %s: binding the kubelet's choice %s: %s", who, ",".join(requested), decision.reason
            )

    def _forget(self, bindings: list[Binding]) -> None:
        for binding in bindings:
            self.bound.pop(binding.pod.uid, None)

    async def _settle(self, bindings: list[Binding], answered: bool) -> None:
        if not answered:
            self._forget(bindings)
            return
        api = self.api
        for binding in bindings:
            if api is not None:
                await asyncio.to_thread(self._write_back, api, binding)

    def _write_back(self, api: ApiServer, binding: Binding) -> None:
        error = ""
        for attempt in range(PATCH_TRIES):
            try:
                write_back(api, binding)
                return
            except OSError as exc:
                error = one_line(exc)
                code = getattr(exc, "code", None)
                if code in (404, 409, 422) or attempt + 1 == PATCH_TRIES:
                    break
                time.sleep(0.2)
        self.metrics.api_errors.labels(call="pod_patch").inc()
        log.warning(
            "cannot write %s=%s to pod %s (%s); the binding stands, remembered by this process only",
            DEV_REAL_ALLOC,
            ",".join(binding.bound),
            binding.pod.key,
            error,
        )
