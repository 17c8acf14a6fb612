"""Registering a model from a run (``Run.register_model``) and the ``Model`` it returns
(whose ``Model.deploy`` serves it: ``webservices``).
The one promote path: the metadata from ``torchyard.planning.models``, the HTTP promote
through the registry client, then the ModelVersion ``<model>-v<N>`` and its status, as
the operator records them. Tested in tests/unit/registry/test_client.py and
tests/integration/test_azureml.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchyard import api, k8s, status
from torchyard.planning import models as manifests
from torchyard.sdk.azureml.common import TorchyardSdkError, dns_name, refuse
from torchyard.sdk.local_registry import LocalRegistry
from torchyard.sdk.registry import RegistryError

if TYPE_CHECKING:
    from torchyard.sdk.azureml.deployments import DeploymentConfiguration
    from torchyard.sdk.azureml.experiments import Run
    from torchyard.sdk.azureml.webservices import InferenceConfig, Webservice
    from torchyard.sdk.azureml.workspaces import Workspace


class Model:
    """A registered model version: ``Model(ws, name="pytorch-birds")`` (its latest version),
    ``Model(ws, name=..., version=2)`` or ``Model(ws, id="pytorch-birds:2")``, read from
    the registry service, as Azure ML's constructor does; ``register_model`` returns one."""

    def __init__(
        self,
        workspace: Workspace,
        name: str | None = None,
        version: int | None = None,
        manifest: dict[str, Any] | None = None,
        *,
        id: str | None = None,
        registry: LocalRegistry | None = None,
    ) -> None:
        if id is not None:
            name, _, number = id.partition(":")
            version = int(number) if number.isdigit() else None
        if not name:
            raise TorchyardSdkError(
                "Model(workspace, name=...) or Model(workspace, id='name:version')"
            )
        if manifest is None:
            try:
                manifest = workspace.registry().manifest(
                    workspace.namespace, dns_name(name), version
                )
            except (RegistryError, k8s.Unreachable) as err:
                raise TorchyardSdkError(
                    f"no model {name} (version {version or 'latest'}): {err}"
                ) from None
        self.workspace = workspace
        self.name = str(manifest.get("model") or dns_name(name))
        self.version = int(manifest.get("version") or version or 0)
        self.id = f"{self.name}:{self.version}"
        self.manifest = manifest
        self._local = registry  # a version of the local registry (a local run's)

    def download(self, target_dir: str = ".", exist_ok: bool = False) -> str:
        dest = Path(target_dir)
        if dest.exists() and any(dest.iterdir()) and not exist_ok:
            raise TorchyardSdkError(f"{dest} is not empty (pass exist_ok=True)")
        source = self._local if self._local is not None else self.workspace.registry()
        source.download(self.workspace.namespace, self.name, self.version, dest)
        return str(dest)

    @staticmethod
    def deploy(
        workspace: Workspace,
        name: str,
        models: list[Model],
        inference_config: InferenceConfig | None = None,
        deployment_config: DeploymentConfiguration | None = None,
        deployment_target: Any = None,
        overwrite: bool = False,
        show_output: bool = False,
    ) -> Webservice:
        """Serve ``models`` (one) as OnlineEndpoint ``name`` (``webservices.deploy``); the
        cluster is the workspace's (``deployment_target`` must be left out)."""
        from torchyard.sdk.azureml import webservices  # (it imports this module's users)

        refuse(
            "Model.deploy",
            {"deployment_target": (deployment_target, None)},
            "the endpoint runs in the workspace's namespace; pick nodes with the "
            "deployment configuration (GPUs) or the OnlineEndpoint's spec.compute",
        )
        service = webservices.deploy(
            workspace, name, models, inference_config, deployment_config, overwrite=overwrite
        )
        if show_output:
            service.wait_for_deployment(show_output=True)
        return service

    def __repr__(self) -> str:
        return f"Model(name={self.name!r}, version={self.version})"


@dataclass(frozen=True)
class Registration:
    """What ``Run.register_model`` asks for: ``model_path`` of the run's archive as the
    next version of ``model_name``, with the version's metadata (``framework``: name and
    version, empty when not given). A cluster run's goes through :func:`register`, a local
    run's into the local registry (``local_target``)."""

    model_name: str
    model_path: str
    tags: dict[str, str]
    properties: dict[str, Any]
    framework: tuple[str, str]
    description: str

    @property
    def model(self) -> str:
        """The model's name as a resource name."""
        return dns_name(self.model_name)

    def metadata(
        self, run: api.TrainingRun, image: str, *, local: bool = False
    ) -> manifests.PromoteMetadata:
        """The version's metadata, made from ``run`` (``image``: its Environment's)."""
        name, version = self.framework
        return manifests.promote_metadata(
            run,
            image=image,
            tags=self.tags,
            properties=self.properties,
            description=self.description,
            framework=manifests.Framework(name=name, version=version) if name or version else None,
            local=local,
        )


def require_succeeded(run_id: str, body: dict[str, Any]) -> None:
    """TorchyardSdkError unless the run ``body`` Succeeded: a model comes from a completed run."""
    phase = (body.get("status") or {}).get("phase")
    if phase != "Succeeded":
        raise TorchyardSdkError(
            f"run {run_id} has not succeeded ({phase}): register a model from a completed run"
        )


def register(run: Run, wanted: Registration) -> Model:
    """``Run.register_model`` of a cluster run: the registry service promotes
    ``wanted.model_path`` of ``run``'s archive to the model's next version, recorded as a
    ModelVersion."""
    body = run._body()
    require_succeeded(run.id, body)
    model = wanted.model
    model_path = wanted.model_path
    env = k8s.get_or_none(k8s.ENVIRONMENTS, run._ns, body["spec"]["environment"]) or {}
    image = str(env.get("status", {}).get("image") or "")
    uid = str(body["metadata"].get("uid", ""))
    try:
        spec = api.parse_trainingrun(body)
    except api.InvalidSpec as err:
        raise TorchyardSdkError(f"run {run.id} cannot be read: {err}") from None
    meta = wanted.metadata(spec, image)
    try:
        manifest = run.experiment.workspace.registry().promote(
            run._ns, model, run.id, model_path, meta
        )
    except (RegistryError, k8s.Unreachable) as err:
        raise TorchyardSdkError(f"cannot register {wanted.model_name}: {err}") from None
    mv = k8s.apply(
        manifests.model_version(
            run._ns,
            model,
            manifest,
            run=run.id,
            run_uid=uid,
            command=body["spec"]["command"],
            image=image,
        ),
        field_manager="torchyard-sdk",
    )
    available = status.modelversion_status(
        len(manifest.get("files", [])),
        str(manifest.get("size", "")),
        manifest.get("created"),
        mv["metadata"].get("generation"),
        datetime.now(timezone.utc),
    )
    k8s.apply_status(
        manifests.model_version_status(run._ns, mv["metadata"]["name"], available),
        field_manager="torchyard-sdk",
    )
    return Model(run.experiment.workspace, model, int(manifest["version"]), manifest)


__all__ = ["Model"]
