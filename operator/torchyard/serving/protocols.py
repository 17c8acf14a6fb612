"""The Open Inference Protocol over the guide's ``run(raw_data)``: what one request of
KServe's V1 or V2 REST protocol hands to ``run()``, and how ``run()``'s answer goes back.

- V1 ``POST /v1/models/<m>:predict`` ``{"instances": [...]}``: ``run()`` gets
  ``{"data": <instances>}`` (the guide's scripts read ``json.loads(raw_data)["data"]``);
  its answer is ``{"predictions": <answer>}`` (a list as it is, anything else in one).
- V2 ``POST /v2/models/<m>/infer`` ``{"inputs": [{"name", "shape", "datatype", "data"}]}``:
  ``run()`` gets ``{<name>: <data, nested by shape>}`` for every input (an input named
  ``data`` is what the guide's scripts read); a dict answer is one output per key, anything
  else the one output ``output-0``, each with a datatype and shape of its values.

Pure and standard library only (the runtime ships it into user images); called by
``serving.app``; tested in tests/unit/serving/test_protocols.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

# V2's datatypes of JSON's values (a tensor of strings is BYTES).
_DATATYPES = ((bool, "BOOL"), (int, "INT64"), (float, "FP64"), (str, "BYTES"))
MAX_ELEMENTS = 1 << 26  # what one V2 input's shape may hold (the body limit comes first)


class ProtocolError(ValueError):
    """A request the protocol cannot take (400), with what is wrong."""


def v1_raw(body: Any) -> str:
    """``run()``'s raw_data of a V1 predict request."""
    if not isinstance(body, dict) or not isinstance(body.get("instances"), list):
        raise ProtocolError('a V1 predict request is {"instances": [...]}')
    return json.dumps({"data": body["instances"]})


def v1_answer(result: Any) -> dict[str, Any]:
    return {"predictions": result if isinstance(result, list) else [result]}


def _shaped(flat: Sequence[Any], shape: Sequence[int]) -> Any:
    """``flat`` (row-major) as nested lists of ``shape``."""
    if len(shape) <= 1:
        return list(flat)
    step = len(flat) // shape[0] if shape[0] else 0
    return [_shaped(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    for item in data:
        out.extend(_flatten(item))
    return out


def _input(tensor: Any) -> tuple[str, Any]:
    """(name, nested data) of one V2 input tensor, checked against its shape."""
    if not isinstance(tensor, dict):
        raise ProtocolError("each V2 input is an object with name, shape, datatype and data")
    name, shape, data = tensor.get("name"), tensor.get("shape"), tensor.get("data")
    if not isinstance(name, str) or not name:
        raise ProtocolError("a V2 input needs a name")
    if (
        not isinstance(shape, list)
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        or math.prod(shape) > MAX_ELEMENTS
    ):
        raise ProtocolError(f"input {name!r}: shape must be a list of sizes (>= 0)")
    if not isinstance(tensor.get("datatype"), str):
        raise ProtocolError(f"input {name!r}: datatype is required (FP32, INT64, BYTES, ...)")
    flat = _flatten(data)
    if len(flat) != math.prod(shape):
        raise ProtocolError(
            f"input {name!r}: shape {shape} holds {math.prod(shape)} values, data has {len(flat)}"
        )
    return name, _shaped(flat, shape)


def v2_raw(body: Any) -> str:
    """``run()``'s raw_data of a V2 infer request: ``{name: nested data}``."""
    if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
        raise ProtocolError('a V2 infer request is {"inputs": [{"name", "shape", ...}]}')
    named = dict(_input(t) for t in body["inputs"])
    if len(named) != len(body["inputs"]):
        raise ProtocolError("two V2 inputs have the same name")
    return json.dumps(named)


def _datatype(values: Sequence[Any]) -> str:
    kinds = {next((dt for t, dt in _DATATYPES if type(v) is t), "BYTES") for v in values}
    if kinds <= {"INT64", "FP64"} and len(kinds) == 2:
        return "FP64"
    return kinds.pop() if len(kinds) == 1 else "BYTES"


def _shape(value: Any) -> list[int]:
    if not isinstance(value, list):
        return [1]
    if value and all(isinstance(v, list) for v in value):
        inner = {tuple(_shape(v)) for v in value}
        if len(inner) == 1:
            return [len(value), *inner.pop()]
    return [len(value)]


def _output(name: str, value: Any) -> dict[str, Any]:
    flat = _flatten(value)
    datatype = _datatype(flat)
    if datatype == "BYTES":
        flat = [v if isinstance(v, str) else json.dumps(v) for v in flat]
    return {"name": name, "datatype": datatype, "shape": _shape(value), "data": flat}


def v2_answer(result: Any, model: str, version: str, request_id: Any = None) -> dict[str, Any]:
    """The V2 response of ``run()``'s ``result``."""
    outputs = (
        [_output(str(k), v) for k, v in result.items()]
        if isinstance(result, Mapping)
        else [_output("output-0", result)]
    )
    answer: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": outputs}
    if isinstance(request_id, str):
        answer["id"] = request_id
    return answer


def v2_metadata(model: str, version: str) -> dict[str, Any]:
    """What ``GET /v2/models/<m>`` says: a scoring script names no tensors."""
    return {
        "name": model,
        "versions": [version],
        "platform": "torchyard-score",
        "inputs": [],
        "outputs": [],
    }
