"""Which allocator may hand out a node's GPUs: every label value and handover state, both sides.

The property at the end is the rule itself: for any node, slices and allocatable, the device plugin
and the DRA plugin are never both allowed, once each has seen what the other published.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ix_gpu.node.allocator import (
    LABEL,
    NodeFacts,
    device_plugin_offer,
    device_plugin_verdict,
    dra_verdict,
    node_mode,
)

DRIVER = "gpu.iluvatar.com"


def node(label: str | None = None, allocatable: dict[str, str] | None = None) -> NodeFacts:
    return NodeFacts({} if label is None else {LABEL: label}, allocatable or {})


@pytest.mark.parametrize(
    ("label", "mode"),
    [
        (None, "device-plugin"),
        ("", "device-plugin"),
        ("device-plugin", "device-plugin"),
        ("dra", "dra"),
        ("DRA", None),
        ("both", None),
    ],
)
def test_the_label_names_the_mode_and_anything_else_is_no_mode(label: str | None, mode: str | None) -> None:
    assert node_mode({} if label is None else {LABEL: label}) == mode


def test_from_node_reads_labels_and_allocatable_and_tolerates_junk() -> None:
    facts = NodeFacts.from_node(
        {"metadata": {"labels": {LABEL: "dra"}}, "status": {"allocatable": {"iluvatar.com/gpu": "4"}}}
    )
    assert facts == NodeFacts({LABEL: "dra"}, {"iluvatar.com/gpu": "4"})
    assert NodeFacts.from_node([]) == NodeFacts() == NodeFacts.from_node({"metadata": {"labels": None}})


def test_device_plugin_serves_an_unlabelled_or_device_plugin_node() -> None:
    assert device_plugin_verdict(node()).allowed
    assert device_plugin_verdict(node("device-plugin"), DRIVER, 0).allowed
    # Without a DRA driver to expect (and nothing to read the node with), nothing changes for it.
    assert device_plugin_verdict(None).allowed


def test_device_plugin_serves_nothing_on_a_dra_or_mislabelled_node() -> None:
    dra = device_plugin_verdict(node("dra"))
    assert not dra.allowed and f"{LABEL}=dra" in dra.reason
    typo = device_plugin_verdict(node("dra "), DRIVER, 0)
    assert not typo.allowed and "neither 'device-plugin' nor 'dra'" in typo.reason


def test_device_plugin_waits_for_the_dra_slices_to_empty_and_fails_closed() -> None:
    waiting = device_plugin_verdict(node(), DRIVER, 4)
    assert not waiting.allowed and "still list 4 devices" in waiting.reason
    unknown = device_plugin_verdict(node(), DRIVER, None)
    assert not unknown.allowed and "cannot list" in unknown.reason
    assert not device_plugin_verdict(None, DRIVER, 0).allowed


def test_dra_publishes_only_on_a_dra_node_with_no_device_plugin_gpus_offered() -> None:
    assert dra_verdict(node("dra"), "iluvatar.com").allowed
    assert dra_verdict(node("dra", {"iluvatar.com/gpu": "0", "cpu": "8"}), "iluvatar.com").allowed
    unlabelled = dra_verdict(node(), "iluvatar.com")
    assert not unlabelled.allowed and f"without the label {LABEL}=dra" in unlabelled.reason
    assert not dra_verdict(node("device-plugin"), "iluvatar.com").allowed
    assert not dra_verdict(node("yes"), "iluvatar.com").allowed
    assert not dra_verdict(None, "iluvatar.com").allowed
    offered = dra_verdict(node("dra", {"iluvatar.com/gpu": "4"}), "iluvatar.com")
    assert not offered.allowed and "iluvatar.com/gpu=4" in offered.reason


def test_any_resource_of_the_vendors_domain_counts_as_an_offer() -> None:
    allocatable = {"iluvatar.com/gpu.shared": "8", "iluvatar.com/gpu": "0", "nvidia.com/gpu": "2", "cpu": "8"}
    assert device_plugin_offer(allocatable, "iluvatar.com") == {"iluvatar.com/gpu.shared": "8"}
    assert device_plugin_offer({"iluvatar.com/gpu": "1k"}, "iluvatar.com") == {"iluvatar.com/gpu": "1k"}


label_values = st.sampled_from([None, "", "dra", "device-plugin", "Dra", "x"])


@given(
    plugin_label=label_values,
    dra_label=label_values,
    node_readable=st.booleans(),
    dra_driver=st.sampled_from([None, DRIVER]),
    allocatable=st.sampled_from(["0", "4", None]),
    slice_devices=st.sampled_from([0, 4, None]),
)
def test_never_both(
    plugin_label: str | None,
    dra_label: str | None,
    node_readable: bool,
    dra_driver: str | None,
    allocatable: str | None,
    slice_devices: int | None,
) -> None:
    """Each process may read the label at another moment (a relabel between their reads): then
    only the check of what the other publishes stands between them, and it must."""
    offer = {} if allocatable is None else {"iluvatar.com/gpu": allocatable}
    dra_sees = node(dra_label, offer) if node_readable else None
    plugin_sees = node(plugin_label) if node_readable else None
    plugin = device_plugin_verdict(plugin_sees, dra_driver, slice_devices).allowed
    dra = dra_verdict(dra_sees, "iluvatar.com").allowed
    if plugin_label == dra_label:
        assert not (plugin and dra)
    if dra:  # the kubelet offers no device-plugin GPU now
        assert allocatable in (None, "0")
    if plugin and dra_driver is not None:  # no slice of the DRA driver lists a device now
        assert slice_devices == 0
