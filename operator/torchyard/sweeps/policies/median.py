"""``earlyTermination.type: median``, Azure ML's MedianStoppingPolicy: stop the trial when
its best metric by interval N is worse than the median (the middle value, or the mean of
the two middle values) of the running averages over intervals 1..N of all the trials that
reached N. Registered by ``sweeps.policies``; tested in tests/unit/sweeps/test_stopping.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torchyard.sweeps.policies.base import (
    SCHEDULE,
    Action,
    Decision,
    Goal,
    IntervalPolicy,
    scores,
    show,
    unscore,
)


@dataclass(frozen=True)
class Median(IntervalPolicy):
    """Azure ML's MedianStoppingPolicy."""

    evaluation_interval: int = 1
    delay_evaluation: int = 0

    TYPE = "median"
    SUMMARY = "stop a trial whose best is worse than the median of all trials' running averages"
    FIELDS = SCHEDULE

    def __post_init__(self) -> None:
        self.check_schedule()

    def decide(
        self, goal: Goal, peers: Mapping[int, Sequence[float | None]], trial: int, n: int
    ) -> Decision:
        averages = [math.fsum(scores(goal, h)) / n for h in peers.values()]
        median = statistics.median(averages)
        mine = max(scores(goal, peers[trial]))
        words = (
            f"the median {show(unscore(goal, median))} of the running averages over "
            f"intervals 1..{n} of the {len(averages)} trials that reached it"
        )
        worse = mine < median
        return Decision(
            trial,
            Action.STOP if worse else Action.CONTINUE,
            f"its best by interval {n}, {show(unscore(goal, mine))}, is "
            f"{'worse than' if worse else 'not worse than'} {words}",
            n,
        )
