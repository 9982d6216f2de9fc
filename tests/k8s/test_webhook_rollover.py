"""A webhook replica stopped while GPU pods are being created, as ``helm upgrade``, a node drain or a
scale-down stop one: through a real kube-apiserver that dials the webhook's Service endpoints
(``--enable-aggregator-routing``, as in the mini cluster), every create must still be admitted and
injected.

When the kubelet stops a pod, it sends SIGTERM while the pod's endpoint is being removed, and the
apiserver learns of the removal a moment later; here the endpoint goes 1.5 s after the SIGTERM.
Each replica is behind its own EndpointSlice, as pods are behind the controller's.

- The control: ``a0``, the only endpoint, with ``--shutdown-delay 0``, is replaced by ``b`` (whose
  endpoint appears with ``a0``'s removal). ``a0`` stops listening at once, and the creates sent to
  it meanwhile fail (``failed calling webhook``): the test sees the failure it guards against.
- The drain, in a rolling update's order (maxSurge 1, maxUnavailable 0): the successor ``a`` is an
  endpoint, then ``b`` (3 s of drain here; the chart's default is 5 s) is stopped. The apiserver
  keeps its connections to ``b``; ``b`` serves on, closing each connection after its answer, so
  the apiserver's new connections find ``a``. Not one create fails.
"""

from __future__ import annotations

import base64
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.cluster import host_address
from tests.k8s.k8s_tier import K8sBinaries, KubeAPI, start_etcd, start_kube_apiserver
from tests.support.cli import ix_gpu
from tests.support.waiting import wait_until
from tests.support.webhook_process import WebhookProcess

pytestmark = pytest.mark.k8s

NAMESPACE = "ix-gpu-system"
SERVICE = "ix-gpu-webhook"
TEAM = "team"
RESOURCE = "iluvatar.com/gpu"
INJECTED = "ix-gpu.io/injected"
CREATORS = 4
ENDPOINT_LAG_S = 1.5
"""How long after the SIGTERM the apiserver still routes to the stopped replica."""
DRAIN_S = 3.0


