from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

import pytest

from ix_gpu.devicemodel.labels import gpu_product_value, label_value, split_vendor
from ix_gpu.devicemodel.quantities import QuantityError, gpu_count, parse_quantity


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("1", 1),
        (2, 2),
        ("1k", 1000),
        ("1Ki", 1024),
        ("500m", Fraction(1, 2)),
        ("1e3", 1000),
        ("+2", 2),
        ("0.5", Fraction(1, 2)),
        (".5", Fraction(1, 2)),
        ("2E-1", Fraction(1, 5)),
        (1.5, Fraction(3, 2)),
    ],
)
def test_parse_quantity(raw: Any, value: Fraction) -> None:
    assert parse_quantity(raw) == value


@pytest.mark.parametrize("raw", ["", "abc", "1.2.3", "1Kb", "--1", None, [], {}, True, "1 000"])
def test_parse_quantity_rejects(raw: Any) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(raw)


@pytest.mark.parametrize(("raw", "count"), [("0", 0), (4, 4), ("2000m", 2), ("1e1", 10)])
def test_gpu_count(raw: Any, count: int) -> None:
    assert gpu_count(raw) == count


@pytest.mark.parametrize(("raw", "why"), [("-1", "negative"), ("1.5", "whole"), ("100m", "whole")])
def test_gpu_count_rejects(raw: Any, why: str) -> None:
    with pytest.raises(QuantityError, match=why):
        gpu_count(raw)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("Iluvatar BI-V150S", "Iluvatar-BI-V150S"),
        ("NVIDIA H200 (141GB)", "NVIDIA-H200-141GB"),
        ("  x ", "x"),
        ("a" * 80, "a" * 63),
    ],
)
def test_label_value(text: str, value: str) -> None:
    assert label_value(text) == value


VALID_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


@pytest.mark.parametrize(
    ("name", "vendor", "value"),
    [
        ("BI-V150", None, "BI-V150"),  # what the README tells users to write
        ("Iluvatar BI-V150", "iluvatar", "BI-V150"),  # what libixml reports
        ("iluvatar-BI-V150", "iluvatar", "BI-V150"),  # the product label before the bare model
        ("ILUVATAR_MR-V100", "iluvatar", "MR-V100"),
        ("  Iluvatar   BI V150 S ", "iluvatar", "BI-V150-S"),
        ("NVIDIA A100-SXM4-80GB", "nvidia", "A100-SXM4-80GB"),
        ("NVIDIA H200 (141GB)", "nvidia", "H200-141GB"),
        ("NVIDIA GeForce RTX 4090", "nvidia", "GeForce-RTX-4090"),
        ("Tesla V100-SXM2-16GB", None, "Tesla-V100-SXM2-16GB"),  # older NVML names: no vendor
        ("iluvatar 0x0001", "iluvatar", "0x0001"),  # the devfs backend's name
        ("NVIDIA", None, "NVIDIA"),  # nothing but a vendor: kept
        ("Iluvatar ###", "iluvatar", "Iluvatar"),  # no model left: not an empty value
        ("NVIDIAX 1", None, "NVIDIAX-1"),  # a vendor name must be a whole word
        ("Iluvatar BI/V150:rev.2", "iluvatar", "BI-V150-rev.2"),
        ("Iluvatar " + "x" * 80, "iluvatar", "x" * 63),
        ("ÉLAN-Ω 1", None, "LAN--1"),  # each run of other characters is one "-"
    ],
)
def test_gpu_product_value(name: str, vendor: str | None, value: str) -> None:
    assert split_vendor(name)[0] == vendor
    assert gpu_product_value(name) == value
    assert VALID_LABEL_VALUE.match(value)
    # Idempotent: a label value read back (and written into the annotation) maps to itself.
    assert gpu_product_value(value) == value
