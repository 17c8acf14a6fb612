"""The search space: Azure ML's parameter expressions as typed values, read from a Sweep's
``spec.parameters`` and checked.

``sweeps.sampling`` draws trial values from these expressions; whatever admits a Sweep
(its CRD admission, the SDK's dry run, local mode) calls :func:`parse_space`, which refuses
a bad space with every problem named by its field (:class:`SpaceError`). The SDK builds the
same objects with the Azure ML names :func:`choice`, :func:`uniform`, ...

The JSON form is Azure ML's sweep YAML (``type`` plus that type's fields) in Kubernetes'
camelCase, one object per parameter, keyed by the parameter's name::

    parameters:
      learning_rate: {type: uniform, minValue: 0.0005, maxValue: 0.005}
      momentum:      {type: uniform, minValue: 0.9, maxValue: 0.99}
      batch_size:    {type: choice, values: [16, 32, 64]}

==============  =====================  =====================================================
type            fields                 a value is
==============  =====================  =====================================================
choice          values                 one of ``values`` (numbers or strings)
randint         upper                  an integer in [0, upper)
uniform         minValue, maxValue     uniform in [minValue, maxValue]
quniform        minValue, maxValue, q  round(uniform(minValue, maxValue) / q) * q
loguniform      minValue, maxValue     exp(uniform(minValue, maxValue)): the bounds are
                                       natural logarithms, as in Azure ML
qloguniform     minValue, maxValue, q  round(exp(uniform(minValue, maxValue)) / q) * q
normal          mu, sigma              normal with mean ``mu``, standard deviation ``sigma``
qnormal         mu, sigma, q           round(normal(mu, sigma) / q) * q
lognormal       mu, sigma              exp(normal(mu, sigma))
qlognormal      mu, sigma, q           round(exp(normal(mu, sigma)) / q) * q
==============  =====================  =====================================================

An integer ``q`` (``q: 1``) gives integer values (``32``), a float ``q`` (``q: 0.5``) floats
rounded to ``q``'s decimals. A parameter's name becomes the trial's ``--name value``
argument and its ``TORCHYARD_PARAM_NAME`` variable, so it is an ASCII identifier and no two
names differ only in case.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

from torchyard.launch.contract import PARAM_VARIABLE_PREFIX

# A parameter's value as a trial receives it.
Value: TypeAlias = int | float | str | bool

# At most this many parameters, and this many values in one choice (the Sweep's status
# carries every trial's parameters).
MAX_PARAMETERS = 64
MAX_CHOICES = 1000
MAX_STRING = 1024
# randint's upper bound: a 53-bit uniform draw covers every integer below it.
MAX_RANDINT = 2**53
# Normal draws (``sampling``'s Box-Muller from 53-bit uniforms) lie within this many
# standard deviations of the mean: sqrt(-2 ln 2**-53) = 8.57.
Z_MAX = 8.6
# exp(x) is a finite float for x below this.
LOG_MAX = 709.0

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}\Z")
NAME_RULE = (
    "use ASCII letters, digits and _ (not a digit first), at most 63 characters: "
    "it becomes the trial's --{name} argument and TORCHYARD_PARAM_{upper} variable"
)


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


def _bad(field: str, message: str) -> SpaceError:
    return SpaceError([Problem(field, message)])


def _finite(field: str, value: Any) -> float:
    """``value`` as a float: a JSON number (not a bool), finite."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(field, f"must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise _bad(field, f"must be a finite number, got {value!r}")
    return number


def _step(value: Any) -> int | float:
    """``q``: a positive finite number, kept an int when given as one."""
    number = _finite("q", value)
    if number <= 0:
        raise _bad("q", f"must be greater than 0, got {value!r}")
    return value if isinstance(value, int) else number


def _check_range(low: float, high: float) -> None:
    if low >= high:
        raise _bad("minValue", f"must be less than maxValue ({low!r} >= {high!r})")
    if not math.isfinite(high - low):
        raise _bad("maxValue", f"the range {low!r}..{high!r} is too wide for a float")


