"""The Open Inference Protocol over run(raw_data): what run() gets of a V1 or V2 request,
and what goes back (torchyard.serving.protocols)."""

from __future__ import annotations

import json

import pytest

from torchyard.serving import protocols
from torchyard.serving.protocols import ProtocolError


def test_v1_instances_reach_run_as_the_guides_data() -> None:
    raw = protocols.v1_raw({"instances": [[1, 2], [3, 4]]})
    assert json.loads(raw) == {"data": [[1, 2], [3, 4]]}
    assert protocols.v1_answer({"label": "turkey"}) == {"predictions": [{"label": "turkey"}]}
    assert protocols.v1_answer([1, 2]) == {"predictions": [1, 2]}


@pytest.mark.parametrize("body", [None, [], {"inputs": []}, {"instances": "x"}, "text"])
def test_a_v1_body_without_instances_is_refused(body: object) -> None:
    with pytest.raises(ProtocolError, match="instances"):
        protocols.v1_raw(body)


def test_v2_inputs_reach_run_by_name_and_nested_by_their_shape() -> None:
    body = {
        "inputs": [
            {"name": "data", "shape": [1, 2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]},
            {"name": "k", "shape": [2], "datatype": "INT64", "data": [[7], [8]]},
        ]
    }
    assert json.loads(protocols.v2_raw(body)) == {"data": [[[1, 2, 3], [4, 5, 6]]], "k": [7, 8]}


@pytest.mark.parametrize(
    "tensor, said",
    [
        ({"shape": [1], "datatype": "FP32", "data": [1]}, "needs a name"),
        ({"name": "x", "shape": [2], "datatype": "FP32", "data": [1]}, "holds 2 values"),
        ({"name": "x", "shape": [-1], "datatype": "FP32", "data": []}, "shape must be"),
        ({"name": "x", "shape": [True], "datatype": "FP32", "data": [1]}, "shape must be"),
        ({"name": "x", "shape": [1 << 30, 1 << 30], "datatype": "FP32", "data": []}, "shape"),
        ({"name": "x", "shape": [1], "data": [1]}, "datatype is required"),
        ("x", "each V2 input"),
    ],
)
def test_a_v2_input_that_does_not_hold_together_is_refused(tensor: object, said: str) -> None:
    with pytest.raises(ProtocolError, match=said):
        protocols.v2_raw({"inputs": [tensor]})


def test_two_v2_inputs_of_one_name_are_refused() -> None:
    one = {"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}
    with pytest.raises(ProtocolError, match="same name"):
        protocols.v2_raw({"inputs": [one, one]})


def test_a_v2_answer_has_one_output_per_key_with_its_datatype_and_shape() -> None:
    answer = protocols.v2_answer(
        {"label": "turkey", "probability": 0.97, "scores": [[1, 2], [3, 4]], "ok": True},
        "birds",
        "2",
        "req-1",
    )
    assert answer["model_name"] == "birds" and answer["model_version"] == "2"
    assert answer["id"] == "req-1"
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert outputs["label"] == {
        "name": "label",
        "datatype": "BYTES",
        "shape": [1],
        "data": ["turkey"],
    }
    assert outputs["probability"]["datatype"] == "FP64"
    assert outputs["scores"] == {
        "name": "scores",
        "datatype": "INT64",
        "shape": [2, 2],
        "data": [1, 2, 3, 4],
    }
    assert outputs["ok"]["datatype"] == "BOOL"


def test_an_answer_that_is_not_a_dict_is_one_output() -> None:
    answer = protocols.v2_answer([1, 2.5], "m", "1")
    assert answer["outputs"] == [
        {"name": "output-0", "datatype": "FP64", "shape": [2], "data": [1, 2.5]}
    ]
    assert "id" not in answer
    mixed = protocols.v2_answer([{"a": 1}, "b"], "m", "1")["outputs"][0]
    assert mixed["datatype"] == "BYTES" and mixed["data"] == ['{"a": 1}', "b"]
