"""The committed DRA stubs match our .proto files, and the .proto files match the kubelet's wire format.

The field numbers and method paths are the ones in k8s.io/kubelet v0.37.2
(pkg/apis/dra/v1/api.proto, pkg/apis/pluginregistration/v1/api.proto); the bytes below are
encoded by hand from those numbers, independent of our field names.
"""

from __future__ import annotations

from pathlib import Path

from ix_gpu.dra.api import dra_health_v1_pb2 as health_v1
from ix_gpu.dra.api import dra_health_v1alpha1_pb2 as health_v1alpha1
from ix_gpu.dra.api import dra_v1_pb2 as dra
from ix_gpu.dra.api import pluginregistration_v1_pb2 as reg
from tests.support.generated_code import stale_generated

API = Path("ix_gpu", "dra", "api")
GENERATED = tuple(
    f"{stem}{suffix}"
    for stem in ("dra_v1", "pluginregistration_v1", "dra_health_v1", "dra_health_v1alpha1")
    for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_grpc.py")
)


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    stale = stale_generated(tmp_path, API, GENERATED)
    assert not stale, f"stale generated code, run scripts/gen_proto.sh: {stale}"


def test_service_and_method_paths() -> None:
    """gRPC paths are /<proto package>.<service>/<method>: the kubelet dials exactly these."""
    service = dra.DESCRIPTOR.services_by_name["DRAPlugin"]
    assert service.full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert [m.name for m in service.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
    for module, package in ((health_v1, "v1"), (health_v1alpha1, "v1alpha1")):
        health = module.DESCRIPTOR.services_by_name["DRAResourceHealth"]
        assert health.full_name == f"{package}.DRAResourceHealth"  # the name GetInfo lists, too
        (method,) = health.methods
        assert method.name == "NodeWatchResources" and method.server_streaming
    registration = reg.DESCRIPTOR.services_by_name["Registration"]
    assert registration.full_name == "pluginregistration.Registration"
    assert [m.name for m in registration.methods] == ["GetInfo", "NotifyRegistrationStatus"]


def _len_field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_wire_bytes_match_hand_encoding() -> None:
    info = reg.PluginInfo(
        type="DRAPlugin", name="gpu.iluvatar.com", endpoint="/p/dra.sock", supported_versions=["v1.DRAPlugin"]
    )
    assert info.SerializeToString() == (
        _len_field(1, b"DRAPlugin")
        + _len_field(2, b"gpu.iluvatar.com")
        + _len_field(3, b"/p/dra.sock")
        + _len_field(4, b"v1.DRAPlugin")
    )
    assert reg.RegistrationStatus(plugin_registered=True, error="x").SerializeToString() == bytes(
        [1 << 3, 1]
    ) + _len_field(2, b"x")
    claim = dra.Claim(namespace="ns", uid="u1", name="c")
    claim_bytes = _len_field(1, b"ns") + _len_field(2, b"u1") + _len_field(3, b"c")
    assert claim.SerializeToString() == claim_bytes
    assert dra.NodePrepareResourcesRequest(claims=[claim]).SerializeToString() == _len_field(1, claim_bytes)
    device = dra.Device(
        request_names=["gpu"], pool_name="node1", device_name="gpu-0", cdi_device_ids=["k/c=d"], share_id="s"
    )
    device_bytes = (
        _len_field(1, b"gpu")
        + _len_field(2, b"node1")
        + _len_field(3, b"gpu-0")
        + _len_field(4, b"k/c=d")
        + _len_field(5, b"s")
    )
    assert device.SerializeToString() == device_bytes
    result = dra.NodePrepareResourceResponse(devices=[device], error="e")
    result_bytes = _len_field(1, device_bytes) + _len_field(2, b"e")
    assert result.SerializeToString() == result_bytes
    response = dra.NodePrepareResourcesResponse(claims={"u1": result})
    assert response.SerializeToString() == _len_field(1, _len_field(1, b"u1") + _len_field(2, result_bytes))
    unprepare = dra.NodeUnprepareResourcesResponse(claims={"u1": dra.NodeUnprepareResourceResponse()})
    assert unprepare.SerializeToString() == _len_field(1, _len_field(1, b"u1") + _len_field(2, b""))


def test_health_wire_bytes_match_hand_encoding() -> None:
    """Field numbers and the enum's values, as the kubelet's health API has them (both versions)."""
    identifier_bytes = _len_field(1, b"node1") + _len_field(2, b"gpu-1")
    for module in (health_v1, health_v1alpha1):
        health = module.DeviceHealth(
            device=module.DeviceIdentifier(pool_name="node1", device_name="gpu-1"),
            health=module.UNHEALTHY,
            last_updated_time=100,
            health_check_timeout_seconds=15,
            message="hot",
        )
        health_bytes = (
            _len_field(1, identifier_bytes)
            + bytes([2 << 3, 2, 3 << 3, 100, 4 << 3, 15])
            + _len_field(5, b"hot")
        )
        assert health.SerializeToString() == health_bytes
        assert module.NodeWatchResourcesResponse(devices=[health]).SerializeToString() == _len_field(
            1, health_bytes
        )
        assert (module.UNKNOWN, module.HEALTHY, module.UNHEALTHY) == (0, 1, 2)
