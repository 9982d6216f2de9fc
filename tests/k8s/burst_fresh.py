"""The burst's ``new-namespaces`` fault: namespaces created while the burst runs, each followed at
once by its GPU pod, as a CI pipeline or a notebook platform does all day.

The webhook has not cached such a namespace yet, so it must read it from the apiserver while it
reviews the pod; across an apiserver restart that read fails, and the pod must then be refused
(and the client's retry injected), never stored without its injection. Every ``CLAIM_EVERY``-th
one is a DRA pod instead: its ResourceClaim (DeviceClass ``gpu.iluvatar.com``) is created in the
fresh namespace, then at once a pod that uses it, so the webhook has cached neither the namespace
nor the claim. Every ``OPT_OUT_EVERY``-th fresh namespace opts out, as the others do.

The namespaces (``fresh-NNNNN``) are spread evenly over the burst's offered duration, each in a
client thread of its own so that one stuck across a restart does not hold back the next.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

from ix_gpu.devicemodel import labels
from tests.k8s import kwok
from tests.k8s.dra_pools import RESOURCE_API
from tests.k8s.k8s_tier import KubeAPI

PREFIX = "fresh"
CLAIM_EVERY = 4
CLAIM_DEVICE_CLASS = "gpu.iluvatar.com"
RETRY_FOR_S = 180.0
"""How long a client retries a create that failed (backoff 0.2 s doubling to 2 s). A controller
retries for ever; the bench's client gives up after this, longer than an apiserver takes to come
back here: about 20 s at 100 nodes, up to 95 s at 1,000 nodes and 10,000 namespaces on two
shared cores, where the apiserver reloads every object into its caches before it is ready."""


def claim_body(name: str) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": CLAIM_DEVICE_CLASS}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}},
    }


def claim_pod(name: str, claim: str) -> dict[str, Any]:
    """A pod that asks for a GPU only through the ResourceClaim ``claim``."""
    container = {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
    spec = {
        "containers": [container],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        "tolerations": [kwok.TOLERATION],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def namespace_body(name: str, opted_out: bool) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if opted_out:
        metadata["annotations"] = {labels.INJECT: labels.INJECT_DISABLED}
    return {"metadata": metadata}


def post_until_stored(api: KubeAPI, path: str, body: dict[str, Any]) -> str | None:
    """POST ``body`` until it is stored (201, or 409: a retry whose first try was stored after
    all), for up to ``RETRY_FOR_S``; None, or the last error."""
    deadline, attempt, error = time.monotonic() + RETRY_FOR_S, 0, ""
    while attempt == 0 or time.monotonic() < deadline:
        try:
            status, reply = api.request("POST", path, body, timeout=30)
        except OSError as exc:
            status, reply = 0, str(exc)
        if status in (201, 409):
            return None
        error = f"{status} {str(reply)[:160]}"
        time.sleep(min(0.2 * 2**attempt, 2.0))
        attempt += 1
    return error


class FreshNamespaces:
    """Creates ``count`` namespaces over ``duration`` seconds, each followed at once by its pod
    (created through ``create_pod``, the burst's own client with its retries and records; a body
    of None is the burst's own GPU pod)."""

    def __init__(
        self,
        api: KubeAPI,
        count: int,
        create_pod: Callable[[str, str, dict[str, Any] | None], None],
        opt_out_every: int,
    ) -> None:
        self.api = api
        self.count = count
        self.create_pod = create_pod
        self.opt_out_every = opt_out_every
        self.claim_pods: set[str] = set()
        """namespace/name of the pods that ask through a claim."""
        self.failed: list[str] = []
        """Namespaces or claims not stored after the retries, with the last error."""
        self.created_at: dict[str, float] = {}
        """namespace → when it was stored (monotonic)."""
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self, duration: float) -> FreshNamespaces:
        self._thread = threading.Thread(target=self._run, args=(duration,), daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, duration: float) -> None:
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futures = []
            for i in range(self.count):
                delay = start + i * duration / max(self.count, 1) - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                futures.append(pool.submit(self._one, i))
            for future in futures:
                future.result()

    def _one(self, i: int) -> None:
        namespace = f"{PREFIX}-{i:05d}"
        body = namespace_body(namespace, i % self.opt_out_every == 0)
        error = post_until_stored(self.api, "/api/v1/namespaces", body)
        if error is not None:
            with self._lock:
                self.failed.append(f"namespace {namespace}: {error}")
            return
        with self._lock:
            self.created_at[namespace] = time.monotonic()
        name = f"{PREFIX}-pod-{i:05d}"
        if i % CLAIM_EVERY == CLAIM_EVERY - 1:
            claims = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims"
            error = post_until_stored(self.api, claims, claim_body(name))
            if error is not None:
                with self._lock:
                    self.failed.append(f"claim {namespace}/{name}: {error}")
                return
            with self._lock:
                self.claim_pods.add(f"{namespace}/{name}")
            self.create_pod(namespace, name, claim_pod(name, name))
        else:
            self.create_pod(namespace, name, None)
