"""The search space: Azure ML's parameter expressions as typed values, read from a Sweep's
``spec.parameters`` and checked.

The expressions are registered variants (``sweeps.expressions``, one module per
family); this module reads a space through the registry. ``sweeps.sampling`` draws trial
values from these expressions; whatever admits a Sweep
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

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from torchyard.launch.contract import PARAM_VARIABLE_PREFIX
from torchyard.sweeps import expressions
from torchyard.sweeps.expressions.base import (
    LOG_MAX,
    MAX_CHOICES,
    MAX_PARAMETERS,
    MAX_RANDINT,
    MAX_STRING,
    Z_MAX,
    Expression,
    Problem,
    SpaceError,
    Value,
    bad,
    format_value,
)
from torchyard.sweeps.expressions.choice import Choice, choice
from torchyard.sweeps.expressions.loguniform import (
    LogUniform,
    QLogUniform,
    loguniform,
    qloguniform,
)
from torchyard.sweeps.expressions.normal import (
    LogNormal,
    Normal,
    QLogNormal,
    QNormal,
    lognormal,
    normal,
    qlognormal,
    qnormal,
)
from torchyard.sweeps.expressions.randint import RandInt, randint
from torchyard.sweeps.expressions.uniform import QUniform, Uniform, quniform, uniform

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}\Z")
NAME_RULE = (
    "use ASCII letters, digits and _ (not a digit first), at most 63 characters: "
    "it becomes the trial's --{name} argument and TORCHYARD_PARAM_{upper} variable"
)


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
        raise bad(field, f'must be an object such as {{"type": "uniform", ...}}, got {obj!r}')
    kind = obj.get("type")
    if kind is None:
        keys = sorted(str(k) for k in obj)
        hint = ""
        if len(keys) == 1 and keys[0] in expressions.names():
            cls = expressions.get(keys[0])
            hint = f': write {{"type": "{keys[0]}", ' + ", ".join(
                f'"{f.name}": ...' for f in cls.FIELDS
            )
            hint += "}"
        raise bad(f"{field}.type", f"is missing (got the fields {keys}){hint}")
    if not isinstance(kind, str) or kind not in expressions.names():
        raise bad(f"{field}.type", f"must be one of {', '.join(expressions.names())}; got {kind!r}")
    cls = expressions.get(kind)
    names = {f.name: f.attribute for f in cls.FIELDS}
    unknown = sorted(str(k) for k in obj if k != "type" and k not in names)
    missing = [k for k in names if k not in obj]
    problems = [Problem(f"{field}.{k}", f"is not a field of {kind}") for k in unknown]
    problems += [Problem(f"{field}.{k}", f"is required by {kind}") for k in missing]
    if problems:
        raise SpaceError(problems)
    arguments = {names[k]: obj[k] for k in names}
    try:
        return cls(**arguments)
    except SpaceError as e:
        raise _with_field(e, field) from None


def check_name(name: Any, field: str) -> str:
    """``name`` if it can be a parameter's name, else :class:`SpaceError`."""
    if not isinstance(name, str) or not NAME.match(name):
        rule = NAME_RULE.format(name="NAME", upper="NAME")
        raise bad(field, f"{name!r} is not a valid parameter name: {rule}")
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
        raise bad(field, "the search space is empty: give at least one parameter")
    if len(parameters) > MAX_PARAMETERS:
        raise bad(field, f"has {len(parameters)} parameters; at most {MAX_PARAMETERS}")


def make_space(parameters: Mapping[str, Expression], field: str = "parameters") -> SearchSpace:
    """A space from expressions already built (the SDK's ``{"lr": uniform(...)}``)."""
    if not isinstance(parameters, Mapping):
        raise bad(field, f"must be a mapping of parameter name -> expression, got {parameters!r}")
    _check_size(parameters, field)
    problems = _name_problems(parameters, field)
    problems += [
        Problem(f"{field}.{name}", f"is not a parameter expression: {expression!r}")
        for name, expression in parameters.items()
        if not isinstance(expression, Expression)
    ]
    if problems:
        raise SpaceError(problems)
    return SearchSpace(tuple(Parameter(n, parameters[n]) for n in sorted(parameters)))


def parse_space(obj: Any, field: str = "parameters") -> SearchSpace:
    """The search space from its JSON form (see the module's docstring): every problem of
    every parameter in one :class:`SpaceError`, each naming its field."""
    if not isinstance(obj, Mapping):
        raise bad(field, f"must be an object of parameter name -> expression, got {obj!r}")
    _check_size(obj, field)
    problems = _name_problems(obj, field)
    parsed: dict[str, Expression] = {}
    for name, raw in obj.items():
        try:
            parsed[name] = parse_expression(raw, f"{field}.{name}")
        except SpaceError as e:
            problems += e.problems
    if problems:
        raise SpaceError(problems)
    return SearchSpace(tuple(Parameter(n, parsed[n]) for n in sorted(parsed)))


def hints(space: SearchSpace, field: str = "parameters") -> list[Problem]:
    """Valid but likely mistaken, as each expression says (a loguniform whose bounds look
    like the values wanted rather than their logarithms: ``loguniform(0.0001, 0.1)`` draws
    between 1.0001 and 1.105). For a condition or an Event, not a refusal."""
    return [
        Problem(f"{field}.{p.name}", hint)
        for p in space.parameters
        if (hint := p.expression.hint()) is not None
    ]


__all__ = [
    "LOG_MAX",
    "MAX_CHOICES",
    "MAX_PARAMETERS",
    "MAX_RANDINT",
    "MAX_STRING",
    "Z_MAX",
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
