"""Azure ML's interval policies on hand-built metric histories: bandit stops a trial out of
the slack of the best, median one worse than the median of the running averages, truncation
the lowest percentage; each at its evaluation intervals only, comparing trials over the
same intervals; and the policies and goals read from their JSON form."""

from __future__ import annotations

import math
from typing import Any

import pytest

from torchyard.sweeps import stopping
from torchyard.sweeps.policies import Action, Asha, Bandit, Goal, Median, Truncation

MAX, MIN = Goal.MAXIMIZE, Goal.MINIMIZE


def flat(value: float, n: int) -> list[float | None]:
    return [value] * n


# -- bandit ------------------------------------------------------------------------------

# (case, policy, goal, the leader's history, the trial's history, the trial's action)
BANDIT: list[tuple[str, Bandit, Goal, list[Any], list[Any], Action]] = [
    # Azure ML's example: best 0.8 at interval 10, slack factor 0.2: the bound is 0.8 / 1.2
    (
        "below best/(1+slack)",
        Bandit(slack_factor=0.2),
        MAX,
        flat(0.8, 10),
        flat(0.66, 10),
        Action.STOP,
    ),
    (
        "within best/(1+slack)",
        Bandit(slack_factor=0.2),
        MAX,
        flat(0.8, 10),
        flat(0.67, 10),
        Action.CONTINUE,
    ),
    (
        "below best - amount",
        Bandit(slack_amount=0.2),
        MAX,
        flat(0.8, 10),
        flat(0.59, 10),
        Action.STOP,
    ),
    (
        "within best - amount",
        Bandit(slack_amount=0.2),
        MAX,
        flat(0.8, 10),
        flat(0.61, 10),
        Action.CONTINUE,
    ),
    (
        "minimize: above best*(1+slack)",
        Bandit(slack_factor=0.2),
        MIN,
        flat(0.5, 4),
        flat(0.61, 4),
        Action.STOP,
    ),
    (
        "minimize: within best*(1+slack)",
        Bandit(slack_factor=0.2),
        MIN,
        flat(0.5, 4),
        flat(0.59, 4),
        Action.CONTINUE,
    ),
    (
        "minimize: above best + amount",
        Bandit(slack_amount=0.1),
        MIN,
        flat(0.5, 4),
        flat(0.61, 4),
        Action.STOP,
    ),
    # the trial's best so far counts, not its last report
    (
        "its best so far is within",
        Bandit(slack_factor=0.2),
        MAX,
        flat(0.8, 3),
        [0.7, 0.5, 0.5],
        Action.CONTINUE,
    ),
    # the leader's later intervals are not compared with
    (
        "only the first N intervals",
        Bandit(slack_factor=0.2),
        MAX,
        [0.5, 0.5, 0.5, 0.99, 0.99],
        [0.45, 0.45, 0.45],
        Action.CONTINUE,
    ),
    (
        "no finite report",
        Bandit(slack_factor=0.2),
        MAX,
        flat(0.8, 3),
        [math.nan, None, math.inf],
        Action.STOP,
    ),
    (
        "nobody finite",
        Bandit(slack_factor=0.2),
        MAX,
        flat(math.nan, 3),
        [None, None, None],
        Action.CONTINUE,
    ),
    # the guide's notebook: slack 0.15, every interval from interval 10
    (
        "before delayEvaluation",
        Bandit(slack_factor=0.15, delay_evaluation=10),
        MAX,
        flat(0.9, 9),
        flat(0.1, 9),
        Action.CONTINUE,
    ),
    (
        "at delayEvaluation",
        Bandit(slack_factor=0.15, delay_evaluation=10),
        MAX,
        flat(0.9, 10),
        flat(0.1, 10),
        Action.STOP,
    ),
]


@pytest.mark.parametrize(
    ("case", "policy", "goal", "leader", "history", "action"), BANDIT, ids=[b[0] for b in BANDIT]
)
def test_bandit_stops_a_trial_out_of_the_slack_of_the_best(
    case: str, policy: Bandit, goal: Goal, leader: list[Any], history: list[Any], action: Action
) -> None:
    decision = stopping.evaluate(policy, goal, {0: leader, 1: history}, 1)
    assert decision.action is action, decision.reason
    assert decision.trial == 1 and decision.at == len(history)


