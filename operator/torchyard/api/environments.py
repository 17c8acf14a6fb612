"""The Environment resource: a training image (~ Azure ML Environment).

Either prebuilt ("curated": ``image``) or built in the cluster from ``baseImage`` plus
pip/conda packages, cached by a content hash of the build inputs. Typed spec and status
with the CEL rules the apiserver enforces; no I/O here.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import Field, model_validator

from torchyard.api._base import (
    CONDITIONS_FIELD_EXTRA,
    DNS1123_SUBDOMAIN,
    ENV_VAR_NAME,
    Condition,
    Model,
    with_rules,
)
from torchyard.api.wire import API_VERSION


class EnvironmentPhase(str, Enum):
    PENDING = "Pending"
    BUILDING = "Building"
    READY = "Ready"
    FAILED = "Failed"


class Registry(Model):
    """The OCI registry built images are pushed to."""

    repository: str = Field(
        min_length=1,
        description="Repository for built images, e.g. registry.local:5000/envs; the tag "
        "is the content hash of the build inputs.",
    )
    push_secret: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
        description="A kubernetes.io/dockerconfigjson Secret with push credentials.",
    )
    insecure: bool = Field(
        default=False, description="Talk plain HTTP to the registry (test registries only)."
    )


class EnvironmentSpec(Model):
    """Desired state of an Environment: a curated image, or a build recipe."""

    model_config = with_rules(
        {
            "rule": "[has(self.image), has(self.baseImage), has(self.dockerfile)]"
            ".filter(x, x).size() == 1",
            "message": "set exactly one of image (a prebuilt image), baseImage (build on it) "
            "or dockerfile (build it with rootless BuildKit)",
        },
        {
            "rule": "!(has(self.image) || has(self.dockerfile)) || ((!has(self.pip) || "
            "size(self.pip) == 0) && !has(self.conda) && (!has(self.env) || size(self.env) == 0))",
            "message": "pip, conda and env need baseImage: a prebuilt image is used as it is, "
            "a dockerfile says everything itself",
        },
        {
            "rule": "!has(self.pipIndexUrl) || has(self.baseImage)",
            "message": "pipIndexUrl needs baseImage: only a baseImage build runs pip",
            "fieldPath": ".pipIndexUrl",
        },
        {
            "rule": "!(has(self.baseImage) || has(self.dockerfile)) || has(self.registry)",
            "message": "a build (baseImage or dockerfile) needs registry.repository to push to",
            "fieldPath": ".registry",
        },
    )

    image: str | None = Field(
        default=None,
        min_length=1,
        description="A prebuilt (curated) image, e.g. ghcr.io/org/pytorch:2.9-cuda12; "
        "Ready at once.",
    )
    base_image: str | None = Field(
        default=None,
        min_length=1,
        description="Image to build on (it must contain Python); the build runs in it.",
    )
    dockerfile: str | None = Field(
        default=None,
        min_length=1,
        description="A Dockerfile, as text, built with rootless BuildKit (its namespace must "
        "allow Unconfined seccomp and AppArmor); prefer baseImage + pip, which needs no "
        "privileges at all.",
    )
    pip: list[str] = Field(
        default_factory=list,
        description="pip requirements to install, e.g. [torch==2.9.1, pillow].",
    )
    pip_index_url: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://[^\s/]+\S*$",
        description="A PEP 503 simple index the build's pip installs from instead of PyPI "
        "(pip --index-url), e.g. a mirror in the cluster: http://pypi.internal/simple. A "
        "plain-http index is trusted as given (pip --trusted-host): use one only on a network "
        "you trust.",
    )
    conda: str | None = Field(
        default=None,
        description="A conda environment.yml (conda_dependencies.yml), as text.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables baked into the image.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(k, k.matches('" + ENV_VAR_NAME + "'))",
                    "message": "env names must be valid environment variable names",
                }
            ]
        },
    )
    registry: Registry | None = Field(default=None, description="Where a built image is pushed.")
    python: str = Field(
        default="python3",
        description="The Python interpreter of the image (used by the launcher and builds).",
    )

    @model_validator(mode="after")
    def _image_xor_build(self) -> EnvironmentSpec:
        kinds = [self.image, self.base_image, self.dockerfile]
        if sum(k is not None for k in kinds) != 1:
            raise ValueError(
                "set exactly one of image (a prebuilt image), baseImage (build on it) or "
                "dockerfile (build it with rootless BuildKit)"
            )
        if self.base_image is None and (self.pip or self.conda is not None or self.env):
            raise ValueError(
                "pip, conda and env need baseImage: a prebuilt image is used as it is, a "
                "dockerfile says everything itself"
            )
        if self.base_image is None and self.pip_index_url is not None:
            raise ValueError("pipIndexUrl needs baseImage: only a baseImage build runs pip")
        if self.image is None and self.registry is None:
            raise ValueError(
                "a build (baseImage or dockerfile) needs registry.repository to push to"
            )
        return self


class EnvironmentStatus(Model):
    """Observed state of an Environment, written by the operator."""

    phase: EnvironmentPhase | None = Field(
        default=None, description="Pending, Building, Ready or Failed."
    )
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation this status describes."
    )
    image: str | None = Field(
        default=None, description="The image runs use, by digest when known (repo@sha256:...)."
    )
    hash: str | None = Field(
        default=None, description="Content hash of the build inputs (sha256:...)."
    )
    build_job: str | None = Field(default=None, description="Name of the build Job.")
    message: str | None = Field(default=None, description="On failure: the tail of the build log.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Accepted, Ready.",
        json_schema_extra=CONDITIONS_FIELD_EXTRA,
    )


class Environment(Model):
    """An Environment as the API holds it."""

    api_version: str = Field(default=API_VERSION, description="APIVersion.")
    kind: Literal["Environment"] = Field(default="Environment", description="Kind.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard metadata.")
    spec: EnvironmentSpec = Field(description="Desired state.")
    status: EnvironmentStatus = Field(
        default_factory=EnvironmentStatus, description="Observed state."
    )
