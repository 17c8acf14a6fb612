"""Which parameters the n-th trial gets, and how it receives them.

``random``: the n-th trial's value of a parameter is a pure function of (seed, n, the
parameter's name, its expression): the uniform draws come from sha256 of those, not from a
generator's state, so an operator that restarts after drawing any number of trials draws
the same n-th trial again, and adding a parameter leaves the others' values as they were.
``grid``: every combination of ``choice`` values, the first parameter (by name) varying
slowest and each choice's values in the order written (``itertools.product``'s order).
``bayesian``: checked here (bounded expressions only, :func:`check_bayesian`), sampled by
``torchyard.tuning.bayesian`` (Optuna's TPE, which this standard-library core does not import).

A trial receives its parameters as HyperDrive passes them, as script arguments
(``--learning_rate 0.0031``, :func:`arguments`) and as variables
(``TORCHYARD_PARAM_LEARNING_RATE``, :func:`environment`), formatted by
``space.format_value``. Called by the Sweep controller and local mode when they make a
trial, and by the SDK's dry run; pure.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Literal, TypeAlias

from torchyard.launch.contract import PARAM_VARIABLE_PREFIX
from torchyard.sweeps import expressions
from torchyard.sweeps.expressions.base import Expression, Value, format_value
from torchyard.sweeps.space import SearchSpace

Sampling: TypeAlias = Literal["random", "grid", "bayesian"]
SAMPLINGS: tuple[Sampling, ...] = ("random", "grid", "bayesian")
ENV_PREFIX = PARAM_VARIABLE_PREFIX
# Bumped only with a deliberate change of every sweep's sequence.
_DOMAIN = "torchyard.sweeps.random/1"


class SamplingError(ValueError):
    """A sweep that cannot be sampled as configured; ``field`` is the spec field at fault."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


def uniform01(seed: int, trial: int, name: str, draw: int) -> float:
    """The ``draw``-th uniform number in [0, 1) of parameter ``name`` in trial ``trial``:
    the top 53 bits of sha256 of the four, as a float."""
    key = f"{_DOMAIN}\x00{seed}\x00{trial}\x00{name}\x00{draw}".encode()
    bits = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") >> 11
    return bits / 2**53


def draw(expression: Expression, seed: int, trial: int, name: str) -> Value:
    """The value of one parameter in one trial of a random sweep."""
    return expression.draw(lambda k: uniform01(seed, trial, name, k))


def bayesian_types() -> tuple[str, ...]:
    """The expressions bayesian sampling takes: those with a search range (Optuna's TPE
    searches a bounded range; Azure ML's Bayesian sampling takes choice, uniform and
    quniform)."""
    return tuple(
        e.TYPE for e in expressions.registered() if e.search_range is not Expression.search_range
    )


def random_trial(space: SearchSpace, seed: int, trial: int) -> dict[str, Value]:
    """The parameters of trial ``trial`` (0, 1, ...) of a random sweep with ``seed``."""
    _check_index(trial)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SamplingError("seed", f"must be an integer, got {seed!r}")
    return {p.name: draw(p.expression, seed, trial, p.name) for p in space.parameters}


def grid_size(space: SearchSpace) -> int:
    """How many combinations a grid over ``space`` has; :class:`SamplingError` when a
    parameter is not a ``choice``."""
    grids = _grids(space)
    return math.prod(len(values) for values in grids.values())


def _grids(space: SearchSpace) -> dict[str, tuple[Value, ...]]:
    """Each parameter's grid values; :class:`SamplingError` when one has none."""
    grids = {p.name: p.expression.grid_values() for p in space.parameters}
    others = [p for p in space.parameters if grids[p.name] is None]
    if others:
        names = ", ".join(f"{p.name} is {p.expression.TYPE}" for p in others)
        takes = [
            e.TYPE for e in expressions.registered() if e.grid_values is not Expression.grid_values
        ]
        raise SamplingError(
            f"parameters.{others[0].name}",
            f"grid sampling takes only {' and '.join(takes)} expressions ({names}); use "
            "random sampling",
        )
    return {name: values for name, values in grids.items() if values is not None}


