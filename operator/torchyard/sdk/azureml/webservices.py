"""Deploying a registered model, with the Azure ML SDK's names: ``InferenceConfig``,
``Model.deploy`` (with a deployment configuration of ``deployments``) and the
``Webservice`` it returns (``wait_for_deployment``, ``run``,
``get_logs``, ``update``, ``delete``, ``scoring_uri``, ``state``, ``get_token``).

``Model.deploy`` makes an OnlineEndpoint: the model version (one model per endpoint), the
inference Environment registered as ``Experiment.submit`` registers a run's, the scoring
code stored as a snapshot of ``source_directory`` (default: the entry script's folder),
and the deployment configuration's CPU, memory, GPUs, replicas or autoscaling and limits.
Unlike ACI's default, the endpoint asks its callers for a token unless
``auth_enabled=False`` is given; ``run`` mints one (``sdk.endpoints.invoke``). Arguments
that have no meaning here (keys, TLS certificates, Application Insights, regions ...) are
refused, never dropped. Tested in tests/unit/sdk/test_webservices.py and, the notebook's
flow on the real node, in tests/node/test_endpoints_on_node.py.
"""

from __future__ import annotations

import builtins
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchyard import api, k8s
from torchyard.sdk import endpoints as endpoint_sdk
from torchyard.sdk import snapshots
from torchyard.sdk.azureml.common import TorchyardSdkError, dns_name, refuse
from torchyard.sdk.azureml.deployments import DeploymentConfiguration
from torchyard.sdk.azureml.environments import Environment

if TYPE_CHECKING:
    from torchyard.sdk.azureml.models import Model
    from torchyard.sdk.azureml.workspaces import Workspace

# An endpoint's phase as Azure ML names a Webservice's state.
STATES = {
    "Pending": "Transitioning",
    "Preparing": "Transitioning",
    "Deploying": "Transitioning",
    "Updating": "Transitioning",
    "Ready": "Healthy",
    "Degraded": "Unhealthy",
    "Failed": "Failed",
}
FIELD_MANAGER = "torchyard-sdk"


class WebserviceException(TorchyardSdkError):
    """A deployment that failed, a request the service refused (Azure ML's name)."""


class InferenceConfig:
    """The scoring script and the Environment that runs it (~ Azure ML's)."""

    def __init__(
        self,
        entry_script: str,
        runtime: str | None = None,
        conda_file: str | None = None,
        extra_docker_file_steps: str | None = None,
        source_directory: str | None = None,
        enable_gpu: bool | None = None,
        description: str | None = None,
        base_image: str | None = None,
        base_image_registry: Any = None,
        cuda_version: str | None = None,
        environment: Environment | None = None,
    ) -> None:
        refuse(
            "InferenceConfig",
            {
                "runtime": (runtime, None),
                "conda_file": (conda_file, None),
                "extra_docker_file_steps": (extra_docker_file_steps, None),
                "enable_gpu": (enable_gpu, None),
                "base_image": (base_image, None),
                "base_image_registry": (base_image_registry, None),
                "cuda_version": (cuda_version, None),
            },
            "give the image and its packages as an Environment (environment=...): a training "
            "Environment serves as it is; GPUs come from the deployment configuration",
        )
        if environment is None:
            raise TorchyardSdkError(
                "InferenceConfig needs environment=...: the Environment whose image runs the "
                "scoring script (the training one serves as it is)"
            )
        self.entry_script = entry_script
        self.source_directory = source_directory
        self.description = description
        self.environment = environment


def deploy(
    workspace: Workspace,
    name: str,
    models: list[Model],
    inference_config: InferenceConfig | None,
    deployment_config: DeploymentConfiguration | None,
    *,
    overwrite: bool,
) -> Webservice:
    """``Model.deploy``: the OnlineEndpoint of ``models[0]`` (see the module docstring)."""
    if inference_config is None:
        raise TorchyardSdkError(
            "Model.deploy needs an inference_config: InferenceConfig(entry_script=..., "
            "environment=...) (no-code deployment of a framework model is not supported)"
        )
    if len(models) != 1:
        raise TorchyardSdkError(
            f"Model.deploy serves one model per endpoint here, got {len(models)}: deploy each "
            "model to an endpoint of its own"
        )
    ns = workspace.namespace
    endpoint = dns_name(name)
    existing = k8s.get_or_none(k8s.ONLINEENDPOINTS, ns, endpoint)
    if existing is not None and not overwrite:
        raise WebserviceException(
            f"a service named {name!r} (OnlineEndpoint {ns}/{endpoint}) exists already: pass "
            "overwrite=True, call service.update(...), or delete it first"
        )
    body = endpoint_body(workspace, endpoint, models[0], inference_config, deployment_config)
    k8s.apply(body, field_manager=FIELD_MANAGER)
    print(f"OnlineEndpoint {ns}/{endpoint} applied", file=sys.stderr)
    return Webservice(workspace, name)


