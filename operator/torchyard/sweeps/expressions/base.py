"""What a parameter expression is (``spec.parameters.<name>.type``, Azure ML's parameter
expressions), and what every expression shares: its fields, the checks of their values,
how a value is written for a trial, and the errors.

An expression is one module with one frozen dataclass, registered with
:func:`torchyard.sweeps.expressions.register`. The class is the descriptor: its ``TYPE``,
its ``SUMMARY`` (the CRD's and the reference's line: what a value is), its ``FIELDS`` (the
JSON form and the CRD's schema of each, shared :class:`Field` objects: ``VALUES``,
``UPPER``, ``MIN_VALUE``...) and its behaviour: :meth:`Expression.draw` (random sampling),
and the optional capabilities :meth:`~Expression.grid_values` (grid sampling takes only
expressions that have them), :meth:`~Expression.search_range` and
:meth:`~Expression.from_search` (bayesian sampling takes only bounded ones) and
:meth:`~Expression.hint`. An instance is one parameter's expression. The rules of the
fields (CEL and their twins) are :data:`FIELD_RULES`; the API makes the CRD's schema of
``spec.parameters`` from the registered expressions' fields.

Pure, standard library only. Tested in tests/unit/sweeps/test_space.py and
tests/unit/sweeps/test_sampling.py.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar, Literal, TypeAlias

from torchyard.variants import Rule

# A parameter's value as a trial receives it.
Value: TypeAlias = int | float | str | bool

# At most this many parameters, and this many values in one choice (the Sweep's status
# carries every trial's parameters): the API's schema says the same, from here.
MAX_PARAMETERS = 64
MAX_CHOICES = 1000
MAX_STRING = 1024
# randint's upper bound: a 53-bit uniform draw covers every integer below it.
MAX_RANDINT = 2**53
# Normal draws (Box-Muller from 53-bit uniforms) lie within this many standard deviations
# of the mean: sqrt(-2 ln 2**-53) = 8.57.
Z_MAX = 8.6
# exp(x) is a finite float for x below this.
LOG_MAX = 709.0


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a space: the field (``parameters.lr.minValue``) and what."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class SpaceError(ValueError):
    """A search space that cannot be sampled; ``problems`` names each field at fault."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


def bad(field: str, message: str) -> SpaceError:
    return SpaceError([Problem(field, message)])


def finite(field: str, value: Any) -> float:
    """``value`` as a float: a JSON number (not a bool), finite."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(field, f"must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise bad(field, f"must be a finite number, got {value!r}")
    return number


def step(value: Any) -> int | float:
    """``q``: a positive finite number, kept an int when given as one."""
    number = finite("q", value)
    if number <= 0:
        raise bad("q", f"must be greater than 0, got {value!r}")
    return value if isinstance(value, int) else number


def check_range(low: float, high: float) -> None:
    if low >= high:
        raise bad("minValue", f"must be less than maxValue ({low!r} >= {high!r})")
    if not math.isfinite(high - low):
        raise bad("maxValue", f"the range {low!r}..{high!r} is too wide for a float")


def check_log(high: float) -> None:
    if high > LOG_MAX:
        raise bad(
            "maxValue",
            f"is a natural logarithm (loguniform draws exp(uniform(minValue, maxValue))): "
            f"exp({high!r}) overflows a float; did you mean {math.log(high)!r}?",
        )


def check_normal(mu: float, sigma: float, log: bool) -> None:
    if sigma <= 0:
        raise bad("sigma", f"must be greater than 0, got {sigma!r}")
    extreme = abs(mu) + Z_MAX * sigma
    if not math.isfinite(extreme):
        raise bad("sigma", f"mu {mu!r} and sigma {sigma!r} give draws beyond a float")
    if log and mu + Z_MAX * sigma > LOG_MAX:
        raise bad(
            "sigma",
            f"exp(normal({mu!r}, {sigma!r})) can overflow a float: mu + {Z_MAX} * sigma "
            f"must be at most {LOG_MAX}",
        )


def format_value(value: Value) -> str:
    """A value as the trial reads it (``--name value``, ``TORCHYARD_PARAM_NAME``): a float
    in its shortest form that reads back as the same float (``0.0031``, ``1e-05``), an int
    or a string as is, a bool as ``True``/``False``."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        return repr(value + 0.0)  # -0.0 as 0.0
    return str(value)


@dataclass(frozen=True)
class Field:
    """One field of the expressions: its JSON name, the dataclass attribute, its JSON
    kind (a list of ``values``, an integer, a number), what the CRD says of it and its
    bounds there, and whether CEL can read it (an array of numbers, strings or booleans
    has no CEL type: the apiserver leaves ``values`` out of what a rule may read)."""

    name: str
    attribute: str
    kind: Literal["values", "integer", "number"]
    description: str
    minimum: int | None = None
    maximum: int | None = None
    cel: bool = True


