"""Early termination: from the metrics the trials report, which running trial continues,
stops or pauses, and which paused trial is promoted (resumed from its checkpoint).

Four policies, each a frozen dataclass read from the Sweep's ``spec.earlyTermination``
(:func:`parse_policy`) and a goal (``maximize``/``minimize``, :func:`parse_goal`); every
call returns a :class:`Decision` per trial with the reason in words. The Sweep controller
and local mode call them when a trial reports its primary metric and act on the decision
(stop: delete the trial; pause: suspend it with a checkpoint, freeing its GPUs; promote:
re-admit it, resuming from that checkpoint). Pure: no clock, no randomness but sha256.

Azure ML's interval policies, :func:`evaluate` (an interval is one report of the primary
metric, as in Azure ML; a policy applies at every ``evaluationInterval``-th interval that is
at least ``delayEvaluation``; a trial at interval N is compared with every trial that
reported N intervals or more, over their first N intervals only):

- ``bandit``: stop the trial when its best metric by interval N is not within the slack of
  the best any trial had by N: below best / (1 + slackFactor), or best - slackAmount, when
  maximizing (Azure ML's how-to-tune-hyperparameters page: "any training jobs whose best
  metric at interval 10 is less than 0.66 (0.8/(1+slack_factor)) will be terminated");
  above best * (1 + slackFactor), or best + slackAmount, when minimizing.
- ``median``: stop the trial when its best metric by interval N is worse than the median
  (the middle value, or the mean of the two middle values) of the running averages over
  intervals 1..N of all those trials (Azure ML's MedianStoppingPolicy).
- ``truncation``: stop the trial when it is among the lowest ``truncationPercentage`` % of
  those trials by their best metric by N (TruncationSelectionPolicy): of n trials,
  k = floor(n * percentage / 100) are cut, so a trial stops when at least n - k trials did
  strictly better (tied trials are kept together).

A report that is not a finite number (a diverged loss) counts as the worst value there is.

``asha``, asynchronous successive halving (Li et al. 2018, "A System for Massively Parallel
Hyperparameter Tuning"), decided as Ray Tune's ``AsyncHyperBandScheduler`` decides
(ray-project/ray, python/ray/tune/schedulers/async_hyperband.py, ``_Bracket.on_result``
and ``_Bracket.cutoff``): rungs at ``minResource * reductionFactor**(k + s)`` for bracket
s; a trial reaching a rung is compared with the trials recorded at that rung so far, and
goes on only if its metric is not below their (1 - 1/reductionFactor) quantile (numpy's
linear percentile); then it is recorded there. Where Ray stops the trial, ASHA here
pauses it with its checkpoint (:func:`asha_report`), and :func:`asha_promotions` promotes
a paused trial once the same rule, over the trials recorded at its rung since, would let
it go on: a promotion costs no retraining. State is the rungs (:class:`AshaState`,
bounded: one value per trial per rung), kept by the caller.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, TypeAlias

from torchyard.sweeps.sampling import uniform01


class PolicyError(ValueError):
    """A policy or goal that cannot be used; ``field`` is the spec field at fault."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class Goal(str, Enum):
    MAXIMIZE = "maximize"
    MINIMIZE = "minimize"


class Action(str, Enum):
    CONTINUE = "continue"
    STOP = "stop"
    PAUSE = "pause"
    PROMOTE = "promote"


@dataclass(frozen=True)
class Decision:
    """What to do with one trial, why, and at which interval (or ASHA resource)."""

    trial: int
    action: Action
    reason: str
    at: float | None = None