def endpoint_body(
    workspace: Workspace,
    endpoint: str,
    model: Model,
    config: InferenceConfig,
    deployment: DeploymentConfiguration | None,
) -> dict[str, Any]:
    """The OnlineEndpoint (its Environment registered, its code stored: the side effects)."""
    env = config.environment
    assert env is not None
    if not env._registered or env.python.conda_yaml or env.python.pip_requirements:
        env.register(workspace)
    entry = Path(config.entry_script)
    folder = Path(config.source_directory) if config.source_directory else entry.parent
    script = entry.relative_to(folder) if config.source_directory is None else entry
    if not (folder / script).is_file():
        raise TorchyardSdkError(f"the entry script {folder / script} does not exist")
    snap = snapshots.snapshot(folder)
    try:
        print(snap.report(), file=sys.stderr)
        snapshots.store(snap, workspace.namespace, workspace.registry)
        source = snap.source
    finally:
        snap.close()
    deployment = deployment or DeploymentConfiguration()
    spec: dict[str, Any] = {
        "model": {"uri": f"model://{model.name}/{model.version}"},
        "environment": dns_name(env.name),
        "source": source,
        "entryScript": script.as_posix(),
        **deployment.spec(),
    }
    if workspace.service_account:
        spec["serviceAccountName"] = workspace.service_account
    metadata: dict[str, Any] = {"name": endpoint, "namespace": workspace.namespace}
    if deployment.tags:
        metadata["labels"] = {dns_name(k): dns_name(v) for k, v in deployment.tags.items()}
    body = {
        "apiVersion": api.API_VERSION,
        "kind": "OnlineEndpoint",
        "metadata": metadata,
        "spec": spec,
    }
    api.parse_endpoint(body)
    return body


class Webservice:
    """A deployed model (an OnlineEndpoint), by name (~ Azure ML's Webservice)."""

    def __init__(self, workspace: Workspace, name: str) -> None:
        self.workspace = workspace
        self.name = dns_name(name)
        self._ns = workspace.namespace
        endpoint_sdk.get(self._ns, self.name)  # EndpointNotFound when there is none

    @classmethod
    def list(cls, workspace: Workspace) -> list[Webservice]:
        return [
            cls(workspace, e["metadata"]["name"])
            for e in endpoint_sdk.list_endpoints(workspace.namespace)
        ]

    def _status(self) -> dict[str, Any]:
        status: dict[str, Any] = endpoint_sdk.get(self._ns, self.name).get("status") or {}
        return status

    @property
    def state(self) -> str:
        return STATES.get(str(self._status().get("phase") or "Pending"), "Transitioning")

    @property
    def scoring_uri(self) -> str | None:
        uri = self._status().get("scoringUri")
        return str(uri) if uri else None

    def wait_for_deployment(
        self, show_output: bool = False, timeout_sec: float | None = None
    ) -> None:
        """Until every Pod serves; WebserviceException when the deployment failed."""
        deadline = None if timeout_sec is None else time.monotonic() + timeout_sec
        said = ""
        while True:
            status = self._status()
            phase = str(status.get("phase") or "Pending")
            line = f"{phase}: {status.get('message') or ''}".rstrip(": ")
            if show_output and line != said:
                print(line, flush=True)
                said = line
            if phase == "Ready":
                if show_output:
                    print(f"Healthy: {status.get('scoringUri')}", flush=True)
                return
            if phase in ("Failed", "Degraded"):
                raise WebserviceException(_failure_text(self.name, status))
            if deadline is not None and time.monotonic() > deadline:
                raise WebserviceException(
                    f"service {self.name} is still {phase} after {timeout_sec}s: {line}"
                )
            time.sleep(1.0)

    def run(self, input_data: str | bytes) -> Any:
        """Call the service with ``input_data`` (the scoring script's raw_data); what it
        answered, parsed from JSON."""
        data = input_data.encode() if isinstance(input_data, str) else input_data
        answer = endpoint_sdk.invoke(
            self._ns, self.name, data, service_account=self.workspace.service_account or "default"
        )
        text = answer.body.decode("utf-8", "replace")
        if answer.status != 200:
            raise WebserviceException(f"service {self.name} answered {answer.status}: {text}")
        try:
            return json.loads(text)
        except ValueError:
            return text

    def get_token(self) -> tuple[str, float]:
        """A token for this service and when to get a new one (Unix time)."""
        minted = endpoint_sdk.token(
            self._ns, self.name, self.workspace.service_account or "default"
        )
        return minted, time.time() + endpoint_sdk.TOKEN_SECONDS - 60

    def get_logs(self, num_lines: int = 5000) -> str:
        sections = endpoint_sdk.logs(self._ns, self.name, num_lines)
        return "\n".join(f"== {pod} ==\n" + "\n".join(lines) for pod, lines in sections.items())

    def update(
        self,
        models: builtins.list[Model] | None = None,
        inference_config: InferenceConfig | None = None,
        deployment_config: DeploymentConfiguration | None = None,
    ) -> None:
        """A new model version or code: the Pods roll, the old ones serve until the new
        ones are ready. (Give the models and the inference config: the SDK does not read
        back the code a running endpoint was made from.)"""
        if not models or inference_config is None:
            raise TorchyardSdkError(
                "Webservice.update needs models=[...] and inference_config=...: the endpoint is "
                "applied again from them (and deployment_config, when given)"
            )
        deploy(
            self.workspace, self.name, models, inference_config, deployment_config, overwrite=True
        )

    def delete(self) -> None:
        endpoint_sdk.delete(self._ns, self.name)

    def __repr__(self) -> str:
        return f"Webservice(name={self.name!r}, state={self.state!r})"


def _failure_text(name: str, status: dict[str, Any]) -> str:
    failure = status.get("failure") or {}
    text = f"service {name} failed: {status.get('message') or status.get('phase')}"
    if failure.get("message"):
        text += f"\n{failure['message']}"
    return text + "\n(service.get_logs() has the Pods' logs)"


__all__ = [
    "InferenceConfig",
    "Webservice",
    "WebserviceException",
]
