"""Kubernetes resource quantities, as far as GPU counts need them.

Extended resources such as ``iluvatar.com/gpu`` must be whole, non-negative numbers, and when both
a request and a limit are given they must be equal (the apiserver enforces this for Pods, but not
inside a TFJob's templates — there the error would only surface when the operator creates Pods,
far from the user). The webhook therefore parses quantities itself and denies early with a message
that names the container and resource.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

MAX_QUANTITY_CHARS = 64
"""Longer text is refused before it is parsed. Kubernetes' own quantities fit in far fewer
characters; the cap is what keeps ``Fraction("1" * 100_000)`` off the admission path."""
MAX_EXPONENT = 40
"""Scientific exponents beyond ±40 are refused: 10**40 already exceeds the int64 range the
apiserver stores a quantity in, and ``1e100000000`` would otherwise build a 100-million-digit
integer (over a minute of CPU on the event loop)."""
MAX_GPU_COUNT = 2**63 - 1
"""The apiserver keeps quantities in an int64; a larger count is not a count it could store."""

_QUANTITY = re.compile(
    # ASCII digits only, nothing around them: Python's \d would also take Arabic-Indic or
    # full-width digits, and the apiserver's parser takes neither those nor surrounding spaces.
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)"
)
_SUFFIX: dict[str, Fraction] = {
    "": Fraction(1),
    **{suffix: Fraction(1, 1000) ** power for power, suffix in enumerate("mun", 1)},  # milli, micro, nano
    **{suffix: Fraction(1000) ** power for power, suffix in enumerate("kMGTPE", 1)},  # k is lower-case
    **{f"{letter}i": Fraction(1024) ** power for power, letter in enumerate("KMGTPE", 1)},  # Ki ... Ei
}


class QuantityError(ValueError):
    """A quantity that cannot be a GPU count; the message says why, for the user."""


def parse_quantity(raw: object) -> Fraction:
    """Parse a Kubernetes quantity (``"2"``, ``2``, ``"1k"``, ``"500m"``) into an exact fraction."""
    if isinstance(raw, bool):
        raise QuantityError(f"{raw!r} is not a quantity")
    if isinstance(raw, int):
        if abs(raw) > MAX_GPU_COUNT:  # compared, never printed: repr of a huge int is itself costly
            raise QuantityError("the number is larger than a quantity can hold (2^63-1)")
        return Fraction(raw)
    if isinstance(raw, float):
        if not math.isfinite(raw):  # YAML's .nan/.inf, or 1.0e+400 read as a float
            raise QuantityError(f"{raw!r} is not a finite number")
        return Fraction(raw)  # YAML `1.5` arrives as a float; exact conversion keeps 1.5 != 1
    if not isinstance(raw, str):
        kind = {dict: "an object", list: "a list", type(None): "null"}.get(type(raw), type(raw).__name__)
        raise QuantityError(f"{kind} is not a quantity")
    if len(raw) > MAX_QUANTITY_CHARS:
        raise QuantityError(f"{raw[:20]!r}... ({len(raw)} characters) is too long to be a quantity")
    match = _QUANTITY.fullmatch(raw)
    if match is None:
        raise QuantityError(f"{raw!r} is not a valid quantity")
    value = Fraction(match["number"])
    if match["exp"]:
        exponent = int(match["exp"][1:])
        if abs(exponent) > MAX_EXPONENT and value != 0:
            raise QuantityError(f"{raw!r} has an exponent beyond ±{MAX_EXPONENT}")
        value *= Fraction(10) ** max(min(exponent, MAX_EXPONENT), -MAX_EXPONENT)
    else:
        value *= _SUFFIX[match["suffix"] or ""]
    return -value if match["sign"] == "-" else value


def gpu_count(raw: object) -> int:
    """A GPU count: a whole, non-negative quantity."""
    # Fast path for what nearly every manifest holds (1, "2"); it is on the admission hot path.
    # (``type(...) is`` on purpose: bool is an int subclass and must take the slow path.)
    if type(raw) is int and 0 <= raw <= MAX_GPU_COUNT:
        return raw
    if type(raw) is str and len(raw) <= 18 and raw.isdigit() and raw.isascii():
        return int(raw)
    value = parse_quantity(raw)  # from here on ``raw`` is short enough to echo
    if value < 0:
        raise QuantityError(f"{raw!r} is negative")
    if value.denominator != 1:
        raise QuantityError(f"{raw!r} is not a whole number")
    if value > MAX_GPU_COUNT:
        raise QuantityError(f"{raw!r} is larger than a quantity can hold (2^63-1)")
    return int(value)
