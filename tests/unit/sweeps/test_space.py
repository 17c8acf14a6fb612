"""The search space: every Azure ML expression is read from its JSON form and written back,
and a space that cannot be sampled is refused with each problem named by its field."""

from __future__ import annotations

import math
from typing import Any

import pytest

from torchyard.sweeps import space
from torchyard.sweeps.space import SpaceError

EXPRESSIONS: list[tuple[dict[str, Any], type]] = [
    ({"type": "choice", "values": [16, 32, 64]}, space.Choice),
    ({"type": "choice", "values": ["adam", "sgd", 0.1, True]}, space.Choice),
    ({"type": "randint", "upper": 10}, space.RandInt),
    ({"type": "uniform", "minValue": 0.0005, "maxValue": 0.005}, space.Uniform),
    ({"type": "quniform", "minValue": 8, "maxValue": 64, "q": 8}, space.QUniform),
    ({"type": "loguniform", "minValue": -9.2, "maxValue": -4.6}, space.LogUniform),
    ({"type": "qloguniform", "minValue": -9, "maxValue": -2, "q": 0.0001}, space.QLogUniform),
    ({"type": "normal", "mu": 0.0, "sigma": 1.0}, space.Normal),
    ({"type": "qnormal", "mu": 10, "sigma": 2, "q": 1}, space.QNormal),
    ({"type": "lognormal", "mu": -5, "sigma": 0.5}, space.LogNormal),
    ({"type": "qlognormal", "mu": 3, "sigma": 0.5, "q": 2}, space.QLogNormal),
]


@pytest.mark.parametrize(("obj", "cls"), EXPRESSIONS, ids=lambda v: getattr(v, "TYPE", ""))
def test_every_expression_reads_its_json_form_and_writes_it_back(obj: dict[str, Any], cls: type):
    expression = space.parse_expression(obj)
    assert isinstance(expression, cls)
    written = expression.to_json()
    assert written == obj  # numbers compare equal whether int or float
    assert space.parse_expression(written) == expression


def test_the_azure_ml_names_build_the_same_expressions() -> None:
    assert space.choice(16, 32) == space.choice([16, 32]) == space.Choice((16, 32))
    assert space.uniform(0.9, 0.99) == space.parse_expression(
        {"type": "uniform", "minValue": 0.9, "maxValue": 0.99}
    )
    assert space.loguniform(-3, -1).min_value == -3.0  # a logarithm, not the value
    assert space.quniform(0, 10, 1).q == 1 and isinstance(space.quniform(0, 10, 1).q, int)
    assert isinstance(space.qnormal(0, 1, 0.5).q, float)
    made = space.make_space({"momentum": space.uniform(0.9, 0.99), "lr": space.randint(3)})
    assert made.names() == ("lr", "momentum")


def test_the_space_is_ordered_by_name_whatever_the_order_written() -> None:
    a = space.parse_space(
        {"momentum": {"type": "randint", "upper": 2}, "lr": {"type": "randint", "upper": 3}}
    )
    b = space.parse_space(
        {"lr": {"type": "randint", "upper": 3}, "momentum": {"type": "randint", "upper": 2}}
    )
    assert a == b and a.names() == ("lr", "momentum")
    assert space.parse_space(a.to_json()) == a


def one(expression: Any) -> dict[str, Any]:
    return {"p": expression}


def uni(low: Any, high: Any) -> dict[str, Any]:
    return {"type": "uniform", "minValue": low, "maxValue": high}