def _check_log(high: float) -> None:
    if high > LOG_MAX:
        raise _bad(
            "maxValue",
            f"is a natural logarithm (loguniform draws exp(uniform(minValue, maxValue))): "
            f"exp({high!r}) overflows a float; did you mean {math.log(high)!r}?",
        )


def _check_normal(mu: float, sigma: float, log: bool) -> None:
    if sigma <= 0:
        raise _bad("sigma", f"must be greater than 0, got {sigma!r}")
    extreme = abs(mu) + Z_MAX * sigma
    if not math.isfinite(extreme):
        raise _bad("sigma", f"mu {mu!r} and sigma {sigma!r} give draws beyond a float")
    if log and mu + Z_MAX * sigma > LOG_MAX:
        raise _bad(
            "sigma",
            f"exp(normal({mu!r}, {sigma!r})) can overflow a float: mu + {Z_MAX} * sigma "
            f"must be at most {LOG_MAX}",
        )


class _Expression:
    """What every expression shares: its ``type`` name and its JSON fields."""

    TYPE: ClassVar[str]
    # JSON field name -> dataclass attribute, in the order the expression takes them
    FIELDS: ClassVar[dict[str, str]]

    def to_json(self) -> dict[str, Any]:
        """The expression in the JSON form :func:`parse_expression` reads."""
        out: dict[str, Any] = {"type": self.TYPE}
        for key, attribute in self.FIELDS.items():
            value = getattr(self, attribute)
            out[key] = list(value) if isinstance(value, tuple) else value
        return out


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
class Choice(_Expression):
    """One of ``values``; grid sampling takes each in turn."""

    values: tuple[Value, ...]

    TYPE = "choice"
    FIELDS = {"values": "values"}

    def __post_init__(self) -> None:
        raw: Any = self.values
        if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
            raise _bad("values", f"must be a list, got {raw!r}")
        if not raw:
            raise _bad("values", "is empty: a choice needs at least one value")
        if len(raw) > MAX_CHOICES:
            raise _bad("values", f"has {len(raw)} values; at most {MAX_CHOICES}")
        seen: dict[str, int] = {}
        for i, value in enumerate(raw):
            field = f"values[{i}]"
            if isinstance(value, str):
                if "\x00" in value:
                    raise _bad(field, "a NUL character cannot be passed in an argument")
                if len(value) > MAX_STRING:
                    raise _bad(field, f"is {len(value)} characters long; at most {MAX_STRING}")
            elif isinstance(value, bool | int):
                pass
            elif isinstance(value, float):
                _finite(field, value)
            else:
                raise _bad(field, f"must be a number, a string or a bool, got {value!r}")
            text = format_value(value)
            if text in seen:
                raise _bad(field, f"{text} is listed twice (also values[{seen[text]}])")
            seen[text] = i
        object.__setattr__(self, "values", tuple(raw))


@dataclass(frozen=True)
class RandInt(_Expression):
    """An integer in [0, upper)."""

    upper: int

    TYPE = "randint"
    FIELDS = {"upper": "upper"}

    def __post_init__(self) -> None:
        upper: Any = self.upper
        if isinstance(upper, bool) or not isinstance(upper, int):
            raise _bad("upper", f"must be an integer, got {upper!r}")
        if not 1 <= upper <= MAX_RANDINT:
            raise _bad("upper", f"must be between 1 and 2**53, got {upper!r}")


@dataclass(frozen=True)
class Uniform(_Expression):
    """Uniform in [min_value, max_value]."""

    min_value: float
    max_value: float

    TYPE = "uniform"
    FIELDS = {"minValue": "min_value", "maxValue": "max_value"}

    def __post_init__(self) -> None:
        low, high = _finite("minValue", self.min_value), _finite("maxValue", self.max_value)
        _check_range(low, high)
        object.__setattr__(self, "min_value", low)
        object.__setattr__(self, "max_value", high)


@dataclass(frozen=True)
class QUniform(_Expression):
    """round(uniform(min_value, max_value) / q) * q."""

    min_value: float
    max_value: float
    q: int | float

    TYPE = "quniform"
    FIELDS = {"minValue": "min_value", "maxValue": "max_value", "q": "q"}

    def __post_init__(self) -> None:
        low, high = _finite("minValue", self.min_value), _finite("maxValue", self.max_value)
        _check_range(low, high)
        object.__setattr__(self, "min_value", low)
        object.__setattr__(self, "max_value", high)
        object.__setattr__(self, "q", _step(self.q))


