"""Bayesian sampling of a sweep: the next trial's parameters from the results so far,
through Optuna's TPE sampler (``optuna.samplers.TPESampler``).

:func:`suggest` is a pure function of (the search space, the goal, the seed, the trial's
index, the earlier trials' :class:`Result`\\ s in index order): it builds a fresh
in-memory Optuna study from those results (a trial that ended with a metric as
``COMPLETE`` with its best value; one still waiting or running as ``RUNNING``, which the
constant liar keeps the next samples away from; one that failed or was canceled as
``FAIL``, which TPE ignores) and asks it, with the sampler seeded from (seed, index). So
the study's state is the sweep's own record of its trials, the Sweep's ledger ConfigMap
and its trials' annotations (local mode: its book of trials), not a database: an operator
that restarts rebuilds the same study, a trial once made keeps the parameters it was made
with, and the same seed with the same results gives the same trial. The first
:data:`STARTUP_TRIALS` trials are TPE's random start-up samples.

Values go to and from the study as the trial receives them: ``choice`` is categorical,
``randint`` an integer range, ``uniform``/``loguniform`` a (log) float range of
``exp(bounds)`` for the log ones (Azure ML's bounds are logarithms), and the q forms are
sampled in their range and rounded as random sampling rounds them: each expression's
``search_range`` and ``from_search`` (``sweeps.expressions``); a rounded value fed back is
clipped into the range.
Optuna is imported when first asked (the CLI and the operator start without it). Called by
the Sweep controller and local mode; tested in tests/unit/tuning/test_bayesian.py.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchyard.sweeps import space
from torchyard.sweeps.sampling import check_bayesian
from torchyard.sweeps.stopping import Goal

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

# TPE's random start-up samples before it models the results (Optuna's default).
STARTUP_TRIALS = 10
_DOMAIN = "torchyard.sweeps.bayesian/1"


@dataclass(frozen=True)
class Result:
    """What the sampler learns from one earlier trial: its parameters, its best metric
    (None: none yet), and whether it ended (``failed``: it failed or was canceled; an
    ended trial without a finite metric counts as failed too)."""

    parameters: dict[str, space.Value]
    value: float | None = None
    ended: bool = False
    failed: bool = False


def _trial_seed(seed: int, index: int) -> int:
    key = f"{_DOMAIN}\x00{seed}\x00{index}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big")


def distributions(searched: space.SearchSpace) -> dict[str, BaseDistribution]:
    """Each parameter's Optuna distribution (see the module docstring)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    check_bayesian(searched)
    out: dict[str, BaseDistribution] = {}
    for p in searched.parameters:
        searched_range = p.expression.search_range()
        assert searched_range is not None  # check_bayesian
        if searched_range.kind == "categorical":
            out[p.name] = CategoricalDistribution(searched_range.values)
        elif searched_range.kind == "integer":
            out[p.name] = IntDistribution(int(searched_range.low), int(searched_range.high))
        else:
            out[p.name] = FloatDistribution(
                searched_range.low, searched_range.high, log=searched_range.log
            )
    return out


def _into(dist: BaseDistribution, value: space.Value) -> Any:
    """A value a trial received, as the study's distribution holds it (clipped)."""
    from optuna.distributions import FloatDistribution, IntDistribution

    if isinstance(dist, FloatDistribution | IntDistribution):
        if isinstance(value, str | bool) or not math.isfinite(value):
            raise ValueError(f"not a number in a numeric range: {value!r}")
        clipped = min(max(value, dist.low), dist.high)
        return int(clipped) if isinstance(dist, IntDistribution) else float(clipped)
    return value


def suggest(
    searched: space.SearchSpace,
    goal: Goal,
    seed: int,
    index: int,
    results: Sequence[Result],
) -> dict[str, space.Value]:
    """The parameters of trial ``index`` given the earlier trials' ``results``."""
    import optuna
    from optuna.trial import TrialState, create_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = distributions(searched)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(
            seed=_trial_seed(seed, index),
            n_startup_trials=STARTUP_TRIALS,
            constant_liar=True,
            multivariate=True,
        )
        study = optuna.create_study(
            direction="maximize" if goal is Goal.MAXIMIZE else "minimize", sampler=sampler
        )
        for result in results:
            if any(n not in result.parameters for n in dists):
                continue  # parameters unknown: nothing to learn from
            finite = result.value is not None and math.isfinite(result.value)
            if result.ended and finite and not result.failed:
                state, value = TrialState.COMPLETE, result.value
            elif result.ended:
                state, value = TrialState.FAIL, None
            else:
                state, value = TrialState.RUNNING, None
            try:
                params = {n: _into(dists[n], result.parameters[n]) for n in dists}
                made = create_trial(params=params, distributions=dists, value=value, state=state)
            except ValueError:
                continue  # a value the space cannot hold (edited by hand): nothing to learn
            study.add_trial(made)
        asked = study.ask(dists)
    expressions = {p.name: p.expression for p in searched.parameters}
    return {name: expressions[name].from_search(asked.params[name]) for name in searched.names()}
