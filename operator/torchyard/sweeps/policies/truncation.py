"""``earlyTermination.type: truncation``, Azure ML's TruncationSelectionPolicy: stop the
trial when it is among the lowest ``truncationPercentage`` % of the trials that reached
interval N by their best metric by N: of n trials, k = floor(n * percentage / 100) are
cut, so a trial stops when at least n - k trials did strictly better (tied trials are kept
together). Registered by ``sweeps.policies``; tested in tests/unit/sweeps/test_stopping.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torchyard.sweeps.policies import base

TRUNCATION_PERCENTAGE = base.Field(
    "truncationPercentage",
    "truncation_percentage",
    integer=True,
    description="truncation: the percentage of trials cut at each evaluation interval.",
    minimum=1,
    maximum=99,
    required=True,
)


@dataclass(frozen=True)
class Truncation(base.IntervalPolicy):
    """Azure ML's TruncationSelectionPolicy."""

    truncation_percentage: int
    evaluation_interval: int = 1
    delay_evaluation: int = 0

    TYPE = "truncation"
    SUMMARY = "stop the lowest truncationPercentage %"
    FIELDS = (TRUNCATION_PERCENTAGE, *base.SCHEDULE)
    RULES = (base.required("truncation", TRUNCATION_PERCENTAGE),)

    def __post_init__(self) -> None:
        pct = base.check_integer("truncationPercentage", self.truncation_percentage, 1)
        if pct > 99:
            raise base.PolicyError("truncationPercentage", f"must be at most 99, got {pct}")
        self.check_schedule()

    def decide(
        self, goal: base.Goal, peers: Mapping[int, Sequence[float | None]], trial: int, n: int
    ) -> base.Decision:
        bests = {t: max(base.scores(goal, h)) for t, h in peers.items()}
        count = len(bests)
        cut = count * self.truncation_percentage // 100
        better = sum(1 for s in bests.values() if s > bests[trial])
        mine = base.show(base.unscore(goal, bests[trial]))
        where = (
            f"{better} of the {count} trials that reached interval {n} did better than its "
            f"{mine}; the lowest {self.truncation_percentage} % is {cut} trial(s)"
        )
        stop = cut >= 1 and better >= count - cut
        return base.Decision(trial, base.Action.STOP if stop else base.Action.CONTINUE, where, n)