def _log_bounds(expr: LogUniform | QLogUniform) -> None:
    """Checks and sets the finite bounds, in log space, of a log-uniform expression."""
    low, high = _finite("minValue", expr.min_value), _finite("maxValue", expr.max_value)
    _check_range(low, high)
    _check_log(high)
    object.__setattr__(expr, "min_value", low)
    object.__setattr__(expr, "max_value", high)


@dataclass(frozen=True)
class LogUniform(_Expression):
    """exp(uniform(min_value, max_value)): the bounds are natural logarithms."""

    min_value: float
    max_value: float

    TYPE = "loguniform"
    FIELDS = {"minValue": "min_value", "maxValue": "max_value"}

    def __post_init__(self) -> None:
        _log_bounds(self)


@dataclass(frozen=True)
class QLogUniform(_Expression):
    """round(exp(uniform(min_value, max_value)) / q) * q."""

    min_value: float
    max_value: float
    q: int | float

    TYPE = "qloguniform"
    FIELDS = {"minValue": "min_value", "maxValue": "max_value", "q": "q"}

    def __post_init__(self) -> None:
        _log_bounds(self)
        object.__setattr__(self, "q", _step(self.q))


@dataclass(frozen=True)
class Normal(_Expression):
    """Normal with mean ``mu`` and standard deviation ``sigma``."""

    mu: float
    sigma: float

    TYPE = "normal"
    FIELDS = {"mu": "mu", "sigma": "sigma"}

    def __post_init__(self) -> None:
        mu, sigma = _finite("mu", self.mu), _finite("sigma", self.sigma)
        _check_normal(mu, sigma, log=False)
        object.__setattr__(self, "mu", mu)
        object.__setattr__(self, "sigma", sigma)


@dataclass(frozen=True)
class QNormal(_Expression):
    """round(normal(mu, sigma) / q) * q."""

    mu: float
    sigma: float
    q: int | float

    TYPE = "qnormal"
    FIELDS = {"mu": "mu", "sigma": "sigma", "q": "q"}

    def __post_init__(self) -> None:
        mu, sigma = _finite("mu", self.mu), _finite("sigma", self.sigma)
        _check_normal(mu, sigma, log=False)
        object.__setattr__(self, "mu", mu)
        object.__setattr__(self, "sigma", sigma)
        object.__setattr__(self, "q", _step(self.q))


@dataclass(frozen=True)
class LogNormal(_Expression):
    """exp(normal(mu, sigma))."""

    mu: float
    sigma: float

    TYPE = "lognormal"
    FIELDS = {"mu": "mu", "sigma": "sigma"}

    def __post_init__(self) -> None:
        mu, sigma = _finite("mu", self.mu), _finite("sigma", self.sigma)
        _check_normal(mu, sigma, log=True)
        object.__setattr__(self, "mu", mu)
        object.__setattr__(self, "sigma", sigma)


@dataclass(frozen=True)
class QLogNormal(_Expression):
    """round(exp(normal(mu, sigma)) / q) * q."""

    mu: float
    sigma: float
    q: int | float

    TYPE = "qlognormal"
    FIELDS = {"mu": "mu", "sigma": "sigma", "q": "q"}

    def __post_init__(self) -> None:
        mu, sigma = _finite("mu", self.mu), _finite("sigma", self.sigma)
        _check_normal(mu, sigma, log=True)
        object.__setattr__(self, "mu", mu)
        object.__setattr__(self, "sigma", sigma)
        object.__setattr__(self, "q", _step(self.q))


Expression: TypeAlias = (
    Choice
    | RandInt
    | Uniform
    | QUniform
    | LogUniform
    | QLogUniform
    | Normal
    | QNormal
    | LogNormal
    | QLogNormal
)

TYPES: dict[str, type[Expression]] = {
    cls.TYPE: cls
    for cls in (
        Choice,
        RandInt,
        Uniform,
        QUniform,
        LogUniform,
        QLogUniform,
        Normal,
        QNormal,
        LogNormal,
        QLogNormal,
    )
}