def test_bandit_says_why_in_numbers() -> None:
    decision = stopping.evaluate(
        Bandit(slack_factor=0.2), MAX, {3: flat(0.8, 10), 7: flat(0.6, 10)}, 7
    )
    assert decision.reason == (
        "its best by interval 10, 0.6, is below 0.666667 (the best by interval 10, 0.8 of "
        "trial 3, / (1 + slack factor 0.2))"
    )


@pytest.mark.parametrize(
    ("policy", "due"),
    [
        (Bandit(slack_factor=0.1), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
        (Bandit(slack_factor=0.1, evaluation_interval=2, delay_evaluation=5), [6, 8, 10]),
        (Median(evaluation_interval=3), [3, 6, 9]),
        (Truncation(truncation_percentage=10, delay_evaluation=4), [4, 5, 6, 7, 8, 9, 10]),
    ],
)
def test_a_policy_applies_at_every_interval_th_report_from_the_delay(policy: Any, due: list[int]):
    assert [n for n in range(11) if stopping.is_evaluation_interval(policy, n)] == due
    for n in range(1, 11):
        # a hopeless trial beside nine good ones: stopped exactly where the policy applies
        histories = {t: flat(0.9, n) for t in range(9)}
        histories[9] = flat(0.01, n)
        action = stopping.evaluate(policy, MAX, histories, 9).action
        assert (action is Action.STOP) == (n in due), n


# -- median ------------------------------------------------------------------------------


def test_median_stops_a_trial_whose_best_is_worse_than_the_median_of_running_averages():
    histories: dict[int, list[float | None]] = {
        0: [0.1, 0.2, 0.3],  # running average 0.2
        1: [0.2, 0.3, 0.4],  # 0.3
        2: [0.3, 0.4, 0.5],  # 0.4
        3: [0.05, 0.1, 0.15],  # 0.1, best 0.15
    }
    # the median of 0.1, 0.2, 0.3, 0.4 is 0.25 (the mean of the two middle ones)
    assert stopping.evaluate(Median(), MAX, histories, 3).action is Action.STOP
    assert stopping.evaluate(Median(), MAX, histories, 0).action is Action.CONTINUE  # 0.3
    assert "median 0.25 of the running averages over intervals 1..3 of the 4 trials" in (
        stopping.evaluate(Median(), MAX, histories, 3).reason
    )


def test_the_median_is_a_real_median_not_a_mean() -> None:
    # one runaway trial: a mean of the running averages (Katib's medianstop computes one)
    # would be 20.25 and stop every other trial; the median is 0.35
    histories: dict[int, list[float | None]] = {
        0: flat(0.2, 3),
        1: flat(0.3, 3),
        2: flat(0.35, 3),
        3: flat(0.4, 3),
        4: flat(100.0, 3),
    }
    decisions = stopping.evaluate_all(Median(), MAX, histories, range(5))
    assert [d.action for d in decisions] == [
        Action.STOP,
        Action.STOP,
        Action.CONTINUE,
        Action.CONTINUE,
        Action.CONTINUE,
    ]


def test_median_when_minimizing_compares_the_lowest_loss() -> None:
    histories: dict[int, list[float | None]] = {
        0: [2.0, 1.0, 0.5],  # average 1.1667
        1: [2.0, 1.5, 1.2],  # 1.5667, best 1.2
        2: [3.0, 2.8, 2.7],  # 2.8333, best 2.7
    }
    assert stopping.evaluate(Median(), MIN, histories, 2).action is Action.STOP
    assert stopping.evaluate(Median(), MIN, histories, 1).action is Action.CONTINUE


def test_median_compares_only_trials_that_reached_the_interval() -> None:
    histories: dict[int, list[float | None]] = {0: flat(0.9, 2), 1: flat(0.9, 2), 2: flat(0.1, 5)}
    # at interval 5 only trial 2 is there: its own median
    assert stopping.evaluate(Median(), MAX, histories, 2).action is Action.CONTINUE


def test_a_report_that_is_not_a_number_counts_as_the_worst() -> None:
    histories: dict[int, list[float | None]] = {
        0: flat(0.5, 3),
        1: flat(0.6, 3),
        2: flat(0.7, 3),
        3: [0.9, math.nan, None],  # its average is the worst there is; its best is still 0.9
        4: [math.nan, math.nan, math.nan],
    }
    # the median of 0.5, 0.6, 0.7 and two worst-there-is averages is 0.5
    assert stopping.evaluate(Median(), MAX, histories, 4).action is Action.STOP
    assert stopping.evaluate(Median(), MAX, histories, 3).action is Action.CONTINUE


# -- truncation ------------------------------------------------------------------------


def ten_trials() -> dict[int, list[float | None]]:
    return {t: [0.1 * t, 0.1 * t + 0.05] for t in range(10)}  # trial t's best: 0.1 t + 0.05


@pytest.mark.parametrize(
    ("percentage", "stopped"), [(10, {0}), (20, {0, 1}), (25, {0, 1}), (50, {0, 1, 2, 3, 4})]
)
def test_truncation_stops_the_lowest_percentage(percentage: int, stopped: set[int]) -> None:
    policy = Truncation(truncation_percentage=percentage)
    decisions = stopping.evaluate_all(policy, MAX, ten_trials(), range(10))
    assert {d.trial for d in decisions if d.action is Action.STOP} == stopped


def test_truncation_when_minimizing_stops_the_highest_losses() -> None:
    policy = Truncation(truncation_percentage=20)
    decisions = stopping.evaluate_all(policy, MIN, ten_trials(), range(10))
    assert {d.trial for d in decisions if d.action is Action.STOP} == {8, 9}


def test_truncation_cuts_no_one_while_the_percentage_is_less_than_one_trial() -> None:
    histories = {t: [float(t)] for t in range(4)}  # 4 trials x 20 % = 0.8
    policy = Truncation(truncation_percentage=20)
    assert all(
        d.action is Action.CONTINUE for d in stopping.evaluate_all(policy, MAX, histories, range(4))
    )


def test_truncation_keeps_tied_trials_together() -> None:
    histories = {t: [0.5] for t in range(10)}
    policy = Truncation(truncation_percentage=30)
    assert all(
        d.action is Action.CONTINUE
        for d in stopping.evaluate_all(policy, MAX, histories, range(10))
    )


def test_truncation_ranks_a_young_trial_against_the_others_at_its_own_interval() -> None:
    # older trials went on to 0.9; at interval 2 they were worse than the young one
    histories: dict[int, list[float | None]] = {t: [0.1, 0.2, 0.9, 0.9] for t in range(4)}
    histories[4] = [0.3, 0.3]
    policy = Truncation(truncation_percentage=20)
    assert stopping.evaluate(policy, MAX, histories, 4).action is Action.CONTINUE


def test_asha_is_not_an_interval_policy() -> None:
    with pytest.raises(TypeError, match="asha decides per rung"):
        stopping.evaluate(Asha(max_resource=9), MAX, {0: [0.1]}, 0)  # type: ignore[arg-type]


# -- the JSON form ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "policy"),
    [
        (
            {"type": "bandit", "slackFactor": 0.15, "evaluationInterval": 1, "delayEvaluation": 10},
            Bandit(slack_factor=0.15, evaluation_interval=1, delay_evaluation=10),
        ),
        ({"type": "bandit", "slackAmount": 0.2}, Bandit(slack_amount=0.2)),
        ({"type": "median", "delayEvaluation": 5}, Median(delay_evaluation=5)),
        ({"type": "truncation", "truncationPercentage": 20}, Truncation(truncation_percentage=20)),
        (
            {"type": "asha", "maxResource": 81, "reductionFactor": 3},
            Asha(max_resource=81, reduction_factor=3),
        ),
        (
            {"type": "asha", "minResource": 3, "maxResource": 81, "brackets": 2},
            Asha(max_resource=81, min_resource=3, brackets=2),
        ),
    ],
)
def test_a_policy_reads_from_its_json_form(obj: dict[str, Any], policy: Any) -> None:
    assert stopping.parse_policy(obj) == policy


