"""The observed state of an OnlineEndpoint, as the operator writes it.

Split from ``api.endpoints`` (the spec) as ``trainingrun_status`` is from ``trainingruns``:
the fields of ``status`` with the descriptions ``kubectl explain`` shows. Written by
``status.endpoints``; read by the SDK (``Webservice.state``), the CLI and the web view.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from torchyard.api._base import CONDITIONS_FIELD_EXTRA, Condition, Model, observed_generation
from torchyard.api.trainingrun_status import InputStatus

ENDPOINT_PHASES = ("Pending", "Preparing", "Deploying", "Ready", "Updating", "Degraded", "Failed")
EndpointPhase = Literal[
    "Pending", "Preparing", "Deploying", "Ready", "Updating", "Degraded", "Failed"
]


class EndpointModelRef(Model):
    """The model version the endpoint serves (its spec's, or the Sweep's best)."""

    name: str = Field(description="The model.")
    version: int = Field(description="Its version (the ModelVersion <name>-v<version>).")


class EndpointFailure(Model):
    """Why a serving Pod does not serve: its scoring script's init() raised, it ran out
    of memory, its image cannot be pulled, ..."""

    failure_class: str | None = Field(
        default=None,
        alias="class",
        description="The failure class: a TrainingRun's (ImportError, PythonException, "
        "HostOOM, CudaOOM, ...), the kubelet's reason where none fits (ImagePullBackOff, "
        "...), or InitTimeout: no Pod got ready within the Deployment's progress deadline.",
    )
    exception: str | None = Field(
        default=None, description="The Python exception's class, e.g. FileNotFoundError."
    )
    reason: str | None = Field(
        default=None,
        description="InitFailed (init() raised), RuntimeFailed, OOMKilled, ImagePullBackOff, "
        "CreateContainerConfigError, ...",
    )
    message: str | None = Field(default=None, description="The traceback's tail.")
    advice: str | None = Field(default=None, description="What to do about it.")
    pod: str | None = Field(default=None, description="The Pod that said it.")
    version: int | None = Field(default=None, description="The model version that Pod serves.")
    exit_code: int | None = Field(default=None, description="The serving process's exit code.")
    restarts: int | None = Field(
        default=None, description="How often the kubelet restarted that container."
    )


class EndpointVersion(Model):
    """One model version the endpoint serves, and its share of the requests."""

    version: int = Field(description="The model version.")
    percent: int = Field(description="Its share of the requests, in percent (spec.traffic).")
    deployment: str = Field(description="The Deployment (or InferenceService) that serves it.")
    replicas: int = Field(default=0, description="Pods it asks for.")
    ready_replicas: int = Field(default=0, description="Pods that are ready (init() returned).")
    updated_replicas: int = Field(default=0, description="Pods of its current template.")
    key: str | None = Field(default=None, description="The model's inputs cache entry.")


class OnlineEndpointStatus(Model):
    """Observed state of an OnlineEndpoint, written by the operator."""

    phase: EndpointPhase | None = Field(
        default=None,
        description="Pending (waiting for its Environment, model or Sweep), Preparing "
        "(fetching the model into the inputs cache), Deploying, Ready, Updating (a rollout: "
        "the old Pods serve until the new ones are ready), Degraded (serving, but a version's "
        "Pods fail) or Failed.",
    )
    observed_generation: int | None = observed_generation()
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Accepted, ModelReady, Available (some Pod serves), Ready (every Pod of "
        "the spec serves), and Reconciling, Stalled.",
        json_schema_extra=CONDITIONS_FIELD_EXTRA,
    )
    model: EndpointModelRef | None = Field(default=None, description="The model version served.")
    versions: list[EndpointVersion] | None = Field(
        default=None, description="Each served version, its Pods and share of the requests."
    )
    inputs: list[InputStatus] | None = Field(
        default=None, description="The models' inputs cache entries, once each is ready."
    )
    scoring_uri: str | None = Field(
        default=None,
        description="Where to POST requests in the cluster: http://<name>.<namespace>.svc/score "
        "(Open Inference Protocol: /v1/models/<model>:predict, /v2/models/<model>/infer).",
    )
    replicas: int | None = Field(default=None, description="Serving Pods asked for.")
    ready_replicas: int | None = Field(default=None, description="Serving Pods that are ready.")
    failure: EndpointFailure | None = Field(
        default=None, description="Why a serving Pod fails, when one does."
    )
    message: str | None = Field(default=None, description="What the endpoint waits for or why.")
