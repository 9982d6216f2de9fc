"""The committed stubs match the .proto, and the .proto matches the kubelet's wire format."""

from __future__ import annotations

from pathlib import Path

from ix_gpu.plugin.api import deviceplugin_v1beta1_pb2 as pb
from tests.support.generated_code import stale_generated

API = Path("ix_gpu", "plugin", "api")
GENERATED = (
    "deviceplugin_v1beta1_pb2.py",
    "deviceplugin_v1beta1_pb2.pyi",
    "deviceplugin_v1beta1_pb2_grpc.py",
    "deviceplugin_v1beta1_grpc.py",
)


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    stale = stale_generated(tmp_path, API, GENERATED)
    assert not stale, f"stale generated code, run scripts/gen_proto.sh: {stale}"


def test_service_and_method_paths() -> None:
    services = pb.DESCRIPTOR.services_by_name
    assert services["Registration"].full_name == "v1beta1.Registration"
    assert [m.name for m in services["DevicePlugin"].methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    assert services["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming


def _varint_field(number: int, value: int) -> bytes:
    return bytes([number << 3 | 0, value])


def _len_field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_wire_bytes_match_hand_encoding() -> None:
    """Encoded by hand from the kubelet's field numbers, independent of our field names."""
    options = _varint_field(2, 1)
    request = pb.RegisterRequest(
        version="v1beta1",
        endpoint="ix.sock",
        resource_name="iluvatar.com/gpu",
        options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
    )
    assert request.SerializeToString() == (
        _len_field(1, b"v1beta1")
        + _len_field(2, b"ix.sock")
        + _len_field(3, b"iluvatar.com/gpu")
        + _len_field(4, options)
    )
    device = pb.Device(ID="GPU-a", health="Healthy", topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=1)]))
    topology = _len_field(1, _varint_field(1, 1))
    assert device.SerializeToString() == _len_field(1, b"GPU-a") + _len_field(2, b"Healthy") + _len_field(
        3, topology
    )
    spec = pb.DeviceSpec(container_path="/dev/iluvatar0", host_path="/dev/iluvatar0", permissions="rw")
    response = pb.ContainerAllocateResponse(devices=[spec])
    spec_bytes = _len_field(1, b"/dev/iluvatar0") + _len_field(2, b"/dev/iluvatar0") + _len_field(3, b"rw")
    assert response.SerializeToString() == _len_field(3, spec_bytes)
    preferred = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=["a"], must_include_deviceIDs=["b"], allocation_size=2
    )
    assert preferred.SerializeToString() == _len_field(1, b"a") + _len_field(2, b"b") + _varint_field(3, 2)
    assert pb.ContainerAllocateRequest(devices_ids=["x"]).SerializeToString() == _len_field(1, b"x")
    assert pb.ContainerAllocateResponse(envs={"K": "V"}).SerializeToString() == _len_field(
        1, _len_field(1, b"K") + _len_field(2, b"V")
    )
