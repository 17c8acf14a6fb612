"""``earlyTermination.type: asha``, asynchronous successive halving (Li et al. 2018, "A
System for Massively Parallel Hyperparameter Tuning"), decided as Ray Tune's
``AsyncHyperBandScheduler`` decides (ray-project/ray,
python/ray/tune/schedulers/async_hyperband.py, ``_Bracket.on_result`` and
``_Bracket.cutoff``): rungs at ``minResource * reductionFactor**(k + s)`` for bracket s; a
trial reaching a rung is compared with the trials recorded at that rung so far, and goes
on only if its metric is not below their (1 - 1/reductionFactor) quantile (numpy's linear
percentile); then it is recorded there. Where Ray stops the trial, ASHA here pauses it
with its checkpoint (:meth:`Asha.report`), and :meth:`Asha.promotions` promotes a paused trial once
the same rule, over the trials recorded at its rung since, would let it go on: a promotion
costs no retraining. State is the rungs (``Rungs``, bounded: one value per trial per rung),
kept by the caller.

Registered by ``sweeps.policies``; tested in tests/unit/sweeps/test_asha.py.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from torchyard.sweeps.policies.base import (
    Action,
    Decision,
    Field,
    Goal,
    PausingPolicy,
    PolicyError,
    Rung,
    Rungs,
    check_integer,
    check_number,
    finite,
    only,
    required,
    score,
    show,
    unscore,
)
from torchyard.sweeps.sampling import uniform01
from torchyard.variants import Rule

MAX_RESOURCE = Field(
    "maxResource",
    "max_resource",
    integer=False,
    description="asha: the intervals a trial runs at most (its epochs); rungs at "
    "minResource x reductionFactor^k below it.",
    minimum=1,
    required=True,
)
MIN_RESOURCE = Field(
    "minResource",
    "min_resource",
    integer=False,
    description="asha: the first rung (default 1 interval).",
    minimum=1,
)
REDUCTION_FACTOR = Field(
    "reductionFactor",
    "reduction_factor",
    integer=False,
    description="asha: 1/reductionFactor of the trials at a rung go on (default 3; greater "
    "than 1).",
    minimum=1,
)
BRACKETS = Field(
    "brackets",
    "brackets",
    integer=True,
    description="asha: the number of brackets (default 1).",
    minimum=1,
    maximum=10,
)


@dataclass(frozen=True)
class Asha(PausingPolicy):
    """Asynchronous successive halving with pause and promote (Ray Tune's ``grace_period``
    is ``min_resource``, ``max_t`` is ``max_resource``)."""

    max_resource: float
    min_resource: float = 1
    reduction_factor: float = 3
    brackets: int = 1

    TYPE = "asha"
    SUMMARY = (
        "asynchronous successive halving, which pauses a trial below the top "
        "1/reductionFactor at a rung with its checkpoint (suspended) and promotes it "
        "(resumed from the checkpoint) should later trials do worse"
    )
    FIELDS = (MAX_RESOURCE, MIN_RESOURCE, REDUCTION_FACTOR, BRACKETS)
    RULES = (
        required("asha", MAX_RESOURCE),
        only("asha", MIN_RESOURCE, REDUCTION_FACTOR, BRACKETS),
        Rule(
            {
                "rule": "self.type != 'asha' || "
                "(self.evaluationInterval == 1 && self.delayEvaluation == 0)",
                "message": "asha decides at its rungs (minResource x reductionFactor^k "
                "intervals): evaluationInterval and delayEvaluation are not fields of asha",
                "fieldPath": ".evaluationInterval",
            },
            lambda m: m.type != "asha" or (m.evaluation_interval, m.delay_evaluation) == (1, 0),
        ),
        Rule(
            {
                "rule": "!has(self.reductionFactor) || self.reductionFactor > 1.0",
                "message": "reductionFactor must be greater than 1",
                "fieldPath": ".reductionFactor",
            },
            lambda m: m.reduction_factor is None or m.reduction_factor > 1,
        ),
    )
    SPEC_RULES = (
        Rule(
            {
                "rule": "!has(self.earlyTermination) || self.earlyTermination.type != 'asha' || "
                "(has(self.trial.checkpoints) && has(self.trial.checkpoints.size))",
                "message": "asha pauses a trial with its checkpoint and resumes it from there: "
                "spec.trial.checkpoints.size is required (each trial's own claim; one "
                "claimName shared by the trials would resume a trial from another's "
                "checkpoint)",
                "fieldPath": ".trial.checkpoints",
            },
            lambda spec: (
                spec.early_termination is None
                or spec.early_termination.type != "asha"
                or (spec.trial.checkpoints is not None and spec.trial.checkpoints.size is not None)
            ),
        ),
    )

    def __post_init__(self) -> None:
        low = check_number("minResource", self.min_resource)
        high = check_number("maxResource", self.max_resource)
        eta = check_number("reductionFactor", self.reduction_factor)
        if low <= 0:
            raise PolicyError("minResource", f"must be greater than 0, got {low!r}")
        if high < low:
            raise PolicyError("maxResource", f"must be at least minResource {low!r}, got {high!r}")
        if eta <= 1:
            raise PolicyError("reductionFactor", f"must be greater than 1, got {eta!r}")
        check_integer("brackets", self.brackets, 1)
        if self.brackets > len(milestones(self, 0)):
            raise PolicyError(
                "brackets",
                f"{self.brackets} brackets, but minResource {low:g} to maxResource {high:g} "
                f"by reductionFactor {eta:g} has {len(milestones(self, 0))} rungs",
            )

    def start(self) -> Rungs:
        """No trial recorded anywhere yet."""
        return Rungs(
            tuple(tuple(Rung(m) for m in milestones(self, s)) for s in range(self.brackets))
        )

    def bracket(self, seed: int, trial: int) -> int:
        """The bracket of ``trial``: Ray's softmax over the brackets' rung counts
        (``on_trial_add``), drawn from sha256 of (seed, trial) rather than numpy's global
        generator, so the same trial lands in the same bracket after a restart."""
        sizes = [len(milestones(self, s)) for s in range(self.brackets)]
        weights = [math.exp(size - max(sizes)) for size in sizes]
        u = uniform01(seed, trial, "\x00asha-bracket", 0) * math.fsum(weights)
        for s, weight in enumerate(weights):
            u -= weight
            if u < 0:
                return s
        return len(weights) - 1

    def runs_to_end(self, resource: float) -> bool:
        return resource >= self.max_resource

    def report(
        self,
        goal: Goal,
        before: Rungs,
        trial: int,
        resource: float,
        value: float | None,
        bracket: int = 0,
    ) -> tuple[Rungs, Decision]:
        """A trial of ``bracket`` reported ``value`` at ``resource`` (its epochs, intervals):
        the rungs (``before`` it) with it recorded, and CONTINUE, PAUSE (where Ray stops), or
        STOP (it reached ``max_resource``, as Ray's ``stop_last_trials``; or the value is not
        a finite number, which Ray would record as NaN and let go on)."""
        if resource >= self.max_resource:
            return before, Decision(
                trial,
                Action.STOP,
                f"reached maxResource {self.max_resource:g} (at {resource:g}): done",
                resource,
            )
        if not finite(value):
            return before, Decision(
                trial,
                Action.STOP,
                f"reported {value!r} at {resource:g}, not a finite number",
                resource,
            )
        assert value is not None
        mine = score(goal, value)
        rungs = before.brackets[bracket]
        eta = self.reduction_factor
        # Ray's _Bracket.on_result: the highest rung the trial reached and is not recorded in
        # (rungs are highest first; a trial recorded there already goes on to lower ones)
        for i, rung in enumerate(rungs):
            if resource < rung.milestone or rung.has(trial):
                continue
            cut = cutoff([s for _, s in rung.recorded], eta)
            recorded = replace(rung, recorded=(*rung.recorded, (trial, mine)))
            bracket_rungs = (*rungs[:i], recorded, *rungs[i + 1 :])
            brackets = (
                *before.brackets[:bracket],
                bracket_rungs,
                *before.brackets[bracket + 1 :],
            )
            where = f"rung {rung.milestone:g}"
            if cut is None:
                decision = Decision(
                    trial,
                    Action.CONTINUE,
                    f"first trial recorded at {where}: {show(value)} sets the bar",
                    resource,
                )
            elif mine < cut:
                decision = Decision(
                    trial,
                    Action.PAUSE,
                    f"at {where} its {show(value)} is "
                    f"{'below' if goal is Goal.MAXIMIZE else 'above'} the cutoff "
                    f"{show(unscore(goal, cut))} (the top 1/{eta:g} of the "
                    f"{len(rung.recorded)} trial(s) recorded there): paused with its checkpoint, "
                    "promoted should later trials do worse",
                    resource,
                )
            else:
                decision = Decision(
                    trial,
                    Action.CONTINUE,
                    f"at {where} its {show(value)} is within the top 1/{eta:g} of the "
                    f"{len(rung.recorded)} trial(s) recorded there (cutoff "
                    f"{show(unscore(goal, cut))})",
                    resource,
                )
            return Rungs(brackets), decision
        return before, Decision(trial, Action.CONTINUE, f"no new rung at {resource:g}", resource)

    def promotions(self, goal: Goal, state: Rungs, paused: Collection[int]) -> list[Decision]:
        """The paused trials to promote now, best first (highest rung, then best metric, then
        lowest index): those whose value at their highest rung is no longer below the cutoff of
        the other trials recorded there. The caller resumes as many as it has slots for."""
        eta = self.reduction_factor
        found: list[tuple[float, float, int, Decision]] = []
        seen: set[int] = set()
        for rungs in state.brackets:
            for rung in rungs:
                for trial, value in rung.recorded:
                    if trial not in paused or trial in seen:
                        continue
                    seen.add(trial)
                    others = [s for t, s in rung.recorded if t != trial]
                    cut = cutoff(others, eta)
                    if cut is not None and value < cut:
                        continue
                    shown = show(unscore(goal, value))
                    bar = "no other trial" if cut is None else f"cutoff {show(unscore(goal, cut))}"
                    reason = (
                        f"at rung {rung.milestone:g} its {shown} is now within the top 1/{eta:g} "
                        f"of the {len(rung.recorded)} trials recorded there ({bar}): resume from "
                        "its checkpoint"
                    )
                    found.append(
                        (
                            -rung.milestone,
                            -value,
                            trial,
                            Decision(trial, Action.PROMOTE, reason, rung.milestone),
                        )
                    )
        return [d for *_, d in sorted(found, key=lambda f: f[:3])]


def milestones(policy: Asha, bracket: int) -> tuple[float, ...]:
    """Bracket ``bracket``'s rungs, highest first: Ray's ``_Bracket.__init__``,
    ``MAX_RUNGS = int(log(max_t / min_t) / log(rf) - s + 1)`` rungs at
    ``min_t * rf ** (k + s)``."""
    rf = policy.reduction_factor
    count = int(math.log(policy.max_resource / policy.min_resource) / math.log(rf) - bracket + 1)
    return tuple(policy.min_resource * rf ** (k + bracket) for k in reversed(range(count)))


def percentile(values: Sequence[float], q: float) -> float:
    """``numpy.percentile(values, q)`` (the default, linear method), in the same floating
    point steps: virtual index (n - 1) * (q / 100), then numpy's ``_lerp``."""
    xs = sorted(values)
    virtual = (len(xs) - 1) * (q / 100)
    below = math.floor(virtual)
    above = min(below + 1, len(xs) - 1)
    gamma = virtual - below
    a, b = xs[below], xs[above]
    diff = b - a
    if gamma >= 0.5:
        return b - diff * (1 - gamma)
    return a + diff * gamma


def cutoff(recorded: Sequence[float], reduction_factor: float) -> float | None:
    """Ray's ``_Bracket.cutoff``: the (1 - 1/rf) percentile of the scores recorded at a
    rung (``np.nanpercentile``: NaN left out; none here, non-finite values are never
    recorded), None for an empty rung."""
    if not recorded:
        return None
    return percentile(recorded, (1 - 1 / reduction_factor) * 100)
