"""Parsing resource bodies into the typed models, with errors a user can act on.

Everything above ``torchyard.api`` parses a body once with :func:`parse_trainingrun` /
:func:`parse_environment` / :func:`parse_sweep` (re-exported by the package) and works on
the typed model after.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from torchyard.api._base import Model
from torchyard.api.environments import Environment
from torchyard.api.sweeps import Sweep
from torchyard.api.trainingruns import TrainingRun


class InvalidSpec(ValueError):
    """A resource body that does not parse: the message names every bad field."""


def describe(err: ValidationError) -> str:
    """One line per problem, with the camelCase path a user wrote (``spec.nodeCount``)."""
    lines = []
    for problem in err.errors():
        path = ".".join(str(p) for p in problem["loc"])
        msg = problem["msg"].removeprefix("Value error, ")
        lines.append(f"{path}: {msg}" if path else msg)
    return "; ".join(lines)


def _parse(model: type[Model], body: dict[str, Any]) -> Any:
    try:
        return model.model_validate(
            {k: v for k, v in body.items() if k in ("apiVersion", "kind", "metadata", "spec")}
        )
    except ValidationError as err:
        raise InvalidSpec(describe(err)) from None


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
