from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from ix_gpu.devicemodel.labels import label_value
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