@dataclass
class Creates:
    """GPU pod creates (dry-run) sent in a loop from ``CREATORS`` threads; each outcome kept."""

    api: KubeAPI
    outcomes: list[tuple[float, int, bool, str]] = field(default_factory=list)
    """(time.monotonic(), HTTP status, injected, message)"""
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _run(self, n: int) -> None:
        body = {
            "metadata": {"generateName": f"rollover-{n}-"},
            "spec": {
                "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {RESOURCE: "1"}}}]
            },
        }
        while not self._stop.is_set():
            status, reply = self.api.request("POST", f"/api/v1/namespaces/{TEAM}/pods?dryRun=All", body)
            annotations = reply.get("metadata", {}).get("annotations", {}) if isinstance(reply, dict) else {}
            message = reply.get("message", "") if isinstance(reply, dict) else str(reply)
            self.outcomes.append((time.monotonic(), status, INJECTED in annotations, message))

    def __enter__(self) -> Creates:
        self._threads = [threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(CREATORS)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def failures(self, since: float = 0.0) -> list[tuple[float, int, bool, str]]:
        return [o for o in self.outcomes if o[0] >= since and not (o[1] == 201 and o[2])]


@pytest.fixture(scope="module")
def routed_api(
    k8s_binaries: K8sBinaries, k8s_log_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeAPI]:
    """A kube-apiserver of its own (its own etcd) that dials webhooks at their Service's endpoints."""
    etcd = start_etcd(k8s_binaries, k8s_log_dir)
    api = start_kube_apiserver(
        k8s_binaries,
        etcd,
        tmp_path_factory.mktemp("routed-apiserver"),
        k8s_log_dir,
        extra_args=["--enable-aggregator-routing=true"],
    )
    yield api
    api.stop()
    etcd.stop()


def _create(api: KubeAPI, path: str, body: dict[str, Any]) -> None:
    status, reply = api.request("POST", path, body)
    assert status == 201, (path, status, reply)


def _slice_path(name: str = "") -> str:
    return f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices" + (f"/{name}" if name else "")


def _publish(api: KubeAPI, name: str, address: str, port: int) -> None:
    """One EndpointSlice of the Service for one replica (what the endpointslice controller writes)."""
    _create(
        api,
        _slice_path(),
        {
            "metadata": {"name": name, "labels": {"kubernetes.io/service-name": SERVICE}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        },
    )


def _admissions_since(webhook: WebhookProcess, since_wall: float) -> int:
    """Reviews answered (one ``admission`` log line each at info level) at or after ``since_wall``."""
    return sum(
        1
        for entry in webhook.logs()
        if entry.get("msg") == "admission"
        and datetime.fromisoformat(str(entry["ts"]).replace("Z", "+00:00")).timestamp() >= since_wall
    )


def _stop_replica(
    api: KubeAPI, webhook: WebhookProcess, slice_name: str, then: Callable[[], None] = lambda: None
) -> int:
    """What the kubelet and the endpointslice controller do, with the apiserver lagging: SIGTERM,
    then ``ENDPOINT_LAG_S`` later the endpoint removed (and ``then()``). Returns the exit status."""
    assert webhook.process is not None
    os.kill(webhook.process.pid, signal.SIGTERM)
    time.sleep(ENDPOINT_LAG_S)
    status, reply = api.request("DELETE", _slice_path(slice_name))
    assert status == 200, reply
    then()
    exit_status = webhook.process.popen.wait(DRAIN_S + 30)
    time.sleep(1.0)  # creates go on against the replica that stays
    return exit_status


def test_a_replica_stopped_under_load_loses_no_create(routed_api: KubeAPI, tmp_path: Path) -> None:
    api = routed_api
    address = host_address()
    if address is None:
        pytest.fail("no global IPv4 address: an EndpointSlice may not name a loopback address")
    certs = tmp_path / "certs"
    dns = f"{SERVICE}.{NAMESPACE}.svc"
    ix_gpu("certs", "generate", "--out", str(certs), "--dns", dns, "--ip", address, check=True)
    config = tmp_path / "webhook.yaml"
    config.write_text(ix_gpu("config", "default", check=True).stdout)

    def replica(name: str, delay: float) -> WebhookProcess:
        return WebhookProcess(
            tmp_path,
            certs,
            name=name,
            config=config,
            host=address,
            extra=["--shutdown-delay", f"{delay:g}"],
        ).start()

    for namespace in (NAMESPACE, TEAM):
        _create(api, "/api/v1/namespaces", {"metadata": {"name": namespace}})
    _create(
        api,
        f"/api/v1/namespaces/{NAMESPACE}/services",
        {
            "metadata": {"name": SERVICE},
            "spec": {"ports": [{"name": "https", "port": 443, "protocol": "TCP"}]},
        },
    )
    hook = {
        "name": "pods.ix-gpu.io",
        "clientConfig": {
            "service": {"namespace": NAMESPACE, "name": SERVICE, "path": "/mutate", "port": 443},
            "caBundle": base64.b64encode((certs / "ca.crt").read_bytes()).decode(),
        },
        "rules": [
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
        ],
        "namespaceSelector": {
            "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": [TEAM]}]
        },
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 10,
    }
    _create(
        api,
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
        {"metadata": {"name": "ix-gpu-rollover"}, "webhooks": [hook]},
    )

    abrupt = replica("a0", 0)
    drained = replica("b", DRAIN_S)
    _publish(api, "a0", address, abrupt.port)
    successor: WebhookProcess | None = None
    try:
        with Creates(api) as creates:
            # The control: "a0" is the only endpoint and is replaced by "b" the way a Deployment
            # with maxSurge 0 would, but stops listening at once; "b" appears with the removal.
            wait_until(
                lambda: _admissions_since(abrupt, time.time() - 0.3) and not creates.failures(),
                "a0 to answer reviews",
                60,
                interval=0.05,
                details=lambda: f"failures: {creates.failures()[-3:]}",
            )
            began_control = time.monotonic()
            control_exit = _stop_replica(
                api, abrupt, "a0", then=lambda: _publish(api, "b", address, drained.port)
            )
            control_failures = creates.failures(began_control)

            # The rolling update (maxSurge 1, maxUnavailable 0): the successor "a" is an endpoint
            # before "b" is stopped. The apiserver keeps its connections to "b" (a new endpoint
            # gets traffic only when a connection is made), so the drain must hand them over.
            successor = replica("a", DRAIN_S)
            _publish(api, "a", address, successor.port)
            time.sleep(1.0)
            began = time.monotonic()
            signalled_wall = time.time()
            drained_exit = _stop_replica(api, drained, "b")
            failures = creates.failures(began)
            served_while_draining = _admissions_since(drained, signalled_wall)
            taken_over = _admissions_since(successor, signalled_wall)
            total = len([o for o in creates.outcomes if o[0] >= began])
    finally:
        for webhook in (drained, abrupt, successor):
            if webhook is not None:
                webhook.stop()

    print(
        f"\ncontrol (no drain): {len(control_failures)} creates failed, e.g. "
        f"{control_failures[0][3][:200] if control_failures else '-'}\ndrain: {len(failures)} of {total} "
        f"creates failed; the stopped replica answered {served_while_draining} reviews after its SIGTERM, "
        f"its successor {taken_over}"
    )
    assert control_exit == 0 and drained_exit == 0
    assert control_failures, "without the drain no create failed: the test cannot tell a drain from none"
    assert all("failed calling webhook" in message for *_, message in control_failures), control_failures[:3]
    assert not failures, failures[:5]
    assert served_while_draining > 0, "the draining replica got nothing: the window was not tested"
    assert taken_over > 0
