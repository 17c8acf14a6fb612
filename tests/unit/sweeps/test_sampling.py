"""Sampling: the n-th trial's parameters are a pure function of (seed, n, space), so an
operator that restarts draws the same sequence; a grid is every combination of choices in
a stable order; a trial receives its parameters as HyperDrive passes them."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from typing import Any

import pytest

from torchyard.sweeps import sampling, space
from torchyard.sweeps.sampling import SamplingError

NOTEBOOK = space.parse_space(
    {
        "learning_rate": {"type": "uniform", "minValue": 0.0005, "maxValue": 0.005},
        "momentum": {"type": "uniform", "minValue": 0.9, "maxValue": 0.99},
        "batch_size": {"type": "choice", "values": [16, 32, 64]},
    }
)


def test_the_sequence_is_pinned_so_a_change_to_it_is_deliberate() -> None:
    # sha256 of (seed, trial, name, draw): the same on every platform and Python version
    assert sampling.random_trial(NOTEBOOK, 42, 0) == {
        "batch_size": 64,
        "learning_rate": 0.004554053659192101,
        "momentum": 0.9792176431536526,
    }
    assert sampling.random_trial(NOTEBOOK, 42, 2) == {
        "batch_size": 64,
        "learning_rate": 0.003320082820093473,
        "momentum": 0.9772314800252413,
    }


def test_a_restart_draws_the_same_trials_however_many_were_drawn_before() -> None:
    first_run = [sampling.random_trial(NOTEBOOK, 7, n) for n in range(20)]
    # "restarts" after 0, 5 and 13 trials, and one that asks in reverse order
    for drawn_before in (0, 5, 13):
        for n in range(drawn_before):
            sampling.random_trial(NOTEBOOK, 99, n)  # other sweeps' draws change nothing
        resumed = [sampling.random_trial(NOTEBOOK, 7, n) for n in range(drawn_before, 20)]
        assert resumed == first_run[drawn_before:]
    assert [sampling.random_trial(NOTEBOOK, 7, n) for n in reversed(range(20))] == first_run[::-1]


def test_different_seeds_and_different_trials_draw_different_values() -> None:
    a = [sampling.random_trial(NOTEBOOK, 1, n)["learning_rate"] for n in range(50)]
    b = [sampling.random_trial(NOTEBOOK, 2, n)["learning_rate"] for n in range(50)]
    assert len(set(a)) == 50 and not set(a) & set(b)


def test_adding_a_parameter_leaves_the_others_values_as_they_were() -> None:
    wider = space.make_space(
        {**{p.name: p.expression for p in NOTEBOOK.parameters}, "dropout": space.uniform(0, 0.5)}
    )
    for n in range(10):
        before = sampling.random_trial(NOTEBOOK, 3, n)
        after = sampling.random_trial(wider, 3, n)
        assert {k: after[k] for k in before} == before


# (expression, a check every drawn value passes)
DRAWS: list[tuple[str, Any, Any]] = [
    ("choice", space.choice("adam", "sgd", 3), lambda v: v in ("adam", "sgd", 3)),
    ("randint", space.randint(5), lambda v: type(v) is int and 0 <= v < 5),
    ("uniform", space.uniform(-2, 3), lambda v: type(v) is float and -2 <= v <= 3),
    (
        "quniform int q",
        space.quniform(8, 64, 8),
        lambda v: type(v) is int and v % 8 == 0 and 8 <= v <= 64,
    ),
    (
        "quniform float q",
        space.quniform(0, 1, 0.1),
        lambda v: type(v) is float and len(space.format_value(v)) <= 3,  # 0.3, not 0.300..04
    ),
    (
        "loguniform",
        space.loguniform(math.log(1e-4), math.log(1e-1)),
        lambda v: 1e-4 <= v <= 1e-1,
    ),
    (
        "qloguniform",
        space.qloguniform(math.log(1), math.log(1000), 1),
        lambda v: type(v) is int and 1 <= v <= 1000,
    ),
    ("normal", space.normal(10, 2), lambda v: 10 - 2 * 8.6 <= v <= 10 + 2 * 8.6),
    ("qnormal", space.qnormal(10, 2, 0.5), lambda v: (v * 2) == int(v * 2)),
    ("lognormal", space.lognormal(0, 1), lambda v: v > 0),
    ("qlognormal", space.qlognormal(3, 0.5, 2), lambda v: type(v) is int and v % 2 == 0),
]


@pytest.mark.parametrize(("case", "expression", "ok"), DRAWS, ids=[d[0] for d in DRAWS])
def test_every_draw_is_a_value_the_expression_allows(case: str, expression: Any, ok: Any) -> None:
    one = space.make_space({"p": expression})
    values = [sampling.random_trial(one, 11, n)["p"] for n in range(400)]
    assert all(ok(v) for v in values), [v for v in values if not ok(v)][:5]
    assert len({space.format_value(v) for v in values}) > 1


@pytest.mark.parametrize(
    ("expression", "mean", "sd"),
    [
        (space.uniform(0, 1), 0.5, math.sqrt(1 / 12)),
        (space.normal(3, 2), 3.0, 2.0),
        (space.loguniform(0, 1), math.e - 1, math.sqrt((math.e**2 - 1) / 2 - (math.e - 1) ** 2)),
    ],
    ids=["uniform", "normal", "loguniform is exp(uniform(low, high))"],
)
def test_draws_follow_the_distribution(expression: Any, mean: float, sd: float) -> None:
    one = space.make_space({"p": expression})
    n = 4000
    values = [float(sampling.random_trial(one, 5, i)["p"]) for i in range(n)]
    assert abs(statistics.fmean(values) - mean) < 4 * sd / math.sqrt(n)
    assert abs(statistics.stdev(values) - sd) < 0.1 * sd


def test_each_choice_value_is_drawn_about_equally_often() -> None:
    one = space.make_space({"p": space.choice(*range(4))})
    counts = [0] * 4
    for n in range(4000):
        counts[int(sampling.random_trial(one, 8, n)["p"])] += 1
    assert all(900 < c < 1100 for c in counts), counts


GRID = space.make_space(
    {
        "optimizer": space.choice("sgd", "adam"),
        "batch_size": space.choice(64, 16, 32),
        "lr": space.choice(0.1, 0.01),
    }
)


def test_the_grid_is_every_combination_once_the_last_name_varying_fastest() -> None:
    assert sampling.grid_size(GRID) == 12
    trials = [sampling.grid_trial(GRID, n) for n in range(12)]
    expected = [
        {"batch_size": b, "lr": lr, "optimizer": o}
        for b, lr, o in itertools.product([64, 16, 32], [0.1, 0.01], ["sgd", "adam"])
    ]
    assert trials == expected  # names sorted; each choice in the order written
    assert sampling.trial_parameters("grid", GRID, 123, 5) == expected[5]  # the seed is unused


def test_a_grid_index_past_the_end_is_refused() -> None:
    with pytest.raises(SamplingError, match="12 combinations"):
        sampling.grid_trial(GRID, 12)


def test_a_grid_takes_only_choices_naming_the_parameter() -> None:
    with pytest.raises(SamplingError) as caught:
        sampling.grid_size(NOTEBOOK)
    assert caught.value.field == "parameters.learning_rate"
    assert "learning_rate is uniform, momentum is uniform" in str(caught.value)


@pytest.mark.parametrize(
    ("sampling_name", "max_total", "count", "field", "words"),
    [
        ("grid", 12, 12, None, None),
        ("grid", 100, 12, None, None),  # a smaller grid is run whole
        ("grid", 11, None, "maxTotalTrials", "12 combinations (3 batch_size x 2 lr x 2 optimizer)"),
        ("random", 8, 8, None, None),
        ("bayesian", 8, 8, None, None),
        ("anneal", 8, None, "sampling", "must be one of random, grid, bayesian"),
        ("random", 0, None, "maxTotalTrials", "at least 1"),
        ("random", True, None, "maxTotalTrials", "integer"),
        ("random", "8", None, "maxTotalTrials", "integer"),
    ],
)
def test_check_says_how_many_trials_or_refuses_naming_the_field(
    sampling_name: str, max_total: Any, count: int | None, field: str | None, words: str | None
) -> None:
    if count is not None:
        assert sampling.check(sampling_name, GRID, max_total) == count
        return
    with pytest.raises(SamplingError) as caught:
        sampling.check(sampling_name, GRID, max_total)
    assert caught.value.field == field and words is not None and words in str(caught.value)


@pytest.mark.parametrize("trial", [-1, True, 1.0, "0"])
def test_a_trial_index_is_a_non_negative_integer(trial: Any) -> None:
    with pytest.raises(ValueError):
        sampling.random_trial(NOTEBOOK, 0, trial)


@pytest.mark.parametrize("seed", [None, 1.5, "7", False])
def test_a_seed_is_an_integer(seed: Any) -> None:
    with pytest.raises(SamplingError, match="seed"):
        sampling.random_trial(NOTEBOOK, seed, 0)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0031, "0.0031"),
        (0.1 + 0.2, "0.30000000000000004"),  # exactly the float, read back the same
        (1e-05, "1e-05"),
        (3.0, "3.0"),
        (-0.0, "0.0"),
        (1e16, "1e+16"),
        (32, "32"),
        (-4, "-4"),
        (True, "True"),
        (False, "False"),
        ("adam", "adam"),
        ("two words", "two words"),
    ],
)
def test_values_are_formatted_stably(value: Any, text: str) -> None:
    assert space.format_value(value) == text


def test_a_formatted_float_reads_back_as_the_same_float() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        x = rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30)
        assert float(space.format_value(x)) == x


def test_a_trial_receives_its_parameters_as_hyperdrive_passes_them() -> None:
    parameters = {"momentum": 0.95, "learning_rate": 0.0031, "optimizer": "sgd", "layers": 4}
    assert sampling.arguments(parameters) == [
        "--layers",
        "4",
        "--learning_rate",
        "0.0031",
        "--momentum",
        "0.95",
        "--optimizer",
        "sgd",
    ]
    assert sampling.environment(parameters) == {
        "TORCHYARD_PARAM_LAYERS": "4",
        "TORCHYARD_PARAM_LEARNING_RATE": "0.0031",
        "TORCHYARD_PARAM_MOMENTUM": "0.95",
        "TORCHYARD_PARAM_OPTIMIZER": "sgd",
    }


def test_the_argument_is_the_value_in_the_status() -> None:
    for n in range(50):
        parameters = sampling.random_trial(NOTEBOOK, 4, n)
        argv = sampling.arguments(parameters)
        read = dict(zip(argv[::2], argv[1::2], strict=True))
        assert float(read["--learning_rate"]) == parameters["learning_rate"]
        assert int(read["--batch_size"]) == parameters["batch_size"]