@dataclass(frozen=True)
class Parameter:
    """A named expression."""

    name: str
    expression: Expression


@dataclass(frozen=True)
class SearchSpace:
    """The parameters, ordered by name (the order a Kubernetes object keeps its keys in,
    whatever order they were written in), which sampling and the arguments follow."""

    parameters: tuple[Parameter, ...]

    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters)

    def to_json(self) -> dict[str, dict[str, Any]]:
        """The space in the JSON form :func:`parse_space` reads."""
        return {p.name: p.expression.to_json() for p in self.parameters}


def _with_field(error: SpaceError, prefix: str) -> SpaceError:
    return SpaceError([Problem(f"{prefix}.{p.field}", p.message) for p in error.problems])


def parse_expression(obj: Any, field: str = "expression") -> Expression:
    """One expression from its JSON form; :class:`SpaceError` names the field at fault,
    under ``field``."""
    if not isinstance(obj, Mapping):
        raise _bad(field, f'must be an object such as {{"type": "uniform", ...}}, got {obj!r}')
    kind = obj.get("type")
    if kind is None:
        keys = sorted(str(k) for k in obj)
        hint = ""
        if len(keys) == 1 and keys[0] in TYPES:
            cls = TYPES[keys[0]]
            hint = f': write {{"type": "{keys[0]}", ' + ", ".join(f'"{k}": ...' for k in cls.FIELDS)
            hint += "}"
        raise _bad(f"{field}.type", f"is missing (got the fields {keys}){hint}")
    if not isinstance(kind, str) or kind not in TYPES:
        raise _bad(f"{field}.type", f"must be one of {', '.join(TYPES)}; got {kind!r}")
    cls = TYPES[kind]
    unknown = sorted(str(k) for k in obj if k != "type" and k not in cls.FIELDS)
    missing = [k for k in cls.FIELDS if k not in obj]
    problems = [Problem(f"{field}.{k}", f"is not a field of {kind}") for k in unknown]
    problems += [Problem(f"{field}.{k}", f"is required by {kind}") for k in missing]
    if problems:
        raise SpaceError(problems)
    arguments = {cls.FIELDS[k]: obj[k] for k in cls.FIELDS}
    try:
        return cls(**arguments)
    except SpaceError as e:
        raise _with_field(e, field) from None


def check_name(name: Any, field: str) -> str:
    """``name`` if it can be a parameter's name, else :class:`SpaceError`."""
    if not isinstance(name, str) or not NAME.match(name):
        rule = NAME_RULE.format(name="NAME", upper="NAME")
        raise _bad(field, f"{name!r} is not a valid parameter name: {rule}")
    return name


def _name_problems(names: Iterable[Any], field: str) -> list[Problem]:
    """Names that cannot be a trial's ``--name`` and ``TORCHYARD_PARAM_NAME``, and names
    that differ only in case (one variable for both)."""
    problems: list[Problem] = []
    by_variable: dict[str, str] = {}
    for name in sorted(names, key=str):
        try:
            check_name(name, f"{field}.{name}")
        except SpaceError as e:
            problems += e.problems
            continue
        upper = name.upper()
        if upper in by_variable:
            problems.append(
                Problem(
                    f"{field}.{name}",
                    f"{name!r} and {by_variable[upper]!r} would both be "
                    f"{PARAM_VARIABLE_PREFIX}{upper}: names must differ in more than case",
                )
            )
        by_variable[upper] = name
    return problems


def _check_size(parameters: Mapping[Any, Any], field: str) -> None:
    if not parameters:
        raise _bad(field, "the search space is empty: give at least one parameter")
    if len(parameters) > MAX_PARAMETERS:
        raise _bad(field, f"has {len(parameters)} parameters; at most {MAX_PARAMETERS}")


