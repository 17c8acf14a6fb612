"""``earlyTermination.type: bandit``, Azure ML's BanditPolicy: stop the trial when its best
metric by interval N is not within the slack of the best any trial had by N: below best /
(1 + slackFactor), or best - slackAmount, when maximizing (Azure ML's
how-to-tune-hyperparameters page: "any training jobs whose best metric at interval 10 is
less than 0.66 (0.8/(1+slack_factor)) will be terminated"); above best * (1 + slackFactor),
or best + slackAmount, when minimizing. Registered by ``sweeps.policies``; tested in
tests/unit/sweeps/test_stopping.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torchyard.sweeps.policies.base import (
    SCHEDULE,
    Action,
    Decision,
    Field,
    Goal,
    IntervalPolicy,
    PolicyError,
    check_number,
    only,
    scores,
    show,
    unscore,
)
from torchyard.variants import Rule

SLACK_FACTOR = Field(
    "slackFactor",
    "slack_factor",
    integer=False,
    description="bandit: the slack as a ratio: when maximizing, a trial stops below "
    "best / (1 + slackFactor).",
    minimum=0,
)
SLACK_AMOUNT = Field(
    "slackAmount",
    "slack_amount",
    integer=False,
    description="bandit: the slack as an amount of the metric.",
    minimum=0,
)


@dataclass(frozen=True)
class Bandit(IntervalPolicy):
    """Azure ML's BanditPolicy: exactly one of ``slack_factor`` and ``slack_amount``."""

    slack_factor: float | None = None
    slack_amount: float | None = None
    evaluation_interval: int = 1
    delay_evaluation: int = 0

    TYPE = "bandit"
    SUMMARY = (
        "stop a trial whose best metric is not within the slack of the best trial's at "
        "that interval"
    )
    FIELDS = (SLACK_FACTOR, SLACK_AMOUNT, *SCHEDULE)
    RULES = (
        Rule(
            {
                "rule": "self.type != 'bandit' || has(self.slackFactor) != has(self.slackAmount)",
                "message": "bandit takes exactly one of slackFactor and slackAmount",
                "fieldPath": ".slackFactor",
            },
            lambda m: m.type != "bandit" or (m.slack_factor is None) != (m.slack_amount is None),
        ),
        only("bandit", SLACK_FACTOR, SLACK_AMOUNT),
    )

    def __post_init__(self) -> None:
        if (self.slack_factor is None) == (self.slack_amount is None):
            raise PolicyError("slackFactor", "give exactly one of slackFactor and slackAmount")
        for field, value in (
            ("slackFactor", self.slack_factor),
            ("slackAmount", self.slack_amount),
        ):
            if value is not None and check_number(field, value) < 0:
                raise PolicyError(field, f"must be at least 0, got {value!r}")
        self.check_schedule()

    def decide(
        self, goal: Goal, peers: Mapping[int, Sequence[float | None]], trial: int, n: int
    ) -> Decision:
        bests = {t: max(scores(goal, h)) for t, h in peers.items()}
        top = max(bests.values())
        if top == -math.inf:
            return Decision(
                trial, Action.CONTINUE, f"no trial has a finite metric by interval {n}", n
            )
        leader = min(t for t, s in bests.items() if s == top)
        best = unscore(goal, top)
        maximize = goal is Goal.MAXIMIZE
        if self.slack_factor is not None:
            sf = self.slack_factor
            limit = best / (1 + sf) if maximize else best * (1 + sf)
            how = f"{'/' if maximize else '*'} (1 + slack factor {sf:g})"
        else:
            sa = self.slack_amount or 0.0
            limit = best - sa if maximize else best + sa
            how = f"{'-' if maximize else '+'} slack amount {sa:g}"
        mine = unscore(goal, bests[trial]) if bests[trial] > -math.inf else None
        bound = f"{show(limit)} (the best by interval {n}, {show(best)} of trial {leader}, {how})"
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
                trial, Action.STOP, f"its best by interval {n}, {show(mine)}, is {word} {bound}", n
            )
        return Decision(
            trial, Action.CONTINUE, f"its best by interval {n}, {show(mine)}, is within {bound}", n
        )
