"""Kubernetes resource quantities ("500m", "64Gi", "1e3") as exact numbers, and back.

One parser for the whole package: the API models compare ``resources.shmSize`` with
``resources.memory`` as the apiserver's CEL ``quantity()`` does, the Pod builder halves
``memory`` for the default ``/dev/shm``, and gang admission adds up requests against
node capacity (``torchyard.planning.admission``). Pure; tested in
``tests/unit/api/test_quantities.py``.
"""

from __future__ import annotations

import functools
import re
from decimal import Decimal
from typing import Any

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[a-zA-Z]*)$")
_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
}
# Largest first: the shortest exact way to write a number of bytes.
_BINARY = ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki")
_DECIMAL = ("E", "P", "T", "G", "M", "k")


def quantity(value: Any) -> Decimal:
    """A Kubernetes quantity ("500m", "64Gi", "1e3", 8) as a number of units.

    ValueError for anything Kubernetes would not parse either (a fractional exponent,
    an unknown suffix, two decimal points)."""
    return _parse(str(value).strip())


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> Decimal:
    """:func:`quantity` of the text, remembered: an admission pass parses every node's
    allocatable and every Pod's requests, the same few strings thousands of times."""
    value = text
    match = _QUANTITY.match(text)
    if not match or text.lstrip("+-").count(".") > 1 or text.lstrip("+-") in (".", ""):
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix = match.groups()
    if suffix[:1] in ("e", "E") and suffix[1:]:
        return Decimal(number) * (Decimal(10) ** int(suffix[1:]))
    if suffix not in _SUFFIX:
        raise ValueError(f"not a quantity: {value!r}")
    return Decimal(number) * _SUFFIX[suffix]


def format_bytes(value: Decimal) -> str:
    """Whole bytes (rounded down, at least 1) as the shortest exact quantity: 32Gi, 500M."""
    whole = max(int(value), 1)
    for suffix in _BINARY + _DECIMAL:
        unit = int(_SUFFIX[suffix])
        if whole % unit == 0:
            return f"{whole // unit}{suffix}"
    return str(whole)