def make_space(parameters: Mapping[str, Expression], field: str = "parameters") -> SearchSpace:
    """A space from expressions already built (the SDK's ``{"lr": uniform(...)}``)."""
    if not isinstance(parameters, Mapping):
        raise _bad(field, f"must be a mapping of parameter name -> expression, got {parameters!r}")
    _check_size(parameters, field)
    problems = _name_problems(parameters, field)
    expressions = tuple(TYPES.values())
    problems += [
        Problem(f"{field}.{name}", f"is not a parameter expression: {expression!r}")
        for name, expression in parameters.items()
        if not isinstance(expression, expressions)
    ]
    if problems:
        raise SpaceError(problems)
    return SearchSpace(tuple(Parameter(n, parameters[n]) for n in sorted(parameters)))


def parse_space(obj: Any, field: str = "parameters") -> SearchSpace:
    """The search space from its JSON form (see the module's docstring): every problem of
    every parameter in one :class:`SpaceError`, each naming its field."""
    if not isinstance(obj, Mapping):
        raise _bad(field, f"must be an object of parameter name -> expression, got {obj!r}")
    _check_size(obj, field)
    problems = _name_problems(obj, field)
    expressions: dict[str, Expression] = {}
    for name, raw in obj.items():
        try:
            expressions[name] = parse_expression(raw, f"{field}.{name}")
        except SpaceError as e:
            problems += e.problems
    if problems:
        raise SpaceError(problems)
    return SearchSpace(tuple(Parameter(n, expressions[n]) for n in sorted(expressions)))


def hints(space: SearchSpace, field: str = "parameters") -> list[Problem]:
    """Valid but likely mistaken: a loguniform whose bounds look like the values wanted
    rather than their logarithms (``loguniform(0.0001, 0.1)`` draws between 1.0001 and
    1.105). For a condition or an Event, not a refusal."""
    out: list[Problem] = []
    for p in space.parameters:
        e = p.expression
        if isinstance(e, LogUniform | QLogUniform) and e.min_value > 0 and e.max_value <= 1:
            out.append(
                Problem(
                    f"{field}.{p.name}",
                    f"{e.TYPE} draws exp(uniform({e.min_value!r}, {e.max_value!r})), between "
                    f"{math.exp(e.min_value):.6g} and {math.exp(e.max_value):.6g}; for values "
                    f"between {e.min_value!r} and {e.max_value!r} write minValue: "
                    f"{math.log(e.min_value):.6g}, maxValue: {math.log(e.max_value):.6g}",
                )
            )
    return out


# The Azure ML names (azureml.train.hyperdrive.parameter_expressions), for the SDK.


def choice(*options: Any) -> Choice:
    """``choice(16, 32, 64)`` or ``choice([16, 32, 64])``."""
    values = options[0] if len(options) == 1 and isinstance(options[0], list | tuple) else options
    return Choice(tuple(values))


def randint(upper: int) -> RandInt:
    return RandInt(upper)


def uniform(min_value: float, max_value: float) -> Uniform:
    return Uniform(min_value, max_value)


def quniform(min_value: float, max_value: float, q: int | float) -> QUniform:
    return QUniform(min_value, max_value, q)


def loguniform(min_value: float, max_value: float) -> LogUniform:
    return LogUniform(min_value, max_value)


def qloguniform(min_value: float, max_value: float, q: int | float) -> QLogUniform:
    return QLogUniform(min_value, max_value, q)


def normal(mu: float, sigma: float) -> Normal:
    return Normal(mu, sigma)


def qnormal(mu: float, sigma: float, q: int | float) -> QNormal:
    return QNormal(mu, sigma, q)


def lognormal(mu: float, sigma: float) -> LogNormal:
    return LogNormal(mu, sigma)


def qlognormal(mu: float, sigma: float, q: int | float) -> QLogNormal:
    return QLogNormal(mu, sigma, q)


__all__ = [
    "Choice",
    "Expression",
    "LogNormal",
    "LogUniform",
    "Normal",
    "Parameter",
    "Problem",
    "QLogNormal",
    "QLogUniform",
    "QNormal",
    "QUniform",
    "RandInt",
    "SearchSpace",
    "SpaceError",
    "Uniform",
    "Value",
    "choice",
    "format_value",
    "hints",
    "lognormal",
    "loguniform",
    "make_space",
    "normal",
    "parse_expression",
    "parse_space",
    "qlognormal",
    "qloguniform",
    "qnormal",
    "quniform",
    "randint",
    "uniform",
]
