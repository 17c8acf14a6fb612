"""Parsing resource bodies into the typed models, with errors a user can act on.

Everything above ``torchyard.api`` parses a body once with :func:`parse_trainingrun` /
:func:`parse_environment` / :func:`parse_sweep` / :func:`parse_endpoint` (re-exported by
the package) and works on the typed model after. :func:`parse_document` is what every
command that reads a YAML file goes through (``validate``, ``run --local``, ``submit``,
``sweep submit``): the kind and version of the ``torchyard.dev`` group, then that kind's
model. A field that is not one is named with the nearest field of that object ("did you
mean processCountPerNode?").
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from torchyard.api._base import Model
from torchyard.api.endpoints import OnlineEndpoint
from torchyard.api.environments import Environment
from torchyard.api.modelversions import ModelVersion
from torchyard.api.sweeps import Sweep
from torchyard.api.trainingruns import TrainingRun
from torchyard.api.wire import API_VERSION, GROUP

# The kinds of the torchyard.dev group a file may hold, and their models.
KINDS: dict[str, type[Model]] = {
    "TrainingRun": TrainingRun,
    "Environment": Environment,
    "Sweep": Sweep,
    "ModelVersion": ModelVersion,
    "OnlineEndpoint": OnlineEndpoint,
}


class InvalidSpec(ValueError):
    """A resource body that does not parse: the message names every bad field."""


def _unwrap(annotation: Any) -> list[Any]:
    """The types an annotation may hold a value of (Optional, unions and Annotated undone)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for a in typing.get_args(annotation) for t in _unwrap(a)]
    return [annotation]


def _aliases(model: type[BaseModel]) -> dict[str, Any]:
    """The model's fields as a user writes them (camelCase), with their annotations."""
    return {(f.alias or name): f.annotation for name, f in model.model_fields.items()}


def _models_at(root: type[BaseModel], loc: Sequence[int | str]) -> list[type[BaseModel]]:
    """The models that may be the object at ``loc`` under ``root`` (a list index, a map key
    or a union member's tag in ``loc`` passes through)."""
    current: list[Any] = [root]
    for part in loc:
        following: list[Any] = []
        for kind in current:
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                annotation = _aliases(kind).get(str(part))
                if annotation is not None:
                    following += _unwrap(annotation)
                elif any(c.__name__ == part for c in [kind]):
                    following.append(kind)
                continue
            origin = typing.get_origin(kind)
            if origin in (list, tuple, set, frozenset, Sequence) and isinstance(part, int):
                following += [t for a in typing.get_args(kind) for t in _unwrap(a)]
            elif origin is dict:
                following += _unwrap(typing.get_args(kind)[-1])
        # a tagged union's member: pydantic names it in the location
        named = [k for k in following if isinstance(k, type) and k.__name__ == part]
        current = named or following
        if not current:
            return []
    return [k for k in current if isinstance(k, type) and issubclass(k, BaseModel)]


def nearest_field(root: type[BaseModel], loc: Sequence[int | str]) -> str | None:
    """The field of the object at ``loc[:-1]`` closest to the unknown ``loc[-1]``."""
    if not loc or not isinstance(loc[-1], str):
        return None
    fields = {a for m in _models_at(root, loc[:-1]) for a in _aliases(m)}
    word = loc[-1]
    by_case = {f.lower(): f for f in fields}
    if word.lower() in by_case:
        return by_case[word.lower()]
    found = difflib.get_close_matches(word, sorted(fields), n=1, cutoff=0.6)
    return found[0] if found else None


def describe(err: ValidationError, model: type[BaseModel] | None = None) -> str:
    """One line per problem, with the camelCase path a user wrote (``spec.nodeCount``);
    an unknown field with the nearest one of ``model`` there ("did you mean ...?")."""
    lines = []
    for problem in err.errors():
        path = ".".join(str(p) for p in problem["loc"])
        msg = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            msg = "not a field of this object"
            near = nearest_field(model, problem["loc"]) if model is not None else None
            if near is not None:
                msg += f" (did you mean {near}?)"
        lines.append(f"{path}: {msg}" if path else msg)
    return "; ".join(lines)


def _parse(model: type[Model], body: dict[str, Any]) -> Any:
    try:
        return model.model_validate(
            {k: v for k, v in body.items() if k in ("apiVersion", "kind", "metadata", "spec")}
        )
    except ValidationError as err:
        raise InvalidSpec(describe(err, model)) from None


def parse_trainingrun(body: dict[str, Any]) -> TrainingRun:
    """Parse a TrainingRun body (from the API, a YAML file or the SDK)."""
    run: TrainingRun = _parse(TrainingRun, body)
    return run


def parse_environment(body: dict[str, Any]) -> Environment:
    """Parse an Environment body."""
    env: Environment = _parse(Environment, body)
    return env


def parse_sweep(body: dict[str, Any]) -> Sweep:
    """Parse a Sweep body."""
    sweep: Sweep = _parse(Sweep, body)
    return sweep


def parse_endpoint(body: dict[str, Any]) -> OnlineEndpoint:
    """Parse an OnlineEndpoint body."""
    endpoint: OnlineEndpoint = _parse(OnlineEndpoint, body)
    return endpoint


def is_torchyard(body: Any) -> bool:
    """Whether a document claims the torchyard.dev group (or names no group at all, as a
    hand-written TrainingRun might): the ones :func:`parse_document` checks."""
    if not isinstance(body, dict):
        return True
    version = body.get("apiVersion")
    return version is None or str(version).split("/")[0] == GROUP


def document_name(body: Any) -> str:
    """``Kind/name`` of a document, as messages name it."""
    if not isinstance(body, dict):
        return "?"
    meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    return f"{body.get('kind') or '?'}/{(meta or {}).get('name') or '?'}"


def parse_document(body: Any) -> Model:
    """A document of a torchyard YAML file as its kind's model. InvalidSpec, prefixed with
    ``Kind/name:``, for what is not one: not a mapping, an apiVersion of the group that is
    not served, a kind the group does not have (with the nearest one), a bad field."""
    where = document_name(body)
    if not isinstance(body, dict):
        raise InvalidSpec(f"{where}: a document is a mapping with apiVersion, kind, metadata")
    version, kind = body.get("apiVersion"), body.get("kind")
    if version is None:
        raise InvalidSpec(f"{where}: apiVersion: missing: write apiVersion: {API_VERSION}")
    if version != API_VERSION:
        raise InvalidSpec(
            f"{where}: apiVersion: {version} is not served: torchyard's resources are {API_VERSION}"
        )
    model = KINDS.get(str(kind))
    if model is None:
        near = difflib.get_close_matches(str(kind), list(KINDS), n=1, cutoff=0.5)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise InvalidSpec(
            f"{where}: kind: {kind} is not a kind of {API_VERSION}{hint}; the kinds are "
            f"{', '.join(KINDS)}"
        )
    try:
        parsed: Model = _parse(model, body)
    except InvalidSpec as err:
        raise InvalidSpec(f"{where}: {err}") from None
    return parsed
