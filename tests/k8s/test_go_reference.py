"""The Go reference webhook (``bench/go-webhook``), against which the benches measure ix-gpu, makes
the pods ix-gpu makes of the scale bench's pods: the same driver volume, mount, environment,
toleration and injected annotation, and for the ``ix-gpu.io/gpu-type`` annotation the same
required node affinity, so a burst's scheduler places the same pods behind either webhook. Built
with ``go build`` and asked over real HTTPS; ix-gpu's side is its mutation core with the built-in
config. Only ix-gpu's own record of what it injected is left out of the comparison."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import os
import ssl
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import jsonpatch
import pytest

from ix_gpu.config.webhook_config import default_config
from ix_gpu.devicemodel import labels
from ix_gpu.webhook.certs.authority import generate_bundle, write_bundle
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.mutation import mutate
from tests.k8s.burst import gpu_pod, namespace_facts
from tests.k8s.burst_arms import GO_SOURCE
from tests.support.net import free_port

NAMESPACE = "scale-00001"


@pytest.fixture(scope="module")
def go_webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, ssl.SSLContext]]:
    work = tmp_path_factory.mktemp("go-reference")
    # The tier's own Go builds' flags (CGO_ENABLED=0, -trimpath): a cold run reuses the standard
    # library they compiled into Go's build cache.
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local"}
    build = ["go", "build", "-trimpath", "-buildvcs=false", "-o", str(work / "go-webhook"), "."]
    subprocess.run(build, cwd=GO_SOURCE, env=env, check=True, timeout=600)
    certs = write_bundle(generate_bundle(["localhost"], ["127.0.0.1"]), work / "certs")
    port = free_port()
    command = [str(work / "go-webhook"), "-cert", str(certs["tls.crt"]), "-key", str(certs["tls.key"])]
    command += ["-addr", f"127.0.0.1:{port}", "-digest", default_config().digest()]
    server = subprocess.Popen(command, stderr=subprocess.PIPE)
    context = ssl.create_default_context(cafile=str(certs["ca.crt"]))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=2)
                conn.request("GET", "/healthz")
                conn.getresponse().read()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield port, context
    finally:
        server.kill()
        server.wait()


def _go_pod(go_webhook: tuple[int, ssl.SSLContext], pod: dict[str, Any]) -> dict[str, Any]:
    port, context = go_webhook
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": "CREATE", "namespace": NAMESPACE, "object": pod},
    }
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
    conn.request("POST", "/mutate", body=json.dumps(review), headers={"Content-Type": "application/json"})
    response = json.loads(conn.getresponse().read())["response"]
    assert response["allowed"] is True and response["uid"] == "u-1"
    ops = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    return jsonpatch.apply_patch(pod, ops)


def _ix_gpu_pod(pod: dict[str, Any]) -> dict[str, Any]:
    result = mutate(
        copy.deepcopy(pod), "CREATE", namespace_facts(NAMESPACE), CompiledConfig(default_config())
    )
    assert result.allowed, result.reason
    mutated = jsonpatch.apply_patch(pod, result.ops)
    mutated["metadata"]["annotations"].pop(labels.INJECTED_ITEMS, None)
    return mutated


def _with(pod: dict[str, Any], annotation: str, affinity: dict[str, Any] | None) -> dict[str, Any]:
    pod["metadata"]["annotations"] = {labels.GPU_TYPE: annotation}
    if affinity is not None:
        pod["spec"]["affinity"] = affinity
    return pod


_TERM = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
_REQUIRED = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [_TERM, {}]}}
_PODS = {
    "the burst's plain pod": gpu_pod("gpu-000001", False),
    "the burst's pod with a gpu type": gpu_pod("gpu-000002", True),
    "two models, one with its vendor": _with(gpu_pod("p3", False), "Iluvatar BI-V150, BI-V100", None),
    "an affinity without node affinity": _with(gpu_pod("p4", False), "BI-V150", {"podAffinity": {}}),
    "node affinity without required terms": _with(gpu_pod("p5", False), "BI-V150", {"nodeAffinity": {}}),
    "required terms, one without expressions": _with(
        gpu_pod("p6", False), "BI-V150", {"nodeAffinity": _REQUIRED}
    ),
}


@pytest.mark.parametrize("name", list(_PODS))
def test_the_go_reference_makes_the_pod_ix_gpu_makes(
    go_webhook: tuple[int, ssl.SSLContext], name: str
) -> None:
    pod = _PODS[name]
    ours = _ix_gpu_pod(pod)
    assert ours != pod
    assert _go_pod(go_webhook, pod) == ours