def _integer(field: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyError(field, f"must be an integer, got {value!r}")
    if value < least:
        raise PolicyError(field, f"must be at least {least}, got {value}")
    return value


def _number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PolicyError(field, f"must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Bandit:
    """Azure ML's BanditPolicy: exactly one of ``slack_factor`` and ``slack_amount``."""

    slack_factor: float | None = None
    slack_amount: float | None = None
    evaluation_interval: int = 1
    delay_evaluation: int = 0

    TYPE = "bandit"

    def __post_init__(self) -> None:
        if (self.slack_factor is None) == (self.slack_amount is None):
            raise PolicyError("slackFactor", "give exactly one of slackFactor and slackAmount")
        for field, value in (
            ("slackFactor", self.slack_factor),
            ("slackAmount", self.slack_amount),
        ):
            if value is not None and _number(field, value) < 0:
                raise PolicyError(field, f"must be at least 0, got {value!r}")
        _integer("evaluationInterval", self.evaluation_interval, 1)
        _integer("delayEvaluation", self.delay_evaluation, 0)


@dataclass(frozen=True)
class Median:
    """Azure ML's MedianStoppingPolicy."""

    evaluation_interval: int = 1
    delay_evaluation: int = 0

    TYPE = "median"

    def __post_init__(self) -> None:
        _integer("evaluationInterval", self.evaluation_interval, 1)
        _integer("delayEvaluation", self.delay_evaluation, 0)


@dataclass(frozen=True)
class Truncation:
    """Azure ML's TruncationSelectionPolicy."""

    truncation_percentage: int
    evaluation_interval: int = 1
    delay_evaluation: int = 0

    TYPE = "truncation"

    def __post_init__(self) -> None:
        pct = _integer("truncationPercentage", self.truncation_percentage, 1)
        if pct > 99:
            raise PolicyError("truncationPercentage", f"must be at most 99, got {pct}")
        _integer("evaluationInterval", self.evaluation_interval, 1)
        _integer("delayEvaluation", self.delay_evaluation, 0)


@dataclass(frozen=True)
class Asha:
    """Asynchronous successive halving with pause and promote (Ray Tune's ``grace_period``
    is ``min_resource``, ``max_t`` is ``max_resource``)."""

    max_resource: float
    min_resource: float = 1
    reduction_factor: float = 3
    brackets: int = 1

    TYPE = "asha"

    def __post_init__(self) -> None:
        low = _number("minResource", self.min_resource)
        high = _number("maxResource", self.max_resource)
        eta = _number("reductionFactor", self.reduction_factor)
        if low <= 0:
            raise PolicyError("minResource", f"must be greater than 0, got {low!r}")
        if high < low:
            raise PolicyError("maxResource", f"must be at least minResource {low!r}, got {high!r}")
        if eta <= 1:
            raise PolicyError("reductionFactor", f"must be greater than 1, got {eta!r}")
        _integer("brackets", self.brackets, 1)
        if self.brackets > len(asha_milestones(self, 0)):
            raise PolicyError(
                "brackets",
                f"{self.brackets} brackets, but minResource {low:g} to maxResource {high:g} "
                f"by reductionFactor {eta:g} has {len(asha_milestones(self, 0))} rungs",
            )


Policy: TypeAlias = Bandit | Median | Truncation | Asha
IntervalPolicy: TypeAlias = Bandit | Median | Truncation

_FIELDS: dict[str, tuple[type[Any], dict[str, str]]] = {
    "bandit": (
        Bandit,
        {
            "slackFactor": "slack_factor",
            "slackAmount": "slack_amount",
            "evaluationInterval": "evaluation_interval",
            "delayEvaluation": "delay_evaluation",
        },
    ),
    "median": (
        Median,
        {"evaluationInterval": "evaluation_interval", "delayEvaluation": "delay_evaluation"},
    ),
    "truncation": (
        Truncation,
        {
            "truncationPercentage": "truncation_percentage",
            "evaluationInterval": "evaluation_interval",
            "delayEvaluation": "delay_evaluation",
        },
    ),
    "asha": (
        Asha,
        {
            "minResource": "min_resource",
            "maxResource": "max_resource",
            "reductionFactor": "reduction_factor",
            "brackets": "brackets",
        },
    ),
}


def parse_policy(obj: Any, field: str = "earlyTermination") -> Policy:
    """A policy from its JSON form, e.g. ``{"type": "bandit", "slackFactor": 0.15,
    "evaluationInterval": 1, "delayEvaluation": 10}`` or ``{"type": "asha",
    "maxResource": 81, "reductionFactor": 3}``; :class:`PolicyError` names the field."""
    if not isinstance(obj, Mapping):
        raise PolicyError(
            field, f'must be an object such as {{"type": "bandit", ...}}, got {obj!r}'
        )
    kind = obj.get("type")
    if kind not in _FIELDS:
        raise PolicyError(f"{field}.type", f"must be one of {', '.join(_FIELDS)}; got {kind!r}")
    cls, names = _FIELDS[kind]
    unknown = sorted(str(k) for k in obj if k != "type" and k not in names)
    if unknown:
        raise PolicyError(
            f"{field}.{unknown[0]}", f"is not a field of {kind} (its fields: {', '.join(names)})"
        )
    try:
        policy: Policy = cls(**{names[k]: v for k, v in obj.items() if k != "type"})
    except PolicyError as e:
        raise PolicyError(f"{field}.{e.field}", str(e).split(": ", 1)[1]) from None
    except TypeError:  # a required field is missing
        required = "maxResource" if cls is Asha else "truncationPercentage"
        raise PolicyError(f"{field}.{required}", f"is required by {kind}") from None
    return policy


def parse_goal(value: Any, field: str = "objective.goal") -> Goal:
    """``maximize`` or ``minimize`` (any case, as Azure ML's ``Maximize``)."""
    if isinstance(value, Goal):
        return value
    if isinstance(value, str) and value.lower() in ("maximize", "minimize"):
        return Goal(value.lower())
    raise PolicyError(field, f"must be maximize or minimize, got {value!r}")


# -- the metric, as the policies compare it --------------------------------------------


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _score(goal: Goal, value: float | None) -> float:
    """Higher is better: the metric, negated when minimizing; -inf for no finite number."""
    if value is None or not math.isfinite(value):
        return -math.inf
    return value if goal is Goal.MAXIMIZE else -value


def _scores(goal: Goal, values: Sequence[float | None]) -> list[float]:
    """:func:`_score` of each value (one comprehension: policies call it per trial per
    report)."""
    sign = 1.0 if goal is Goal.MAXIMIZE else -1.0
    inf = math.inf
    return [sign * v if v is not None and -inf < v < inf else -inf for v in values]


def _unscore(goal: Goal, score: float) -> float:
    return score if goal is Goal.MAXIMIZE else -score


def _show(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "no finite number"
    return f"{value:.6g}"


# -- bandit, median, truncation -------------------------------------------------------


def _schedule(policy: IntervalPolicy) -> str:
    return f"every {policy.evaluation_interval} from interval {max(policy.delay_evaluation, 1)}"


def is_evaluation_interval(policy: IntervalPolicy, interval: int) -> bool:
    """Whether the policy applies at ``interval`` (1 for the first report)."""
    return (
        interval >= 1
        and interval % policy.evaluation_interval == 0
        and interval >= policy.delay_evaluation
    )


def evaluate(
    policy: IntervalPolicy,
    goal: Goal,
    histories: Mapping[int, Sequence[float | None]],
    trial: int,
) -> Decision:
    """The decision for ``trial`` at its latest interval N = ``len(histories[trial])``.
    ``histories`` holds every trial's metric per interval (running or ended: all are
    compared with); a trial not at an evaluation interval continues."""
    if isinstance(policy, Asha):
        raise TypeError("asha decides per rung: call asha_report")
    n = len(histories[trial])
    if not is_evaluation_interval(policy, n):
        return Decision(
            trial,
            Action.CONTINUE,
            f"interval {n} is not an evaluation interval ({_schedule(policy)})",
            n,
        )
    peers = {t: h[:n] for t, h in histories.items() if len(h) >= n}
    if isinstance(policy, Bandit):
        return _bandit(policy, goal, peers, trial, n)
    if isinstance(policy, Median):
        return _median(goal, peers, trial, n)
    return _truncation(policy, goal, peers, trial, n)


def evaluate_all(
    policy: IntervalPolicy,
    goal: Goal,
    histories: Mapping[int, Sequence[float | None]],
    running: Iterable[int],
) -> list[Decision]:
    """:func:`evaluate` for each running trial, in index order."""
    return [evaluate(policy, goal, histories, t) for t in sorted(running)]


def _bandit(
    policy: Bandit, goal: Goal, peers: Mapping[int, Sequence[float | None]], trial: int, n: int
) -> Decision:
    bests = {t: max(_scores(goal, h)) for t, h in peers.items()}
    top = max(bests.values())
    if top == -math.inf:
        return Decision(trial, Action.CONTINUE, f"no trial has a finite metric by interval {n}", n)
    leader = min(t for t, s in bests.items() if s == top)
    best = _unscore(goal, top)
    maximize = goal is Goal.MAXIMIZE
    if policy.slack_factor is not None:
        sf = policy.slack_factor
        limit = best / (1 + sf) if maximize else best * (1 + sf)
        how = f"{'/' if maximize else '*'} (1 + slack factor {sf:g})"
    else:
        sa = policy.slack_amount or 0.0
        limit = best - sa if maximize else best + sa
        how = f"{'-' if maximize else '+'} slack amount {sa:g}"
    mine = _unscore(goal, bests[trial]) if bests[trial] > -math.inf else None
    bound = f"{_show(limit)} (the best by interval {n}, {_show(best)} of trial {leader}, {how})"
    if mine is None:
        return Decision(
            trial,
            Action.STOP,
            f"reported no finite metric by interval {n}; the bound is {bound}",
            n,
        )
    if (mine < limit) if maximize else (mine > limit):
        word = "below" if maximize else "above"
        return Decision(
            trial, Action.STOP, f"its best by interval {n}, {_show(mine)}, is {word} {bound}", n
        )
    return Decision(
        trial, Action.CONTINUE, f"its best by interval {n}, {_show(mine)}, is within {bound}", n
    )


def _median(
    goal: Goal, peers: Mapping[int, Sequence[float | None]], trial: int, n: int
) -> Decision:
    averages = [math.fsum(_scores(goal, h)) / n for h in peers.values()]
    median = statistics.median(averages)
    mine = max(_scores(goal, peers[trial]))
    words = (
        f"the median {_show(_unscore(goal, median))} of the running averages over intervals "
        f"1..{n} of the {len(averages)} trials that reached it"
    )
    if mine < median:
        return Decision(
            trial,
            Action.STOP,
            f"its best by interval {n}, {_show(_unscore(goal, mine))}, is worse than {words}",
            n,
        )
    return Decision(
        trial,
        Action.CONTINUE,
        f"its best by interval {n}, {_show(_unscore(goal, mine))}, is not worse than {words}",
        n,
    )


def _truncation(
    policy: Truncation,
    goal: Goal,
    peers: Mapping[int, Sequence[float | None]],
    trial: int,
    n: int,
) -> Decision:
    bests = {t: max(_scores(goal, h)) for t, h in peers.items()}
    count = len(bests)
    cut = count * policy.truncation_percentage // 100
    better = sum(1 for s in bests.values() if s > bests[trial])
    mine = _show(_unscore(goal, bests[trial]))
    where = (
        f"{better} of the {count} trials that reached interval {n} did better than its "
        f"{mine}; the lowest {policy.truncation_percentage} % is {cut} trial(s)"
    )
    if cut >= 1 and better >= count - cut:
        return Decision(trial, Action.STOP, where, n)
    return Decision(trial, Action.CONTINUE, where, n)


# -- asha ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rung:
    """One rung of a bracket: its milestone (resource) and the trials recorded there, in
    the order they reached it, each with its score (the metric, negated when minimizing,
    as Ray's ``metric_op``)."""

    milestone: float
    recorded: tuple[tuple[int, float], ...] = ()

    def has(self, trial: int) -> bool:
        return any(t == trial for t, _ in self.recorded)


@dataclass(frozen=True)
class AshaState:
    """Every bracket's rungs, highest milestone first (as Ray keeps them)."""

    brackets: tuple[tuple[Rung, ...], ...]


def asha_milestones(policy: Asha, bracket: int) -> tuple[float, ...]:
    """Bracket ``bracket``'s rungs, highest first: Ray's ``_Bracket.__init__``,
    ``MAX_RUNGS = int(log(max_t / min_t) / log(rf) - s + 1)`` rungs at
    ``min_t * rf ** (k + s)``."""
    rf = policy.reduction_factor
    count = int(math.log(policy.max_resource / policy.min_resource) / math.log(rf) - bracket + 1)
    return tuple(policy.min_resource * rf ** (k + bracket) for k in reversed(range(count)))


def asha_start(policy: Asha) -> AshaState:
    """No trial recorded anywhere yet."""
    return AshaState(
        tuple(tuple(Rung(m) for m in asha_milestones(policy, s)) for s in range(policy.brackets))
    )


def asha_bracket(policy: Asha, seed: int, trial: int) -> int:
    """The bracket of ``trial``: Ray's softmax over the brackets' rung counts
    (``on_trial_add``), drawn from sha256 of (seed, trial) rather than numpy's global
    generator, so the same trial lands in the same bracket after a restart."""
    sizes = [len(asha_milestones(policy, s)) for s in range(policy.brackets)]
    weights = [math.exp(size - max(sizes)) for size in sizes]
    u = uniform01(seed, trial, "\x00asha-bracket", 0) * math.fsum(weights)
    for s, weight in enumerate(weights):
        u -= weight
        if u < 0:
            return s
    return len(weights) - 1


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


def cutoff(scores: Sequence[float], reduction_factor: float) -> float | None:
    """Ray's ``_Bracket.cutoff``: the (1 - 1/rf) percentile of the scores recorded at a
    rung (``np.nanpercentile``: NaN left out; none here, non-finite values are never
    recorded), None for an empty rung."""
    if not scores:
        return None
    return percentile(scores, (1 - 1 / reduction_factor) * 100)


def asha_report(
    policy: Asha,
    goal: Goal,
    state: AshaState,
    trial: int,
    resource: float,
    value: float | None,
    bracket: int = 0,
) -> tuple[AshaState, Decision]:
    """A trial of ``bracket`` reported ``value`` at ``resource`` (its epochs, intervals):
    the rungs with it recorded, and CONTINUE, PAUSE (where Ray stops), or STOP (it
    reached ``max_resource``, as Ray's ``stop_last_trials``; or the value is not a finite
    number, which Ray would record as NaN and let go on)."""
    if resource >= policy.max_resource:
        return state, Decision(
            trial,
            Action.STOP,
            f"reached maxResource {policy.max_resource:g} (at {resource:g}): done",
            resource,
        )
    if not _finite(value):
        return state, Decision(
            trial, Action.STOP, f"reported {value!r} at {resource:g}, not a finite number", resource
        )
    assert value is not None
    score = _score(goal, value)
    rungs = state.brackets[bracket]
    eta = policy.reduction_factor
    # Ray's _Bracket.on_result: the highest rung the trial reached and is not recorded in
    # (rungs are highest first; a trial recorded there already goes on to lower ones)
    for i, rung in enumerate(rungs):
        if resource < rung.milestone or rung.has(trial):
            continue
        cut = cutoff([s for _, s in rung.recorded], eta)
        recorded = replace(rung, recorded=(*rung.recorded, (trial, score)))
        bracket_rungs = (*rungs[:i], recorded, *rungs[i + 1 :])
        brackets = (
            *state.brackets[:bracket],
            bracket_rungs,
            *state.brackets[bracket + 1 :],
        )
        where = f"rung {rung.milestone:g}"
        if cut is None:
            decision = Decision(
                trial,
                Action.CONTINUE,
                f"first trial recorded at {where}: {_show(value)} sets the bar",
                resource,
            )
        elif score < cut:
            decision = Decision(
                trial,
                Action.PAUSE,
                f"at {where} its {_show(value)} is {'below' if goal is Goal.MAXIMIZE else 'above'}"
                f" the cutoff {_show(_unscore(goal, cut))} (the top 1/{eta:g} of the "
                f"{len(rung.recorded)} trial(s) recorded there): paused with its checkpoint, "
                "promoted should later trials do worse",
                resource,
            )
        else:
            decision = Decision(
                trial,
                Action.CONTINUE,
                f"at {where} its {_show(value)} is within the top 1/{eta:g} of the "
                f"{len(rung.recorded)} trial(s) recorded there (cutoff "
                f"{_show(_unscore(goal, cut))})",
                resource,
            )
        return AshaState(brackets), decision
    return state, Decision(trial, Action.CONTINUE, f"no new rung at {resource:g}", resource)


def asha_promotions(
    policy: Asha, goal: Goal, state: AshaState, paused: Collection[int]
) -> list[Decision]:
    """The paused trials to promote now, best first (highest rung, then best metric, then
    lowest index): those whose value at their highest rung is no longer below the cutoff of
    the other trials recorded there. The caller resumes as many as it has slots for."""
    eta = policy.reduction_factor
    found: list[tuple[float, float, int, Decision]] = []
    seen: set[int] = set()
    for rungs in state.brackets:
        for rung in rungs:
            for trial, score in rung.recorded:
                if trial not in paused or trial in seen:
                    continue
                seen.add(trial)
                others = [s for t, s in rung.recorded if t != trial]
                cut = cutoff(others, eta)
                if cut is not None and score < cut:
                    continue
                value = _show(_unscore(goal, score))
                bar = "no other trial" if cut is None else f"cutoff {_show(_unscore(goal, cut))}"
                reason = (
                    f"at rung {rung.milestone:g} its {value} is now within the top 1/{eta:g} of "
                    f"the {len(rung.recorded)} trials recorded there ({bar}): resume from its "
                    "checkpoint"
                )
                found.append(
                    (
                        -rung.milestone,
                        -score,
                        trial,
                        Decision(trial, Action.PROMOTE, reason, rung.milestone),
                    )
                )
    return [d for *_, d in sorted(found, key=lambda f: f[:3])]
