"""The scale bench's knob for the real nodes' CPU weight (``host_cpu.py``), on a real cgroup."""

from __future__ import annotations

import os
import uuid

import pytest

from tests.k8s.host_cpu import set_cpu_shares, weight_of_shares
from tests.k8s.real_nodes import cgroup_hierarchies, make_cgroup_root, remove_cgroup_root


def test_shares_convert_to_weights_as_the_kubelet_converts_them() -> None:
    assert [weight_of_shares(s) for s in (2, 1024, 8192, 262144)] == [1, 39, 313, 10000]
    assert weight_of_shares(1) == 1 and weight_of_shares(10**9) == 10000  # clamped to the range


def test_a_nodes_cgroup_root_takes_the_weight_and_reads_it_back() -> None:
    if os.geteuid() != 0:
        pytest.skip("writing cgroups needs root")
    root = f"ixt-weight-{uuid.uuid4().hex[:8]}"
    make_cgroup_root(root)
    try:
        v1 = any((h / root / "cpu.shares").exists() for h in cgroup_hierarchies())
        if not v1 and not any((h / root / "cpu.weight").exists() for h in cgroup_hierarchies()):
            pytest.skip("no CPU controller for a top-level cgroup on this host")
        written = set_cpu_shares([root, "ixt-absent-root"], 4096)
        assert written == {root: 4096 if v1 else weight_of_shares(4096)}
    finally:
        remove_cgroup_root(root)
