"""``Environment``: an ordinary torchyard ``Environment`` resource, built in the cluster
from ``docker.base_image`` + conda/pip into the workspace's ``imageRepository``, or a
prebuilt ("curated") image (``Environment.get``). ``register`` applies it;
``Experiment.submit`` registers the run's. Tested in tests/unit/sdk/test_azureml*.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchyard import api, k8s
from torchyard.sdk.azureml.common import TorchyardSdkError, dns_name

if TYPE_CHECKING:
    from torchyard.sdk.azureml.workspaces import Workspace

DEFAULT_CONDA_BASE_IMAGE = "condaforge/miniforge3:24.11.3-0"


@dataclass
class DockerSection:
    enabled: bool = True
    base_image: str | None = None
    base_dockerfile: str | None = None


@dataclass
class PythonSection:
    conda_dependencies_file: str | None = None
    conda_yaml: str | None = None
    pip_requirements: list[str] = field(default_factory=list)
    user_managed_dependencies: bool = False
    interpreter_path: str = "python3"


class Environment:
    def __init__(self, name: str) -> None:
        self.name = name
        self.docker = DockerSection()
        self.python = PythonSection()
        self.environment_variables: dict[str, str] = {}
        self.image: str | None = None  # curated / already registered
        self._registered = False

    @classmethod
    def from_conda_specification(cls, name: str, file_path: str) -> Environment:
        env = cls(name)
        env.python.conda_dependencies_file = file_path
        env.python.conda_yaml = Path(file_path).read_text()
        return env

    @classmethod
    def from_pip_requirements(cls, name: str, file_path: str) -> Environment:
        env = cls(name)
        env.python.pip_requirements = [
            line.strip()
            for line in Path(file_path).read_text().splitlines()
            if line.strip() and not line.strip().startswith("#")
        ]
        return env

    @classmethod
    def get(cls, workspace: Workspace, name: str, version: str | None = None) -> Environment:
        if version is not None:
            raise TorchyardSdkError(
                f"Environments have no versions here (version={version!r}): an Environment "
                "is one resource whose image is rebuilt when its spec changes; leave version "
                "out, or register the old recipe under another name"
            )
        # An Azure name ('AzureML-PyTorch-1.6-GPU') is the resource register() would make.
        body = k8s.get_or_none(k8s.ENVIRONMENTS, workspace.namespace, dns_name(name))
        if body is None:
            known = ", ".join(sorted(workspace.environments)) or "none"
            raise TorchyardSdkError(
                f"no Environment {name!r} (resource {dns_name(name)}) in namespace "
                f"{workspace.namespace} (there: {known}); "
                "curated Environments come with the Helm chart (values: environments)"
            )
        return cls._from_resource(body)

    @classmethod
    def _from_resource(cls, body: dict[str, Any]) -> Environment:
        env = cls(body["metadata"]["name"])
        spec = body.get("spec", {})
        env.image = spec.get("image")
        env.docker.base_image = spec.get("baseImage")
        env.python.conda_yaml = spec.get("conda")
        env.python.pip_requirements = list(spec.get("pip", []))
        env.python.interpreter_path = spec.get("python", "python3")
        env.environment_variables = dict(spec.get("env", {}))
        env._registered = True
        return env

    def register(self, workspace: Workspace) -> Environment:
        """Create or update the Environment resource (server-side apply)."""
        k8s.apply(self._resource(workspace), field_manager="torchyard-sdk")
        self._registered = True
        return self

    def _resource(self, workspace: Workspace) -> dict[str, Any]:
        spec: dict[str, Any]
        installs = bool(self.python.conda_yaml or self.python.pip_requirements)
        if not self.docker.enabled:
            raise TorchyardSdkError(
                f"Environment {self.name!r}: docker.enabled=False has no meaning here, every "
                "run is a container; leave docker.enabled True"
            )
        if self.python.user_managed_dependencies:
            image = self.docker.base_image or self.image
            if installs or self.environment_variables or not image or self.docker.base_dockerfile:
                raise TorchyardSdkError(
                    f"Environment {self.name!r}: user_managed_dependencies=True runs "
                    "docker.base_image as it is, so it needs a base_image and no conda, pip, "
                    "environment_variables or base_dockerfile; give only the base_image, or "
                    "set user_managed_dependencies=False to have them installed"
                )
            spec = {"image": image}
        elif self.docker.base_dockerfile:
            if installs or self.environment_variables or self.docker.base_image:
                raise TorchyardSdkError(
                    f"Environment {self.name!r}: a base_dockerfile is built as written: put the "
                    "base image, the conda/pip installs and the ENV lines into the Dockerfile, "
                    "or drop base_dockerfile and use docker.base_image"
                )
            spec = {"dockerfile": self.docker.base_dockerfile}
        elif self.image and not self.docker.base_image and not installs:
            if self.environment_variables:
                raise TorchyardSdkError(
                    f"Environment {self.name!r} is the prebuilt image {self.image}, used as it "
                    "is: environment_variables need a build (set docker.base_image to that "
                    "image), or set them in the run (TrainingRun spec.env)"
                )
            spec = {"image": self.image}
        else:
            base = (
                self.docker.base_image
                or self.image
                or (DEFAULT_CONDA_BASE_IMAGE if self.python.conda_yaml else "python:3.11-slim")
            )
            spec = {"baseImage": base}
            if self.python.conda_yaml:
                spec["conda"] = self.python.conda_yaml
            if self.python.pip_requirements:
                spec["pip"] = list(self.python.pip_requirements)
            if self.environment_variables:
                spec["env"] = dict(self.environment_variables)
        if "image" not in spec:
            if not workspace.image_repository:
                raise TorchyardSdkError(
                    f"Environment {self.name!r} is built in the cluster and needs a registry to "
                    'push to: set "imageRepository" in .torchyard/config.json (or '
                    "Workspace(image_repository=...))"
                )
            spec["registry"] = {"repository": workspace.image_repository}
            if workspace.insecure_registry:
                spec["registry"]["insecure"] = True
        if self.python.interpreter_path != "python3":
            spec["python"] = self.python.interpreter_path
        body = {
            "apiVersion": api.API_VERSION,
            "kind": "Environment",
            "metadata": {"name": dns_name(self.name), "namespace": workspace.namespace},
            "spec": spec,
        }
        api.parse_environment(body)
        return body

    def __repr__(self) -> str:
        return f"Environment(name={self.name!r})"


__all__ = ["Environment"]