# (the space, the field named, words of the message): one row per kind of bad input
BAD: list[tuple[str, Any, str, str]] = [
    # the space itself
    ("a list", [uni(0, 1)], "parameters", "must be an object"),
    ("a string", "lr=0.1", "parameters", "must be an object"),
    ("null", None, "parameters", "must be an object"),
    ("empty", {}, "parameters", "empty"),
    ("too many parameters", {f"p{i}": uni(0, 1) for i in range(65)}, "parameters", "at most 64"),
    # names: not --name and TORCHYARD_PARAM_NAME
    ("an empty name", {"": uni(0, 1)}, "parameters.", "not a valid parameter name"),
    ("a digit first", {"1st": uni(0, 1)}, "parameters.1st", "not a valid parameter name"),
    ("a dash", {"learning-rate": uni(0, 1)}, "parameters.learning-rate", "not a valid"),
    ("a space", {"learning rate": uni(0, 1)}, "parameters.learning rate", "not a valid"),
    ("leading dashes", {"--lr": uni(0, 1)}, "parameters.--lr", "not a valid"),
    ("not ASCII", {"lérn": uni(0, 1)}, "parameters.lérn", "not a valid"),
    ("64 characters", {"a" * 64: uni(0, 1)}, f"parameters.{'a' * 64}", "at most 63"),
    ("a number as name", {1: uni(0, 1)}, "parameters.1", "not a valid"),
    (
        "names one variable",
        {"lr": uni(0, 1), "LR": uni(0, 1)},
        "parameters.lr",
        "TORCHYARD_PARAM_LR",
    ),
    # the expression's shape
    ("a bare number", one(0.1), "parameters.p", "must be an object"),
    ("a bare list", one([0.1, 0.2]), "parameters.p", "must be an object"),
    ("no type", one({"minValue": 0, "maxValue": 1}), "parameters.p.type", "is missing"),
    ("the compact form", one({"uniform": [0, 1]}), "parameters.p.type", '{"type": "uniform"'),
    ("an unknown type", one({"type": "beta", "a": 1}), "parameters.p.type", "must be one of"),
    ("a type not a string", one({"type": 3}), "parameters.p.type", "must be one of"),
    ("an unknown field", one({**uni(0, 1), "q": 1}), "parameters.p.q", "not a field of uniform"),
    (
        "a missing field",
        one({"type": "uniform", "minValue": 0}),
        "parameters.p.maxValue",
        "required",
    ),
    # numbers that are not finite numbers
    ("a numeric string", one(uni("0", 1)), "parameters.p.minValue", "must be a number"),
    ("a bool", one(uni(True, 2)), "parameters.p.minValue", "must be a number"),
    ("null bound", one(uni(None, 1)), "parameters.p.minValue", "must be a number"),
    ("NaN", one(uni(math.nan, 1)), "parameters.p.minValue", "finite"),
    ("infinity", one(uni(0, math.inf)), "parameters.p.maxValue", "finite"),
    (
        "-infinity",
        one({"type": "normal", "mu": -math.inf, "sigma": 1}),
        "parameters.p.mu",
        "finite",
    ),
    # ranges
    ("low equal to high", one(uni(1, 1)), "parameters.p.minValue", "less than maxValue"),
    ("low above high", one(uni(2, 1)), "parameters.p.minValue", "less than maxValue"),
    ("a range wider than a float", one(uni(-1e308, 1e308)), "parameters.p.maxValue", "too wide"),
    (
        "loguniform bounds that overflow exp",
        one({"type": "loguniform", "minValue": 0.0001, "maxValue": 1000}),
        "parameters.p.maxValue",
        "natural logarithm",
    ),
    # q
    (
        "q zero",
        one({"type": "quniform", "minValue": 0, "maxValue": 1, "q": 0}),
        "parameters.p.q",
        "greater than 0",
    ),
    (
        "q negative",
        one({"type": "qnormal", "mu": 0, "sigma": 1, "q": -1}),
        "parameters.p.q",
        "greater than 0",
    ),
    (
        "q NaN",
        one({"type": "quniform", "minValue": 0, "maxValue": 1, "q": math.nan}),
        "parameters.p.q",
        "finite",
    ),
    # sigma
    (
        "sigma zero",
        one({"type": "normal", "mu": 0, "sigma": 0}),
        "parameters.p.sigma",
        "greater than 0",
    ),
    (
        "sigma negative",
        one({"type": "lognormal", "mu": 0, "sigma": -1}),
        "parameters.p.sigma",
        "greater than 0",
    ),
    (
        "sigma beyond floats",
        one({"type": "normal", "mu": 0, "sigma": 1e308}),
        "parameters.p.sigma",
        "beyond a float",
    ),
    (
        "lognormal that overflows",
        one({"type": "lognormal", "mu": 700, "sigma": 2}),
        "parameters.p.sigma",
        "overflow",
    ),
    # choice
    ("an empty choice", one({"type": "choice", "values": []}), "parameters.p.values", "empty"),
    (
        "choice of a string",
        one({"type": "choice", "values": "abc"}),
        "parameters.p.values",
        "must be a list",
    ),
    (
        "choice of an object",
        one({"type": "choice", "values": {"a": 1}}),
        "parameters.p.values",
        "must be a list",
    ),
    (
        "a nested list",
        one({"type": "choice", "values": [[1, 2]]}),
        "parameters.p.values[0]",
        "a number, a string",
    ),
    (
        "a null value",
        one({"type": "choice", "values": [1, None]}),
        "parameters.p.values[1]",
        "a number, a string",
    ),
    (
        "a NaN value",
        one({"type": "choice", "values": [1, math.nan]}),
        "parameters.p.values[1]",
        "finite",
    ),
    (
        "a value twice",
        one({"type": "choice", "values": [1, 2, 1]}),
        "parameters.p.values[2]",
        "twice",
    ),
    (
        "1 and '1' read alike",
        one({"type": "choice", "values": [1, "1"]}),
        "parameters.p.values[1]",
        "twice",
    ),
    (
        "a NUL character",
        one({"type": "choice", "values": ["a\x00b"]}),
        "parameters.p.values[0]",
        "NUL",
    ),
    (
        "a huge string",
        one({"type": "choice", "values": ["x" * 2000]}),
        "parameters.p.values[0]",
        "at most 1024",
    ),
    (
        "too many values",
        one({"type": "choice", "values": list(range(1001))}),
        "parameters.p.values",
        "at most 1000",
    ),
    # randint
    ("randint zero", one({"type": "randint", "upper": 0}), "parameters.p.upper", "between 1"),
    ("randint negative", one({"type": "randint", "upper": -3}), "parameters.p.upper", "between 1"),
    ("randint float", one({"type": "randint", "upper": 2.5}), "parameters.p.upper", "integer"),
    ("randint bool", one({"type": "randint", "upper": True}), "parameters.p.upper", "integer"),
    ("randint huge", one({"type": "randint", "upper": 2**60}), "parameters.p.upper", "2**53"),
]


