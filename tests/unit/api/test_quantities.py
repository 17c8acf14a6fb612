"""Kubernetes quantities: one parser for the API's shmSize <= memory rule, the default
/dev/shm (half of memory) and gang admission."""

from __future__ import annotations

from decimal import Decimal

import pytest

from torchyard.api.quantities import format_bytes, quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("64Gi", Decimal(64 * 2**30)),
        ("0.5Ti", Decimal(2**39)),
        ("1G", Decimal(10**9)),
        ("1E", Decimal(10**18)),
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),
        ("+2k", Decimal(2000)),
        (".5Gi", Decimal(2**29)),
        (8, Decimal(8)),
    ],
)
def test_quantities_parse_as_kubernetes_does(text: object, value: Decimal) -> None:
    assert quantity(text) == value


@pytest.mark.parametrize("text", ["lots", "1.2.3", "1e1.5", "1Qi", "", ".", "1 Gi", "Gi"])
def test_what_kubernetes_cannot_parse_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        quantity(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (quantity("64Gi") / 2, "32Gi"),
        (quantity("1G") / 2, "500M"),
        (quantity("0.5Ti") / 2, "256Gi"),
        (quantity("3Mi") / 2, "1536Ki"),
        (quantity("3") / 2, "1"),
        (Decimal(0), "1"),
    ],
)
def test_bytes_are_written_as_the_shortest_exact_quantity(value: Decimal, text: str) -> None:
    assert format_bytes(value) == text
    assert quantity(text) == max(int(value), 1)
