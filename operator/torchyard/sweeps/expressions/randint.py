"""``type: randint``: an integer in [0, upper). Registered by ``sweeps.expressions``;
tested in tests/unit/sweeps/test_space.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchyard.sweeps.expressions.base import (
    MAX_RANDINT,
    UPPER,
    Draws,
    Expression,
    Range,
    Value,
    bad,
)


@dataclass(frozen=True)
class RandInt(Expression):
    """An integer in [0, upper)."""

    upper: int

    TYPE = "randint"
    SUMMARY = "an integer in [0, upper)"
    FIELDS = (UPPER,)

    def __post_init__(self) -> None:
        upper: Any = self.upper
        if isinstance(upper, bool) or not isinstance(upper, int):
            raise bad("upper", f"must be an integer, got {upper!r}")
        if not 1 <= upper <= MAX_RANDINT:
            raise bad("upper", f"must be between 1 and 2**53, got {upper!r}")

    def draw(self, u: Draws) -> Value:
        return min(int(u(0) * self.upper), self.upper - 1)

    def search_range(self) -> Range:
        return Range("integer", low=0, high=self.upper - 1)

    def from_search(self, value: Any) -> Value:
        return int(value)


def randint(upper: int) -> RandInt:
    return RandInt(upper)
