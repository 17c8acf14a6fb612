"""Early termination: from the metrics the trials report, which running trial continues,
stops or pauses, and which paused trial is promoted (resumed from its checkpoint).

The policies are registered variants (``sweeps.policies``: bandit, median, truncation,
asha, one module each); this module reads one from the Sweep's ``spec.earlyTermination``
(:func:`parse_policy`, through the registry) and a goal (``maximize``/``minimize``,
:func:`parse_goal`), and judges the interval policies (:func:`evaluate`: an interval is one
report of the primary metric, as in Azure ML; a policy applies at every
``evaluationInterval``-th interval that is at least ``delayEvaluation``; a trial at
interval N is compared with every trial that reported N intervals or more, over their
first N intervals only, by the policy's ``decide``). A pausing policy (asha) is judged by
``tuning.sweep_policy`` through its own callbacks. Every call returns a :class:`Decision`
per trial with the reason in words. The Sweep controller and local mode call them when a
trial reports its primary metric and act on the decision (stop: delete the trial; pause:
suspend it with a checkpoint, freeing its GPUs; promote: re-admit it, resuming from that
checkpoint). A report that is not a finite number (a diverged loss) counts as the worst
value there is. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from torchyard.sweeps import policies
from torchyard.sweeps.policies import (
    Action,
    Decision,
    Goal,
    IntervalPolicy,
    PausingPolicy,
    Policy,
    PolicyError,
)


def parse_policy(obj: Any, field: str = "earlyTermination") -> Policy:
    """A policy from its JSON form, e.g. ``{"type": "bandit", "slackFactor": 0.15,
    "evaluationInterval": 1, "delayEvaluation": 10}`` or ``{"type": "asha",
    "maxResource": 81, "reductionFactor": 3}``; :class:`PolicyError` names the field."""
    if not isinstance(obj, Mapping):
        raise PolicyError(
            field, f'must be an object such as {{"type": "bandit", ...}}, got {obj!r}'
        )
    kind = obj.get("type")
    if not isinstance(kind, str) or kind not in policies.names():
        raise PolicyError(
            f"{field}.type", f"must be one of {', '.join(policies.names())}; got {kind!r}"
        )
    return policies.get(kind).from_json(obj, field)


def parse_goal(value: Any, field: str = "objective.goal") -> Goal:
    """``maximize`` or ``minimize`` (any case, as Azure ML's ``Maximize``)."""
    if isinstance(value, Goal):
        return value
    if isinstance(value, str) and value.lower() in ("maximize", "minimize"):
        return Goal(value.lower())
    raise PolicyError(field, f"must be maximize or minimize, got {value!r}")


def is_evaluation_interval(policy: IntervalPolicy, interval: int) -> bool:
    """Whether the policy applies at ``interval`` (1 for the first report)."""
    return policy.applies_at(interval)


def evaluate(
    policy: IntervalPolicy,
    goal: Goal,
    histories: Mapping[int, Sequence[float | None]],
    trial: int,
) -> Decision:
    """The decision for ``trial`` at its latest interval N = ``len(histories[trial])``.
    ``histories`` holds every trial's metric per interval (running or ended: all are
    compared with); a trial not at an evaluation interval continues."""
    if not isinstance(policy, IntervalPolicy):
        raise TypeError(f"{policy.TYPE} decides per rung: call its report")
    n = len(histories[trial])
    if not policy.applies_at(n):
        return Decision(
            trial,
            Action.CONTINUE,
            f"interval {n} is not an evaluation interval ({policy.schedule()})",
            n,
        )
    peers = {t: h[:n] for t, h in histories.items() if len(h) >= n}
    return policy.decide(goal, peers, trial, n)


def evaluate_all(
    policy: IntervalPolicy,
    goal: Goal,
    histories: Mapping[int, Sequence[float | None]],
    running: Iterable[int],
) -> list[Decision]:
    """:func:`evaluate` for each running trial, in index order."""
    return [evaluate(policy, goal, histories, t) for t in sorted(running)]


__all__ = [
    "Action",
    "Decision",
    "Goal",
    "IntervalPolicy",
    "PausingPolicy",
    "Policy",
    "PolicyError",
    "evaluate",
    "evaluate_all",
    "is_evaluation_interval",
    "parse_goal",
    "parse_policy",
]