def grid_trial(space: SearchSpace, trial: int) -> dict[str, Value]:
    """Combination ``trial`` of the grid: the last parameter (by name) varies fastest."""
    _check_index(trial)
    grids = _grids(space)
    size = math.prod(len(values) for values in grids.values())
    if trial >= size:
        raise SamplingError("maxTotalTrials", f"the grid has {size} combinations, not {trial + 1}")
    out: dict[str, Value] = {}
    rest = trial
    for p in reversed(space.parameters):
        values = grids[p.name]
        rest, i = divmod(rest, len(values))
        out[p.name] = values[i]
    return {name: out[name] for name in space.names()}


def check(sampling: str, space: SearchSpace, max_total_trials: int) -> int:
    """How many trials the sweep makes (``maxTotalTrials``, or fewer for a smaller grid);
    :class:`SamplingError` for an unknown sampling or a grid larger than
    ``maxTotalTrials`` (a grid is run whole or not at all)."""
    if sampling not in SAMPLINGS:
        raise SamplingError("sampling", f"must be one of {', '.join(SAMPLINGS)}; got {sampling!r}")
    if isinstance(max_total_trials, bool) or not isinstance(max_total_trials, int):
        raise SamplingError("maxTotalTrials", f"must be an integer, got {max_total_trials!r}")
    if max_total_trials < 1:
        raise SamplingError("maxTotalTrials", f"must be at least 1, got {max_total_trials}")
    if sampling == "random":
        return max_total_trials
    if sampling == "bayesian":
        check_bayesian(space)
        return max_total_trials
    grids = _grids(space)
    size = math.prod(len(values) for values in grids.values())
    if size > max_total_trials:
        sizes = " x ".join(f"{len(values)} {name}" for name, values in grids.items())
        raise SamplingError(
            "maxTotalTrials",
            f"the grid has {size} combinations ({sizes}), more than maxTotalTrials "
            f"{max_total_trials}: raise maxTotalTrials to {size} or use fewer values",
        )
    return size


def check_bayesian(space: SearchSpace) -> None:
    """:class:`SamplingError` naming the first parameter bayesian sampling cannot search."""
    others = [p for p in space.parameters if p.expression.search_range() is None]
    if others:
        names = ", ".join(f"{p.name} is {p.expression.TYPE}" for p in others)
        raise SamplingError(
            f"parameters.{others[0].name}",
            f"bayesian sampling takes only {', '.join(bayesian_types())} expressions (a "
            f"bounded range) ({names}); use random sampling",
        )


def trial_parameters(
    sampling: Sampling, space: SearchSpace, seed: int, trial: int
) -> dict[str, Value]:
    """Trial ``trial``'s parameters under ``sampling`` (random or grid: bayesian sampling
    learns from the results so far, ``torchyard.tuning.bayesian.suggest``)."""
    if sampling == "grid":
        return grid_trial(space, trial)
    if sampling == "random":
        return random_trial(space, seed, trial)
    raise SamplingError(
        "sampling", f"{sampling!r}: trial_parameters samples random or grid sweeps only"
    )


def arguments(parameters: Mapping[str, Value]) -> list[str]:
    """The script arguments HyperDrive passes: ``--name value`` per parameter, by name."""
    out: list[str] = []
    for name in sorted(parameters):
        out += [f"--{name}", format_value(parameters[name])]
    return out


def environment(parameters: Mapping[str, Value]) -> dict[str, str]:
    """``TORCHYARD_PARAM_<NAME>`` (the name upper-cased) per parameter."""
    return {
        f"{ENV_PREFIX}{name.upper()}": format_value(parameters[name]) for name in sorted(parameters)
    }


def _check_index(trial: int) -> None:
    if isinstance(trial, bool) or not isinstance(trial, int) or trial < 0:
        raise ValueError(f"a trial's index is an integer >= 0, got {trial!r}")
