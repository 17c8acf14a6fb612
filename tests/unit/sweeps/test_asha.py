"""ASHA: a trial reaching a rung goes on only if it is in the top 1/reductionFactor of the
trials recorded there so far, else it is paused with its checkpoint, and promoted once the
trials recorded after it did worse. Its go-on/pause decisions are Ray Tune's
AsyncHyperBandScheduler's go-on/stop decisions given the same events, checked against
Ray's rule restated below (with numpy, as Ray computes it)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from torchyard.sweeps.policies import asha
from torchyard.sweeps.policies.asha import Asha
from torchyard.sweeps.policies.base import Action, Goal, Rungs

MAX, MIN = Goal.MAXIMIZE, Goal.MINIMIZE


class RayBracket:
    """Ray Tune's ASHA rule, restated from ray-project/ray
    python/ray/tune/schedulers/async_hyperband.py (commit 490d7ebc321c, ``_Bracket`` and
    ``AsyncHyperBandScheduler.on_trial_result`` with ``stop_last_trials=True``):

    - bracket s has ``int(log(max_t / min_t) / log(rf) - s + 1)`` rungs at
      ``min_t * rf ** (k + s)``, kept highest first;
    - a result at time t >= max_t stops the trial;
    - otherwise the first rung (highest first) with milestone <= t that has not recorded
      the trial is the one: its cutoff is ``np.nanpercentile`` of the rewards recorded there
      at (1 - 1/rf) * 100 (none for an empty rung), the trial stops if its reward is below
      the cutoff, and its reward is recorded there either way;
    - no such rung: it goes on. The reward is the metric times +1 (max) or -1 (min)."""

    def __init__(self, min_t: float, max_t: float, rf: float, s: int, mode: str) -> None:
        count = int(np.log(max_t / min_t) / np.log(rf) - s + 1)
        self.rungs: list[tuple[float, dict[int, float]]] = [
            (min_t * rf ** (k + s), {}) for k in reversed(range(count))
        ]
        self.rf, self.max_t, self.sign = rf, max_t, 1.0 if mode == "max" else -1.0

    def on_trial_result(self, trial: int, t: float, metric: float) -> str:
        if t >= self.max_t:
            return "STOP"
        reward = self.sign * metric
        for milestone, recorded in self.rungs:
            if t < milestone or trial in recorded:
                continue
            cut = (
                np.nanpercentile(list(recorded.values()), (1 - 1 / self.rf) * 100)
                if recorded
                else None
            )
            recorded[trial] = reward
            return "STOP" if cut is not None and reward < cut else "CONTINUE"
        return "CONTINUE"


def events(seed: int, trials: int, max_t: int, stride: int) -> list[tuple[float, int, int, float]]:
    """(when, trial, t, metric) for every report of ``trials`` asynchronous trials, each
    reporting every ``stride`` (or a random stride when 0) time units until max_t, in time
    order. A trial drops out of the order once a decision says it does not go on."""
    rng = random.Random(seed)
    out = []
    for trial in range(trials):
        start, speed = rng.uniform(0, 20), rng.uniform(0.5, 2.0)
        final, rate = rng.uniform(0.5, 0.95), rng.uniform(0.02, 0.3)
        t = 0
        while t < max_t:
            t += stride or rng.choice([1, 2, 3, 5])
            t = min(t, max_t)
            metric = final * (1 - np.exp(-rate * t)) + rng.gauss(0, 0.01)
            out.append((start + t * speed, trial, t, float(metric)))
    return sorted(out)


@pytest.mark.parametrize(
    ("goal", "eta", "min_t", "max_t", "brackets", "stride"),
    [
        (MAX, 3, 1, 81, 1, 1),
        (MIN, 3, 1, 81, 1, 1),
        (MAX, 4, 1, 100, 1, 1),  # Ray's default reduction factor and max_t
        (MAX, 2, 1, 64, 1, 1),
        (MAX, 3, 3, 81, 1, 1),
        (MAX, 2.5, 1, 50, 1, 1),  # rungs at fractional milestones
        (MAX, 3, 1, 81, 2, 1),
        (MIN, 3, 1, 81, 3, 1),
        (MAX, 3, 1, 81, 1, 0),  # reports that skip rungs
    ],
)
@pytest.mark.parametrize("seed", range(5))
def test_asha_decides_as_ray_tunes_async_hyperband_given_the_same_events(
    goal: Goal, eta: float, min_t: int, max_t: int, brackets: int, stride: int, seed: int
) -> None:
    policy = Asha(max_resource=max_t, min_resource=min_t, reduction_factor=eta, brackets=brackets)
    mode = "max" if goal is MAX else "min"
    ray = [RayBracket(min_t, max_t, eta, s, mode) for s in range(brackets)]
    state = policy.start()
    assert [[r.milestone for r in b] for b in state.brackets] == [
        [m for m, _ in bracket.rungs] for bracket in ray
    ]
    gone: set[int] = set()
    compared = {"CONTINUE": 0, "STOP": 0}
    for _, trial, t, metric in events(seed, 40, max_t, stride):
        if trial in gone:
            continue
        bracket = policy.bracket(seed, trial)
        expected = ray[bracket].on_trial_result(trial, t, metric)
        state, decision = policy.report(goal, state, trial, t, metric, bracket)
        ours = "CONTINUE" if decision.action is Action.CONTINUE else "STOP"
        assert ours == expected, (trial, t, metric, decision.reason)
        assert decision.action in (Action.CONTINUE, Action.PAUSE, Action.STOP)
        if t >= max_t:
            assert decision.action is Action.STOP
        elif decision.action is not Action.CONTINUE:
            assert decision.action is Action.PAUSE  # where Ray stops, ASHA here pauses
        compared[expected] += 1
        if expected == "STOP":
            gone.add(trial)
    assert compared["CONTINUE"] > 20 and compared["STOP"] > 5, compared  # both kinds met


def test_rays_own_example_of_a_bracket() -> None:
    # _Bracket's docstring: min 1, max 10, rf 2; rewards 2 and 4 go on, the cutoff is 3.0;
    # 1 stops (pauses here), and the cutoff is then 2.0
    policy = Asha(max_resource=10, min_resource=1, reduction_factor=2)
    state = policy.start()
    assert [r.milestone for r in state.brackets[0]] == [8, 4, 2, 1]
    actions = []
    for trial, reward in ((1, 2.0), (2, 4.0), (3, 1.0)):
        state, d = policy.report(MAX, state, trial, 1, reward)
        actions.append(d.action)
        if trial == 2:
            assert asha.cutoff([s for _, s in state.brackets[0][-1].recorded], 2) == 3.0
    assert actions == [Action.CONTINUE, Action.CONTINUE, Action.PAUSE]
    assert asha.cutoff([s for _, s in state.brackets[0][-1].recorded], 2) == 2.0


@pytest.mark.parametrize(
    ("policy", "milestones"),
    [
        (Asha(max_resource=81, min_resource=1, reduction_factor=3), [[81, 27, 9, 3, 1]]),
        (
            Asha(max_resource=81, min_resource=1, reduction_factor=3, brackets=2),
            [[81, 27, 9, 3, 1], [81, 27, 9, 3]],
        ),
        (Asha(max_resource=100, min_resource=1, reduction_factor=4), [[64, 16, 4, 1]]),
        (Asha(max_resource=100, min_resource=10, reduction_factor=3), [[90, 30, 10]]),
    ],
)
def test_the_rungs_are_rays(policy: Asha, milestones: list[list[float]]) -> None:
    assert [[r.milestone for r in b] for b in policy.start().brackets] == milestones


def test_percentile_is_numpys_to_the_last_bit() -> None:
    rng = random.Random(1)
    for _ in range(3000):
        values = [rng.gauss(0, 1) for _ in range(rng.randint(1, 40))]
        if rng.random() < 0.3:
            values += values[: rng.randint(1, len(values))]  # ties
        q = (1 - 1 / rng.choice([2, 2.5, 3, 4, 5, 7])) * 100
        assert asha.percentile(values, q) == float(np.percentile(values, q))


def rung_values(state: Rungs, milestone: float) -> dict[int, float]:
    rung = next(r for r in state.brackets[0] if r.milestone == milestone)
    return dict(rung.recorded)


def test_a_paused_trial_is_promoted_once_later_trials_do_worse() -> None:
    policy = Asha(max_resource=81, reduction_factor=3)
    state = policy.start()
    state, a = policy.report(MAX, state, 0, 1, 0.9)
    state, b = policy.report(MAX, state, 1, 1, 0.8)  # below the cutoff 0.9
    assert (a.action, b.action) == (Action.CONTINUE, Action.PAUSE)
    assert "paused with its checkpoint" in b.reason
    # nothing new at its rung: not promoted
    assert policy.promotions(MAX, state, {1}) == []
    state, c = policy.report(MAX, state, 2, 1, 0.1)
    assert c.action is Action.PAUSE
    # trial 1's 0.8 against the others (0.9, 0.1): the cutoff is 0.633: promoted; trial 2's
    # 0.1 against 0.9 and 0.8 is not
    promoted = policy.promotions(MAX, state, {1, 2})
    assert [(d.trial, d.action, d.at) for d in promoted] == [(1, Action.PROMOTE, 1)]
    assert "resume from its checkpoint" in promoted[0].reason
    # resumed, it goes on to the next rung and is judged there as any trial
    state, d = policy.report(MAX, state, 1, 2, 0.85)
    assert d.action is Action.CONTINUE and rung_values(state, 3) == {}
    state, d = policy.report(MAX, state, 1, 3, 0.86)
    assert d.action is Action.CONTINUE and rung_values(state, 3) == {1: 0.86}


def test_promotions_come_from_the_highest_rung_first_then_the_best() -> None:
    policy = Asha(max_resource=81, reduction_factor=3)
    state = policy.start()
    # rung 1: trials 0..5; trials 0 and 1 go on to rung 3
    for trial, value in enumerate([0.5, 0.6, 0.55, 0.3, 0.58, 0.2]):
        state, _ = policy.report(MAX, state, trial, 1, value)
    for trial, value in ((0, 0.7), (1, 0.65)):
        state, _ = policy.report(MAX, state, trial, 3, value)
    paused = {1, 2, 4}
    # more trials do badly at both rungs
    for trial in range(6, 12):
        state, _ = policy.report(MAX, state, trial, 1, 0.01)
    for trial in (6, 7):
        state, _ = policy.report(MAX, state, trial, 3, 0.01)
    order = [d.trial for d in policy.promotions(MAX, state, paused)]
    assert order == [1, 4, 2]  # rung 3 first; then at rung 1, 0.58 before 0.55


def test_a_trial_at_max_resource_is_done_and_one_that_diverged_is_stopped() -> None:
    policy = Asha(max_resource=9, reduction_factor=3)
    state = policy.start()
    state, done = policy.report(MAX, state, 0, 9, 0.5)
    assert done.action is Action.STOP and "maxResource 9" in done.reason
    for bad in (float("nan"), float("inf"), None):
        after, d = policy.report(MAX, state, 1, 3, bad)
        assert d.action is Action.STOP and "not a finite number" in d.reason
        assert after == state  # not recorded: it would move every later cutoff


def test_minimizing_pauses_the_higher_loss() -> None:
    policy = Asha(max_resource=81, reduction_factor=3)
    state = policy.start()
    state, _ = policy.report(MIN, state, 0, 1, 0.3)
    state, worse = policy.report(MIN, state, 1, 1, 0.5)
    state, better = policy.report(MIN, state, 2, 1, 0.2)
    assert (worse.action, better.action) == (Action.PAUSE, Action.CONTINUE)
    assert "above the cutoff 0.3" in worse.reason


def test_a_trial_lands_in_the_same_bracket_after_a_restart() -> None:
    policy = Asha(max_resource=81, reduction_factor=3, brackets=2)
    first = [policy.bracket(5, t) for t in range(2000)]
    assert first == [policy.bracket(5, t) for t in range(2000)]
    # Ray's softmax over the rung counts (5 and 4): e**0 / (e**0 + e**-1) = 0.731
    assert abs(first.count(0) / 2000 - 0.731) < 0.03
    assert {Asha(max_resource=81).bracket(5, t) for t in range(100)} == {0}


def test_the_state_is_bounded_by_trials_times_rungs() -> None:
    policy = Asha(max_resource=81, reduction_factor=3)
    state = policy.start()
    for trial in range(200):
        for t in range(1, 30):
            state, d = policy.report(MAX, state, trial, t, random.random())
            if d.action is not Action.CONTINUE:
                break
    recorded = sum(len(r.recorded) for b in state.brackets for r in b)
    assert recorded <= 200 * 4


def test_asha_report_does_not_change_the_state_it_was_given() -> None:
    policy = Asha(max_resource=81)
    state = policy.start()
    before: Any = state
    after, _ = policy.report(MAX, state, 0, 1, 0.5)
    assert before == policy.start() and after != before