BAD_POLICIES: list[tuple[str, Any, str, str]] = [
    ("not an object", "bandit", "earlyTermination", "must be an object"),
    ("no type", {"slackFactor": 0.1}, "earlyTermination.type", "must be one of"),
    (
        "an unknown type",
        {"type": "hyperband"},
        "earlyTermination.type",
        "bandit, median, truncation, asha",
    ),
    (
        "an unknown field",
        {"type": "median", "slack": 1},
        "earlyTermination.slack",
        "not a field of median",
    ),
    ("no slack", {"type": "bandit"}, "earlyTermination.slackFactor", "exactly one"),
    (
        "both slacks",
        {"type": "bandit", "slackFactor": 0.1, "slackAmount": 0.1},
        "earlyTermination.slackFactor",
        "exactly one",
    ),
    (
        "negative slack",
        {"type": "bandit", "slackAmount": -0.1},
        "earlyTermination.slackAmount",
        "at least 0",
    ),
    (
        "NaN slack",
        {"type": "bandit", "slackFactor": math.nan},
        "earlyTermination.slackFactor",
        "finite",
    ),
    (
        "interval zero",
        {"type": "median", "evaluationInterval": 0},
        "earlyTermination.evaluationInterval",
        "at least 1",
    ),
    (
        "interval a float",
        {"type": "median", "evaluationInterval": 1.5},
        "earlyTermination.evaluationInterval",
        "integer",
    ),
    (
        "negative delay",
        {"type": "median", "delayEvaluation": -1},
        "earlyTermination.delayEvaluation",
        "at least 0",
    ),
    ("no percentage", {"type": "truncation"}, "earlyTermination.truncationPercentage", "required"),
    (
        "percentage 100",
        {"type": "truncation", "truncationPercentage": 100},
        "earlyTermination.truncationPercentage",
        "at most 99",
    ),
    (
        "percentage 0",
        {"type": "truncation", "truncationPercentage": 0},
        "earlyTermination.truncationPercentage",
        "at least 1",
    ),
    ("asha without maxResource", {"type": "asha"}, "earlyTermination.maxResource", "required"),
    (
        "asha reduction factor 1",
        {"type": "asha", "maxResource": 9, "reductionFactor": 1},
        "earlyTermination.reductionFactor",
        "greater than 1",
    ),
    (
        "asha min above max",
        {"type": "asha", "maxResource": 9, "minResource": 10},
        "earlyTermination.maxResource",
        "at least minResource",
    ),
    (
        "asha min zero",
        {"type": "asha", "maxResource": 9, "minResource": 0},
        "earlyTermination.minResource",
        "greater than 0",
    ),
    (
        "more brackets than rungs",
        {"type": "asha", "maxResource": 9, "brackets": 4},
        "earlyTermination.brackets",
        "has 3 rungs",
    ),
]


@pytest.mark.parametrize(
    ("case", "obj", "field", "words"), BAD_POLICIES, ids=[b[0] for b in BAD_POLICIES]
)
def test_a_bad_policy_is_refused_naming_the_field(case: str, obj: Any, field: str, words: str):
    with pytest.raises(stopping.PolicyError) as caught:
        stopping.parse_policy(obj)
    assert caught.value.field == field, str(caught.value)
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("value", "goal"),
    [("maximize", MAX), ("Maximize", MAX), ("MINIMIZE", MIN), (MIN, MIN)],
)
def test_a_goal_is_maximize_or_minimize_in_any_case(value: Any, goal: Goal) -> None:
    assert stopping.parse_goal(value) is goal


@pytest.mark.parametrize("value", ["max", "", None, 1, "maximise"])
def test_any_other_goal_is_refused(value: Any) -> None:
    with pytest.raises(
        stopping.PolicyError, match=r"objective\.goal: must be maximize or minimize"
    ):
        stopping.parse_goal(value)
