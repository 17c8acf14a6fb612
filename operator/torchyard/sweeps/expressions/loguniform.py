"""``type: loguniform`` (exp(uniform(minValue, maxValue)): the bounds are natural
logarithms, as in Azure ML) and ``qloguniform`` (rounded to a multiple of q), on
``uniform.Bounded``. Registered by ``sweeps.expressions``; tested in
tests/unit/sweeps/test_space.py and tests/unit/sweeps/test_sampling.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torchyard.sweeps.expressions.base import MAX_VALUE, MIN_VALUE, Q
from torchyard.sweeps.expressions.uniform import Bounded


class _LogBounded(Bounded):
    """The log forms: the hint for bounds that look like the values wanted rather than
    their logarithms."""

    LOG = True

    def hint(self) -> str | None:
        low, high = self.min_value, self.max_value
        if not (low > 0 and high <= 1):
            return None
        return (
            f"{self.TYPE} draws exp(uniform({low!r}, {high!r})), between {math.exp(low):.6g} "
            f"and {math.exp(high):.6g}; for values between {low!r} and {high!r} write "
            f"minValue: {math.log(low):.6g}, maxValue: {math.log(high):.6g}"
        )


@dataclass(frozen=True)
class LogUniform(_LogBounded):
    """exp(uniform(min_value, max_value)): the bounds are natural logarithms."""

    min_value: float
    max_value: float

    TYPE = "loguniform"
    SUMMARY = "exp(uniform(minValue, maxValue)): the bounds are natural logarithms, as in Azure ML"
    FIELDS = (MIN_VALUE, MAX_VALUE)


@dataclass(frozen=True)
class QLogUniform(_LogBounded):
    """round(exp(uniform(min_value, max_value)) / q) * q."""

    min_value: float
    max_value: float
    q: int | float

    TYPE = "qloguniform"
    SUMMARY = "round(exp(uniform(minValue, maxValue)) / q) * q"
    FIELDS = (MIN_VALUE, MAX_VALUE, Q)


def loguniform(min_value: float, max_value: float) -> LogUniform:
    return LogUniform(min_value, max_value)


def qloguniform(min_value: float, max_value: float, q: int | float) -> QLogUniform:
    return QLogUniform(min_value, max_value, q)