@pytest.mark.parametrize(("case", "obj", "field", "words"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_space_is_refused_naming_the_field(case: str, obj: Any, field: str, words: str):
    with pytest.raises(SpaceError) as caught:
        space.parse_space(obj)
    fields = [p.field for p in caught.value.problems]
    assert field in fields, (case, str(caught.value))
    message = next(p.message for p in caught.value.problems if p.field == field)
    assert words in message, (case, message)
    assert str(caught.value).startswith(fields[0])  # the error's text names the field too


def test_every_problem_of_every_parameter_is_reported_at_once() -> None:
    with pytest.raises(SpaceError) as caught:
        space.parse_space(
            {
                "ok": uni(0, 1),
                "bad-name": uni(0, 1),
                "empty": {"type": "choice", "values": []},
                "sigma": {"type": "normal", "mu": 0, "sigma": -1},
            }
        )
    assert {p.field for p in caught.value.problems} == {
        "parameters.bad-name",
        "parameters.empty.values",
        "parameters.sigma.sigma",
    }


def test_the_field_prefix_is_the_callers() -> None:
    with pytest.raises(SpaceError) as caught:
        space.parse_space({"lr": uni(1, 0)}, field="spec.parameters")
    assert caught.value.problems[0].field == "spec.parameters.lr.minValue"


@pytest.mark.parametrize(
    "build",
    [
        lambda: space.choice(),
        lambda: space.uniform(1, 0),
        lambda: space.normal(0, 0),
        lambda: space.randint(0),
        lambda: space.quniform(0, 1, 0),
    ],
    ids=["empty choice", "uniform low>=high", "sigma 0", "randint 0", "q 0"],
)
def test_the_azure_ml_names_refuse_what_the_json_form_refuses(build: Any) -> None:
    with pytest.raises(SpaceError):
        build()


def test_make_space_refuses_what_is_not_an_expression() -> None:
    with pytest.raises(SpaceError, match="not a parameter expression"):
        space.make_space({"lr": 0.1})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("expression", "hinted"),
    [
        (space.loguniform(0.0001, 0.1), True),  # the values wanted, not their logarithms
        (space.qloguniform(0.001, 1.0, 0.001), True),
        (space.loguniform(math.log(0.0001), math.log(0.1)), False),
        (space.uniform(0.0001, 0.1), False),
    ],
)
def test_loguniform_bounds_that_look_like_values_get_a_hint(expression: Any, hinted: bool):
    found = space.hints(space.make_space({"lr": expression}))
    assert bool(found) is hinted
    if hinted:
        assert found[0].field == "parameters.lr" and "minValue: -" in found[0].message
