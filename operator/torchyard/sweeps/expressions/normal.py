"""``type: normal`` (mean mu, standard deviation sigma), ``qnormal`` (rounded to a multiple
of q), ``lognormal`` (exp(normal(mu, sigma))) and ``qlognormal``. Registered by
``sweeps.expressions``; tested in tests/unit/sweeps/test_space.py and
tests/unit/sweeps/test_sampling.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from torchyard.sweeps.expressions.base import (
    MU,
    SIGMA,
    Draws,
    Expression,
    Q,
    Value,
    check_normal,
    finite,
    quantize,
    standard_normal,
    step,
)


class _Normal(Expression):
    """What the four share: mu and sigma checked (for the log forms, that exp of the
    draws stays a float), q for the q forms, and the draw: normal, then exp, then rounded."""

    mu: float
    sigma: float
    LOG: ClassVar[bool] = False

    def __post_init__(self) -> None:
        mu, sigma = finite("mu", self.mu), finite("sigma", self.sigma)
        check_normal(mu, sigma, log=self.LOG)
        object.__setattr__(self, "mu", mu)
        object.__setattr__(self, "sigma", sigma)
        if hasattr(self, "q"):
            object.__setattr__(self, "q", step(self.q))

    def draw(self, u: Draws) -> Value:
        x = self.mu + self.sigma * standard_normal(u)
        value = math.exp(x) if self.LOG else x
        q = getattr(self, "q", None)
        return value if q is None else quantize(value, q)


@dataclass(frozen=True)
class Normal(_Normal):
    """Normal with mean ``mu`` and standard deviation ``sigma``."""

    mu: float
    sigma: float

    TYPE = "normal"
    SUMMARY = "normal with mean mu, standard deviation sigma"
    FIELDS = (MU, SIGMA)


@dataclass(frozen=True)
class QNormal(_Normal):
    """round(normal(mu, sigma) / q) * q."""

    mu: float
    sigma: float
    q: int | float

    TYPE = "qnormal"
    SUMMARY = "round(normal(mu, sigma) / q) * q"
    FIELDS = (MU, SIGMA, Q)


@dataclass(frozen=True)
class LogNormal(_Normal):
    """exp(normal(mu, sigma))."""

    mu: float
    sigma: float

    TYPE = "lognormal"
    SUMMARY = "exp(normal(mu, sigma))"
    FIELDS = (MU, SIGMA)
    LOG = True


@dataclass(frozen=True)
class QLogNormal(_Normal):
    """round(exp(normal(mu, sigma)) / q) * q."""

    mu: float
    sigma: float
    q: int | float

    TYPE = "qlognormal"
    SUMMARY = "round(exp(normal(mu, sigma)) / q) * q"
    FIELDS = (MU, SIGMA, Q)
    LOG = True


def normal(mu: float, sigma: float) -> Normal:
    return Normal(mu, sigma)


def qnormal(mu: float, sigma: float, q: int | float) -> QNormal:
    return QNormal(mu, sigma, q)


def lognormal(mu: float, sigma: float) -> LogNormal:
    return LogNormal(mu, sigma)


def qlognormal(mu: float, sigma: float, q: int | float) -> QLogNormal:
    return QLogNormal(mu, sigma, q)
