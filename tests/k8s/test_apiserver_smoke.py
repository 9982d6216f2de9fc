"""Smoke tests of the real-Kubernetes tier itself: the apiserver and the kubelet device-manager harness."""

from __future__ import annotations

import re
import socket
import stat
from collections.abc import Callable

import pytest
from kubernetes import client

from tests.k8s.k8s_tier import KubeAPI, KubeletHarness

pytestmark = pytest.mark.k8s


def test_apiserver_reports_version_1_35(kube_api: KubeAPI) -> None:
    status, body = kube_api.request("GET", "/version")
    assert status == 200, body
    assert re.fullmatch(r"v1\.35\.\d+", body["gitVersion"]), body
    assert (body["major"], body["minor"]) == ("1", "35")


def test_unauthenticated_requests_are_rejected(kube_api: KubeAPI) -> None:
    status, _ = kube_api.request("GET", "/api/v1/namespaces", token="not-a-token")
    assert status == 401


def test_namespace_and_pod_round_trip(kube_api: KubeAPI, namespace: str) -> None:
    with kube_api.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        assert core.read_namespace(namespace).status.phase == "Active"
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name="smoke", labels={"app": "smoke"}),
            spec=client.V1PodSpec(
                containers=[
                    client.V1Container(
                        name="main",
                        image="registry.invalid/smoke:1",
                        resources=client.V1ResourceRequirements(limits={"iluvatar.com/gpu": "1"}),
                    )
                ]
            ),
        )
        core.create_namespaced_pod(namespace, pod)
        got = core.read_namespaced_pod("smoke", namespace)
    assert got.metadata.labels == {"app": "smoke"}
    assert got.spec.containers[0].resources.limits == {"iluvatar.com/gpu": "1"}
    # Extended resources get requests defaulted from limits by the apiserver.
    assert got.spec.containers[0].resources.requests == {"iluvatar.com/gpu": "1"}
    # No scheduler and no kubelet: the pod stays Pending without a node.
    assert got.status.phase == "Pending"
    assert got.spec.node_name is None


def test_kubelet_harness_serves_registration_socket(kubelet_harness: Callable[..., KubeletHarness]) -> None:
    h = kubelet_harness()
    assert h.ready["ok"] and h.ready["event"] == "ready"
    assert h.ready["socket"] == str(h.socket)
    assert stat.S_ISSOCK(h.socket.stat().st_mode)
    reply = h.capacity()
    assert reply["capacity"] == {} and reply["allocatable"] == {} and reply["deleted"] == []
    # Like the kubelet, the device manager ignores resources no plugin has registered.
    reply = h.call("allocate", pod="uid-1/p", container="c", resource="iluvatar.com/gpu", count=1)
    assert reply["ok"], reply
    assert reply["device_ids"] == {} and reply["envs"] == [] and reply["devices"] == []
    assert not h.call("no-such-command")["ok"]


def test_kubelet_harness_restart_recreates_socket(kubelet_harness: Callable[..., KubeletHarness]) -> None:
    h = kubelet_harness()
    stale = h.dir / "stale-plugin.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))
    reply = h.call("restart")
    assert reply["ok"], reply
    # Like a kubelet restart: every socket in the directory is deleted, kubelet.sock is served anew.
    assert not stale.exists()
    assert stat.S_ISSOCK(h.socket.stat().st_mode)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(h.socket))
    assert h.capacity()["capacity"] == {}
