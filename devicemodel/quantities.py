"""Kubernetes resource quantities, as far as GPU counts need them.

Extended resources such as ``iluvatar.com/gpu`` must be whole, non-negative numbers, and when both
a request and a limit are given they must be equal (the apiserver enforces this for Pods, but not
inside a TFJob's templates — there the error would only surface when the operator creates Pods,
far from the user). The webhook therefore parses quantities itself and denies early with a message
that names the container and resource.
"""

from __future__ import annotations

import re
from fractions import Fraction

_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>\d+(?:\.\d*)?|\.\d+)"
    r"(?:(?P<exp>[eE][+-]?\d+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)
_SUFFIX: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}


class QuantityError(ValueError):
    """A quantity that cannot be a GPU count; the message says why, for the user."""


def parse_quantity(raw: object) -> Fraction:
    """Parse a Kubernetes quantity (``"2"``, ``2``, ``"1k"``, ``"500m"``) into an exact fraction."""
    if isinstance(raw, bool):
        raise QuantityError(f"{raw!r} is not a quantity")
    if isinstance(raw, int):
        return Fraction(raw)
    if isinstance(raw, float):
        return Fraction(raw)  # YAML `1.5` arrives as a float; exact conversion keeps 1.5 != 1
    if not isinstance(raw, str):
        raise QuantityError(f"{raw!r} is not a quantity")
    match = _QUANTITY.match(raw.strip())
    if match is None:
        raise QuantityError(f"{raw!r} is not a valid quantity")
    value = Fraction(match["number"])
    if match["exp"]:
        value *= Fraction(10) ** int(match["exp"][1:])
    else:
        value *= _SUFFIX[match["suffix"] or ""]
    return -value if match["sign"] == "-" else value


def gpu_count(raw: object) -> int:
    """A GPU count: a whole, non-negative quantity."""
    # Fast path for what nearly every manifest holds (1, "2"); it is on the admission hot path.
    if type(raw) is int and raw >= 0:
        return raw
    if type(raw) is str and raw.isdigit() and raw.isascii():
        return int(raw)
    value = parse_quantity(raw)
    if value < 0:
        raise QuantityError(f"{raw!r} is negative")
    if value.denominator != 1:
        raise QuantityError(f"{raw!r} is not a whole number")
    return int(value)
