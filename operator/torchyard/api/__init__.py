"""Typed, validated specs of torchyard's custom resources (group torchyard.dev/v1alpha1).

Pure: standard library and pydantic only. Everything above this layer parses a resource
body once with :func:`parse_trainingrun` / :func:`parse_environment` /
:func:`parse_sweep` / :func:`parse_endpoint` and works on the typed model from then on.
"""

from __future__ import annotations

from torchyard.api._base import API_VERSION, CATEGORY, GROUP, VERSION, Condition
from torchyard.api.endpoint_status import (
    EndpointFailure,
    EndpointModelRef,
    EndpointVersion,
    OnlineEndpointStatus,
)
from torchyard.api.endpoints import (
    Autoscaling,
    EndpointModel,
    OnlineEndpoint,
    OnlineEndpointSpec,
    ServingLimits,
    ServingResources,
)
from torchyard.api.environments import (
    Environment,
    EnvironmentPhase,
    EnvironmentSpec,
    EnvironmentStatus,
    Registry,
)
from torchyard.api.inputs import Input
from torchyard.api.modelversions import ModelFile, ModelVersion, ModelVersionSpec, SourceRun
from torchyard.api.parsing import (
    InvalidSpec,
    describe,
    parse_endpoint,
    parse_environment,
    parse_sweep,
    parse_trainingrun,
)
from torchyard.api.policies import Policy
from torchyard.api.sweeps import (
    EarlyTermination,
    Objective,
    ParameterExpression,
    Sweep,
    SweepSpec,
    SweepStatus,
)
from torchyard.api.trainingrun_status import (
    Failure,
    NodeCounts,
    Phase,
    QueuePlace,
    TrainingRunStatus,
)
from torchyard.api.trainingruns import (
    Compute,
    Distribution,
    EnvVar,
    GitSource,
    Outputs,
    Register,
    Resources,
    Scheduling,
    Source,
    Toleration,
    TrainingRun,
    TrainingRunSpec,
)
from torchyard.api.wire import DEFAULT_MASTER_PORT
from torchyard.launch.contract import RANK_CONTRACT_VARIABLES

__all__ = [
    "API_VERSION",
    "CATEGORY",
    "DEFAULT_MASTER_PORT",
    "GROUP",
    "RANK_CONTRACT_VARIABLES",
    "VERSION",
    "Autoscaling",
    "Compute",
    "Condition",
    "Distribution",
    "EarlyTermination",
    "EndpointFailure",
    "EndpointModel",
    "EndpointModelRef",
    "EndpointVersion",
    "EnvVar",
    "Environment",
    "EnvironmentPhase",
    "EnvironmentSpec",
    "EnvironmentStatus",
    "Failure",
    "GitSource",
    "Input",
    "InvalidSpec",
    "ModelFile",
    "ModelVersion",
    "ModelVersionSpec",
    "NodeCounts",
    "Objective",
    "OnlineEndpoint",
    "OnlineEndpointSpec",
    "OnlineEndpointStatus",
    "Outputs",
    "ParameterExpression",
    "Phase",
    "Policy",
    "QueuePlace",
    "Register",
    "Registry",
    "Resources",
    "Scheduling",
    "ServingLimits",
    "ServingResources",
    "Source",
    "SourceRun",
    "Sweep",
    "SweepSpec",
    "SweepStatus",
    "Toleration",
    "TrainingRun",
    "TrainingRunSpec",
    "TrainingRunStatus",
    "describe",
    "parse_endpoint",
    "parse_environment",
    "parse_sweep",
    "parse_trainingrun",
]
