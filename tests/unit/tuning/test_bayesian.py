"""Bayesian sampling (``torchyard.tuning.bayesian``, Optuna's TPE): the next trial is a pure
function of (space, goal, seed, index, the results before it), so a restarted operator
that rebuilds the study from its ledger gets the same trial; the values are the ones the
expressions allow, as the trial receives them; a trial still running keeps the next ones
away, a failed one teaches nothing; and with results to learn from it searches nearer the
best than random sampling does."""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest

from torchyard.sweeps import sampling, space
from torchyard.sweeps.sampling import SamplingError
from torchyard.sweeps.stopping import Goal
from torchyard.tuning import bayesian
from torchyard.tuning.bayesian import Result

MIXED = space.parse_space(
    {
        "batch_size": {"type": "choice", "values": [16, 32, 64]},
        "layers": {"type": "randint", "upper": 4},
        "lr": {"type": "loguniform", "minValue": -9.0, "maxValue": -2.0},
        "momentum": {"type": "uniform", "minValue": 0.9, "maxValue": 0.99},
        "units": {"type": "quniform", "minValue": 32, "maxValue": 256, "q": 32},
        "wd": {"type": "qloguniform", "minValue": -12.0, "maxValue": -4.0, "q": 0.0001},
    }
)
LINE = space.parse_space({"x": {"type": "uniform", "minValue": 0.0, "maxValue": 1.0}})


def score(x: float) -> float:
    return -((x - 0.8) ** 2)


def results_of(xs: list[Any]) -> list[Result]:
    return [Result({"x": x}, score(float(x)), ended=True) for x in xs]


def test_the_same_seed_index_and_results_give_the_same_trial() -> None:
    results = [Result(sampling.random_trial(MIXED, 3, i), float(i), ended=True) for i in range(12)]
    first = bayesian.suggest(MIXED, Goal.MAXIMIZE, 7, 12, results)
    assert bayesian.suggest(MIXED, Goal.MAXIMIZE, 7, 12, results) == first
    assert bayesian.suggest(MIXED, Goal.MAXIMIZE, 8, 12, results) != first
    assert bayesian.suggest(MIXED, Goal.MAXIMIZE, 7, 13, results) != first


def test_values_are_what_the_expressions_allow_as_the_trial_receives_them() -> None:
    results: list[Result] = []
    for index in range(30):
        got = bayesian.suggest(MIXED, Goal.MINIMIZE, 1, index, results)
        assert sorted(got) == list(MIXED.names())
        assert got["batch_size"] in (16, 32, 64)
        assert isinstance(got["layers"], int) and 0 <= got["layers"] < 4
        assert math.exp(-9) <= float(got["lr"]) <= math.exp(-2)
        assert 0.9 <= float(got["momentum"]) <= 0.99
        assert isinstance(got["units"], int) and got["units"] % 32 == 0
        assert round(float(got["wd"]) / 0.0001, 6) == round(float(got["wd"]) / 0.0001)
        results.append(Result(got, float(got["momentum"]) * 10, ended=True))


def test_with_results_it_searches_nearer_the_best_than_random_sampling() -> None:
    seen = [sampling.random_trial(LINE, 5, i)["x"] for i in range(15)]
    tpe = [
        float(bayesian.suggest(LINE, Goal.MAXIMIZE, 11, 15 + k, results_of(seen))["x"])
        for k in range(20)
    ]
    drawn = [float(sampling.random_trial(LINE, 11, 15 + k)["x"]) for k in range(20)]
    near = statistics.median(abs(x - 0.8) for x in tpe)
    assert near < statistics.median(abs(x - 0.8) for x in drawn) / 2, (near, tpe)


def test_minimize_searches_the_other_end() -> None:
    seen = [sampling.random_trial(LINE, 5, i)["x"] for i in range(15)]
    low = [Result({"x": x}, -score(float(x)), ended=True) for x in seen]
    got = [float(bayesian.suggest(LINE, Goal.MINIMIZE, 11, 15 + k, low)["x"]) for k in range(20)]
    assert statistics.median(abs(x - 0.8) for x in got) < 0.15


def test_running_trials_change_the_next_sample_and_failed_ones_teach_nothing() -> None:
    seen = results_of([sampling.random_trial(LINE, 5, i)["x"] for i in range(12)])
    base = bayesian.suggest(LINE, Goal.MAXIMIZE, 2, 12, seen)
    running = bayesian.suggest(LINE, Goal.MAXIMIZE, 2, 12, [*seen, Result(base)])
    assert running != base
    failed = [*seen, Result({"x": 0.1}, 99.0, ended=True, failed=True)]
    assert bayesian.suggest(LINE, Goal.MAXIMIZE, 2, 12, failed) == base
    no_metric = [*seen, Result({"x": 0.1}, None, ended=True)]
    assert bayesian.suggest(LINE, Goal.MAXIMIZE, 2, 12, no_metric) == base


@pytest.mark.parametrize(
    "odd",
    [
        Result({}, 1.0, ended=True),  # parameters unknown
        Result({"x": "a string"}, 1.0, ended=True),
        Result({"x": float("nan")}, 1.0, ended=True),
    ],
)
def test_a_result_it_cannot_read_is_skipped_not_fatal(odd: Result) -> None:
    seen = results_of([sampling.random_trial(LINE, 5, i)["x"] for i in range(12)])
    assert bayesian.suggest(LINE, Goal.MAXIMIZE, 2, 12, [*seen, odd]) == bayesian.suggest(
        LINE, Goal.MAXIMIZE, 2, 12, seen
    )


def test_a_value_rounded_past_its_bound_is_clipped_back_in() -> None:
    q = space.parse_space({"u": {"type": "quniform", "minValue": 0, "maxValue": 10, "q": 4}})
    results = [Result({"u": 12}, 1.0, ended=True), Result({"u": 0}, 0.0, ended=True)]
    assert 0 <= float(bayesian.suggest(q, Goal.MAXIMIZE, 1, 2, results)["u"]) <= 12


@pytest.mark.parametrize(
    ("expression", "type_"),
    [
        ({"type": "normal", "mu": 0, "sigma": 1}, "normal"),
        ({"type": "qnormal", "mu": 0, "sigma": 1, "q": 1}, "qnormal"),
        ({"type": "lognormal", "mu": 0, "sigma": 1}, "lognormal"),
        ({"type": "qlognormal", "mu": 0, "sigma": 1, "q": 1}, "qlognormal"),
    ],
)
def test_an_unbounded_expression_is_refused_naming_the_parameter(
    expression: dict[str, Any], type_: str
) -> None:
    unbounded = space.parse_space(
        {"lr": {"type": "uniform", "minValue": 0, "maxValue": 1}, "z": expression}
    )
    with pytest.raises(SamplingError) as caught:
        sampling.check("bayesian", unbounded, 8)
    assert caught.value.field == "parameters.z"
    assert f"z is {type_}" in str(caught.value)
    with pytest.raises(SamplingError):
        bayesian.suggest(unbounded, Goal.MAXIMIZE, 1, 0, [])
