"""The ModelVersion resource: one immutable, verified version of a registered model.

Made by the operator when a run's outputs are promoted in the model registry
(~ Azure ML run.register_model); the files live on the registry's volume, the
resource records what they are. The whole spec is immutable (a CEL rule).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from torchyard.api._base import CONDITIONS_FIELD_EXTRA, DNS1123_LABEL, Condition, Model
from torchyard.api.wire import API_VERSION


class ModelFile(Model):
    """One file of a model version."""

    path: str = Field(min_length=1, description="Path inside the version folder.")
    size: int = Field(ge=0, description="Size in bytes.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the content, hex.")


class SourceRun(Model):
    """The TrainingRun that produced the version."""

    name: str = Field(min_length=1, description="Name of the TrainingRun.")
    uid: str | None = Field(default=None, description="UID of the TrainingRun.")


class ModelVersionSpec(Model):
    """What a model version is; immutable once created."""

    model: str = Field(max_length=63, pattern=DNS1123_LABEL, description="Model name.")
    version: int = Field(ge=1, description="Version number, 1, 2, 3 ... per model.")
    run: SourceRun = Field(description="The TrainingRun whose outputs this version holds.")
    files: list[ModelFile] = Field(
        default_factory=list, max_length=10000, description="Files with sizes and sha256."
    )
    total_bytes: int = Field(default=0, ge=0, description="Sum of the files' sizes.")
    size: str = Field(default="0 B", description="total_bytes for display, e.g. '42.1 MiB'.")
    environment_image: str | None = Field(
        default=None, description="The image (by digest) the run trained in."
    )
    command: list[str] = Field(default_factory=list, description="The run's command.")
    metrics: dict[str, float] = Field(
        default_factory=dict, description="Final metrics from outputs/metrics.json."
    )
    storage_path: str | None = Field(
        default=None, description="Folder of the version on the registry volume."
    )


class ModelVersionStatus(Model):
    """Observed state of a ModelVersion."""

    created_time: datetime | None = Field(default=None, description="When it was published.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Available: the files are on the registry volume and verified.",
        json_schema_extra=CONDITIONS_FIELD_EXTRA,
    )


class ModelVersion(Model):
    """A ModelVersion as the API holds it."""

    api_version: str = Field(default=API_VERSION, description="APIVersion.")
    kind: Literal["ModelVersion"] = Field(default="ModelVersion", description="Kind.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard metadata.")
    spec: ModelVersionSpec = Field(description="What the version is.")
    status: ModelVersionStatus = Field(
        default_factory=ModelVersionStatus, description="Observed state."
    )
