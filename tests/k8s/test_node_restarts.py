"""The restart tests' judges (node_restarts.py) on made-up answers: each finds what it is there to
find, so a real-node run that finds nothing means nothing was there."""

from __future__ import annotations

from ix_gpu.node.attribution import ContainerDevices
from tests.k8s.node_restarts import ContainerView, double_allocations, registration_delay, shared_chips

RESOURCE = "iluvatar.com/gpu"
DRA = ("gpu.iluvatar.com", "gpu-b")


def test_a_device_plugin_id_in_two_pods_or_a_dra_device_in_two_claims_is_a_double_allocation() -> None:
    found = [
        ContainerDevices("ns", "a", "main", {RESOURCE: ("board-0",)}),
        ContainerDevices("ns", "b", "main", {RESOURCE: ("board-0", "board-1")}),
        ContainerDevices("ns", "c", "main", {}, (("ns/c-gpu", *DRA, "gpu-0"),)),
        ContainerDevices("ns", "d", "main", {}, (("ns/d-gpu", *DRA, "gpu-0"),)),
    ]
    assert double_allocations(found) == {
        f"{RESOURCE} board-0": ["pod ns/a", "pod ns/b"],
        "gpu.iluvatar.com gpu-b/gpu-0": ["claim ns/c-gpu", "claim ns/d-gpu"],
    }


def test_one_claim_shared_by_two_pods_and_two_containers_of_one_pod_are_one_holder() -> None:
    found = [
        ContainerDevices("ns", "a", "init", {RESOURCE: ("board-0",)}),
        ContainerDevices("ns", "a", "main", {RESOURCE: ("board-0",)}),
        ContainerDevices("ns", "c", "main", {}, (("ns/shared", *DRA, "gpu-0"),)),
        ContainerDevices("ns", "d", "main", {}, (("ns/shared", *DRA, "gpu-0"),)),
    ]
    assert double_allocations(found) == {}


def view(*numbers: str) -> ContainerView:
    devices = tuple(f"/dev/iluvatar{i} {n}" for i, n in enumerate(numbers))
    return ContainerView("containerd://x", 0, 1, devices, (), (), ())


def test_two_pods_reaching_one_chip_are_found_whatever_its_name_in_each() -> None:
    views = {"a": view("10:237", "10:234"), "b": view("10:183"), "c": view("10:234")}
    assert shared_chips(views) == {"10:234": ["a", "c"]}
    assert shared_chips({"a": views["a"], "b": views["b"]}) == {}


KUBELET_LOG = """\
I1207 02:00:00.900000   100 server.go:161] "Got registration request from device plugin with resource" \
resourceName="iluvatar.com/gpu"
I1207 02:00:01.100000   123 server.go:87] "Starting device plugin registration server"
I1207 02:00:01.200000   123 server.go:161] "Got registration request from device plugin with resource" \
resourceName="other.com/gpu"
I1207 02:00:03.350000   123 server.go:161] "Got registration request from device plugin with resource" \
resourceName="iluvatar.com/gpu"
"""


def test_the_registration_delay_runs_from_the_servers_start_to_the_first_register_of_the_resource() -> None:
    delay, started = registration_delay(KUBELET_LOG, RESOURCE, 2026) or (None, None)
    assert delay == 2.25 and started is not None and started.second == 1
    assert registration_delay(KUBELET_LOG.split("I1207 02:00:03")[0], RESOURCE, 2026) is None