VALUES = Field(
    "values",
    "values",
    "values",
    "choice: the values (numbers, strings or booleans); grid sampling takes each in turn.",
    cel=False,
)
UPPER = Field(
    "upper",
    "upper",
    "integer",
    "randint: values are the integers 0 .. upper-1.",
    minimum=1,
    maximum=MAX_RANDINT,
)
MIN_VALUE = Field("minValue", "min_value", "number", "The lower bound.")
MAX_VALUE = Field("maxValue", "max_value", "number", "The upper bound.")
Q = Field("q", "q", "number", "The step values are rounded to (an integer q gives integers).")
MU = Field("mu", "mu", "number", "normal: the mean.")
SIGMA = Field("sigma", "sigma", "number", "normal: the standard deviation.")

# The rules of the fields' values (CEL on an expression, and their twins on the API's
# model), for the fields an expression takes.
FIELD_RULES: tuple[tuple[tuple[Field, ...], Rule[Any]], ...] = (
    (
        (MIN_VALUE, MAX_VALUE),
        Rule(
            {
                "rule": "!has(self.minValue) || !has(self.maxValue) || "
                "self.minValue < self.maxValue",
                "message": "minValue must be less than maxValue",
                "fieldPath": ".minValue",
            },
            lambda m: m.min_value is None or m.max_value is None or m.min_value < m.max_value,
        ),
    ),
    (
        (SIGMA,),
        Rule(
            {
                "rule": "!has(self.sigma) || self.sigma > 0.0",
                "message": "sigma must be greater than 0",
                "fieldPath": ".sigma",
            },
            lambda m: m.sigma is None or m.sigma > 0,
        ),
    ),
    (
        (Q,),
        Rule(
            {
                "rule": "!has(self.q) || self.q > 0.0",
                "message": "q must be greater than 0",
                "fieldPath": ".q",
            },
            lambda m: m.q is None or m.q > 0,
        ),
    ),
)


@dataclass(frozen=True)
class Range:
    """What bayesian sampling searches for an expression: ``values`` (categorical), or
    integers or floats between ``low`` and ``high`` (``log``: on a log scale)."""

    kind: Literal["categorical", "integer", "float"]
    values: tuple[Value, ...] = ()
    low: float = 0.0
    high: float = 0.0
    log: bool = False


# The n-th uniform draw in [0, 1) of a parameter in a trial (``sampling.uniform01``).
Draws: TypeAlias = Callable[[int], float]


class Expression(ABC):
    """The descriptor of a parameter expression (see the module docstring); its
    subclasses are frozen dataclasses whose fields are ``FIELDS``' attributes, in order
    (the SDK's and Azure ML's positional arguments)."""

    TYPE: ClassVar[str] = ""
    SUMMARY: ClassVar[str] = ""
    FIELDS: ClassVar[tuple[Field, ...]] = ()

    @abstractmethod
    def draw(self, u: Draws) -> Value:
        """The value of one parameter in one trial of a random sweep, from its uniform
        draws ``u(0)``, ``u(1)``, ..."""

    def grid_values(self) -> tuple[Value, ...] | None:
        """The values a grid takes in turn; None: this expression cannot be on a grid."""
        return None

    def search_range(self) -> Range | None:
        """What bayesian sampling searches; None: it cannot search this expression."""
        return None

    def from_search(self, value: Any) -> Value:
        """A value bayesian sampling chose, as the trial receives it."""
        return value  # type: ignore[no-any-return]

    def hint(self) -> str | None:
        """Valid but likely mistaken (for a condition or an Event), else None."""
        return None

    def to_json(self) -> dict[str, Any]:
        """The expression in the JSON form :func:`space.parse_expression` reads."""
        out: dict[str, Any] = {"type": self.TYPE}
        for field in self.FIELDS:
            value = getattr(self, field.attribute)
            out[field.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def missing_callbacks(cls) -> list[str]:
        return sorted(getattr(cls, "__abstractmethods__", ()))


def standard_normal(u: Draws) -> float:
    """Box-Muller from ``u(0)`` and ``u(1)``: within +-8.57 (``Z_MAX``) since
    1 - u(0) >= 2**-53."""
    return math.sqrt(-2.0 * math.log(1.0 - u(0))) * math.cos(2.0 * math.pi * u(1))


def between(u: Draws, low: float, high: float) -> float:
    return low + u(0) * (high - low)


def quantize(x: float, q: int | float) -> Value:
    """round(x / q) * q (round half to even): an int for an int ``q``; for a float ``q``, a
    float rounded to ``q``'s decimals (0.1 * 3 is 0.3, not 0.30000000000000004)."""
    steps = round(x / q)
    if isinstance(q, int):
        return steps * q
    decimals = -int(Decimal(repr(q)).as_tuple().exponent)
    value = steps * q
    return round(value, decimals) + 0.0 if decimals > 0 else value + 0.0
