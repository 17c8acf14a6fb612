"""A Sweep's spec compiled for the sweeps core, and each trial's parameters under its
sampling: one copy for the Sweep controller (``controller.sweeps``) and local mode
(``local.sweeps``).

:func:`compile_spec` reads the spec as the sweeps core does (the search space, the
sampling and how many trials it makes, the policy, the goal, the seed), :class:`Invalid`
naming the field it refuses; :func:`parameters` is trial n's parameters: random and grid
from (seed, n), bayesian from the book of trials before it too (``tuning.bayesian``).
Pure; tested through tests/unit/controller/test_sweeps.py and tests/unit/local/test_sweeps.py.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from torchyard import api
from torchyard.sweeps import sampling, space, stopping, trials
from torchyard.tuning import bayesian


class Invalid(ValueError):
    """A spec the sweeps core cannot run; the message names the field."""


@dataclass(frozen=True)
class Compiled:
    """The spec as the sweeps core reads it."""

    space: space.SearchSpace
    sampling: sampling.Sampling
    planned: int
    seed: int
    goal: stopping.Goal
    policy: stopping.Policy | None
    hints: tuple[str, ...] = ()  # valid but likely mistaken (space.hints)


def seed_of(sweep: api.Sweep) -> int:
    """``spec.seed``, else one derived from the Sweep's uid (stable for its lifetime)."""
    if sweep.spec.seed is not None:
        return sweep.spec.seed
    return int.from_bytes(hashlib.sha256(sweep.uid.encode()).digest()[:6], "big")


def compile_spec(sweep: api.Sweep, parameters: Any) -> Compiled:
    """The spec as the sweeps core reads it; :class:`Invalid` names what it refuses.
    ``parameters`` is the body's own ``spec.parameters`` (an integer stays an integer)."""
    spec = sweep.spec
    try:
        searched = space.parse_space(parameters, "spec.parameters")
        planned = sampling.check(spec.sampling, searched, spec.max_total_trials)
        goal = stopping.parse_goal(spec.objective.goal, "spec.objective.goal")
        policy = None
        if spec.early_termination is not None:
            policy = stopping.parse_policy(
                spec.early_termination.policy_dict(), "spec.earlyTermination"
            )
    except space.SpaceError as err:
        raise Invalid(str(err)) from None
    except (sampling.SamplingError, stopping.PolicyError) as err:
        field, _, message = str(err).partition(": ")
        where = field if field.startswith("spec.") else f"spec.{field}"
        raise Invalid(f"{where}: {message}") from None
    chosen = next(s for s in sampling.SAMPLINGS if s == spec.sampling)
    hints = tuple(str(h) for h in space.hints(searched, "spec.parameters"))
    return Compiled(searched, chosen, planned, seed_of(sweep), goal, policy, hints)


def parameters(
    compiled: Compiled, index: int, book: trials.Book | None = None
) -> dict[str, space.Value]:
    """Trial ``index``'s parameters: random and grid from (seed, index); bayesian from the
    book's trials before it too (a trial once made keeps the parameters its TrainingRun
    and the ledger record, so this is asked only when a trial is made)."""
    if compiled.sampling != "bayesian":
        return sampling.trial_parameters(compiled.sampling, compiled.space, compiled.seed, index)
    if book is None:  # a trial whose annotation and ledger entry are both gone: unknown
        return {}
    before = [r for r in book.trials if r.index < index]
    return bayesian.suggest(
        compiled.space, compiled.goal, compiled.seed, index, [_result(r) for r in before]
    )


def _result(record: trials.TrialRecord) -> bayesian.Result:
    failed = record.state in (trials.TrialState.FAILED, trials.TrialState.CANCELED)
    return bayesian.Result(record.params(), record.best, record.state in trials.ENDED, failed)
