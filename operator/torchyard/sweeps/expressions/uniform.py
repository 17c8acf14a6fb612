"""``type: uniform`` (uniform in [minValue, maxValue]) and ``quniform`` (rounded to a
multiple of q), and what they share with ``loguniform``'s two (:class:`Bounded`: the bounds
checked, the draw: uniform, then exp for the log forms, then rounded for the q forms).
Registered by ``sweeps.expressions``; tested in tests/unit/sweeps/test_space.py and
tests/unit/sweeps/test_sampling.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from torchyard.sweeps.expressions.base import (
    MAX_VALUE,
    MIN_VALUE,
    Draws,
    Expression,
    Q,
    Range,
    Value,
    between,
    check_log,
    check_range,
    finite,
    quantize,
    step,
)


class Bounded(Expression):
    """The uniform family: finite bounds ``min_value`` <= ``max_value`` (for the log forms,
    natural logarithms whose exp stays a float), q for the q forms; drawn uniform between
    them, then exp (``LOG``), then rounded to a multiple of q."""

    min_value: float
    max_value: float
    LOG: ClassVar[bool] = False

    def __post_init__(self) -> None:
        low, high = finite("minValue", self.min_value), finite("maxValue", self.max_value)
        check_range(low, high)
        if self.LOG:
            check_log(high)
        object.__setattr__(self, "min_value", low)
        object.__setattr__(self, "max_value", high)
        if hasattr(self, "q"):
            object.__setattr__(self, "q", step(self.q))

    def _rounded(self, value: float) -> Value:
        q = getattr(self, "q", None)
        return value if q is None else quantize(value, q)

    def draw(self, u: Draws) -> Value:
        value = between(u, self.min_value, self.max_value)
        return self._rounded(math.exp(value) if self.LOG else value)

    def search_range(self) -> Range:
        if self.LOG:
            return Range(
                "float", low=math.exp(self.min_value), high=math.exp(self.max_value), log=True
            )
        return Range("float", low=self.min_value, high=self.max_value)

    def from_search(self, value: Any) -> Value:
        return self._rounded(float(value))


@dataclass(frozen=True)
class Uniform(Bounded):
    """Uniform in [min_value, max_value]."""

    min_value: float
    max_value: float

    TYPE = "uniform"
    SUMMARY = "uniform in [minValue, maxValue]"
    FIELDS = (MIN_VALUE, MAX_VALUE)


@dataclass(frozen=True)
class QUniform(Bounded):
    """round(uniform(min_value, max_value) / q) * q."""

    min_value: float
    max_value: float
    q: int | float

    TYPE = "quniform"
    SUMMARY = "round(uniform(minValue, maxValue) / q) * q"
    FIELDS = (MIN_VALUE, MAX_VALUE, Q)


def uniform(min_value: float, max_value: float) -> Uniform:
    return Uniform(min_value, max_value)


def quniform(min_value: float, max_value: float, q: int | float) -> QUniform:
    return QUniform(min_value, max_value, q)
