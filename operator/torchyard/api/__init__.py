"""Typed, validated specs of torchyard's custom resources (group torchyard.dev/v1alpha1).

Pure: standard library and pydantic only. Everything above this layer parses a resource
body once with :func:`parse_trainingrun` / :func:`parse_environment` and works on the
typed model from then on.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from torchyard.api._base import API_VERSION, CATEGORY, GROUP, VERSION, Condition, Model
from torchyard.api.environments import (
    Environment,
    EnvironmentPhase,
    EnvironmentSpec,
    EnvironmentStatus,
    Registry,
)
from torchyard.api.modelversions import ModelFile, ModelVersion, ModelVersionSpec, SourceRun
from torchyard.api.trainingruns import (
    DEFAULT_MASTER_PORT,
    Compute,
    Distribution,
    EnvVar,
    Failure,
    GitSource,
    NodeCounts,
    Outputs,
    Phase,
    Policy,
    Register,
    Resources,
    Scheduling,
    Source,
    Toleration,
    TrainingRun,
    TrainingRunSpec,
    TrainingRunStatus,
)
from torchyard.launcher import RANK_CONTRACT_VARIABLES


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


__all__ = [
    "API_VERSION",
    "CATEGORY",
    "DEFAULT_MASTER_PORT",
    "GROUP",
    "RANK_CONTRACT_VARIABLES",
    "VERSION",
    "Compute",
    "Condition",
    "Distribution",
    "EnvVar",
    "Environment",
    "EnvironmentPhase",
    "EnvironmentSpec",
    "EnvironmentStatus",
    "Failure",
    "GitSource",
    "InvalidSpec",
    "ModelFile",
    "ModelVersion",
    "ModelVersionSpec",
    "NodeCounts",
    "Outputs",
    "Phase",
    "Policy",
    "Register",
    "Registry",
    "Resources",
    "Scheduling",
    "Source",
    "SourceRun",
    "Toleration",
    "TrainingRun",
    "TrainingRunSpec",
    "TrainingRunStatus",
    "describe",
    "parse_environment",
    "parse_trainingrun",
]
