"""Registering a model from a run (``Run.register_model``) and the ``Model`` it returns.
The one promote path: the metadata from ``torchyard.planning.models``, the HTTP promote
through the registry client, then the ModelVersion ``<model>-v<N>`` and its status, as
the operator records them. Tested in tests/unit/registry/test_client.py and
tests/integration/test_azureml.py.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchyard import api, k8s, status
from torchyard.planning import models as manifests
from torchyard.sdk.azureml.common import TorchyardSdkError, dns_name
from torchyard.sdk.registry import RegistryError

if TYPE_CHECKING:
    from torchyard.sdk.azureml.experiments import Run
    from torchyard.sdk.azureml.workspaces import Workspace


class Model:
    def __init__(
        self, workspace: Workspace, name: str, version: int, manifest: dict[str, Any]
    ) -> None:
        self.workspace = workspace
        self.name = name
        self.version = version
        self.id = f"{name}:{version}"
        self.manifest = manifest

    def download(self, target_dir: str = ".", exist_ok: bool = False) -> str:
        dest = Path(target_dir)
        if dest.exists() and any(dest.iterdir()) and not exist_ok:
            raise TorchyardSdkError(f"{dest} is not empty (pass exist_ok=True)")
        self.workspace.registry().download(self.workspace.namespace, self.name, self.version, dest)
        return str(dest)

    def __repr__(self) -> str:
        return f"Model(name={self.name!r}, version={self.version})"


def register(
    run: Run,
    model_name: str,
    model_path: str,
    *,
    tags: dict[str, str],
    properties: dict[str, Any],
    framework: tuple[str, str],
    description: str,
) -> Model:
    """``Run.register_model``: promote ``model_path`` of ``run``'s archive to the next
    version of ``model_name`` (``framework``: name and version, empty when not given)."""
    body = run._body()
    if body.get("status", {}).get("phase") != "Succeeded":
        raise TorchyardSdkError(
            f"run {run.id} has not succeeded ({body.get('status', {}).get('phase')}): "
            "register a model from a completed run"
        )
    model = dns_name(model_name)
    env = k8s.get_or_none(k8s.ENVIRONMENTS, run._ns, body["spec"]["environment"]) or {}
    image = str(env.get("status", {}).get("image") or "")
    uid = str(body["metadata"].get("uid", ""))
    try:
        spec = api.parse_trainingrun(body)
    except api.InvalidSpec as err:
        raise TorchyardSdkError(f"run {run.id} cannot be read: {err}") from None
    name, version = framework
    known = manifests.Framework(name=name, version=version) if name or version else None
    meta = manifests.promote_metadata(
        spec,
        image=image,
        tags=tags,
        properties=properties,
        description=description,
        framework=known,
    )
    try:
        manifest = run.experiment.workspace.registry().promote(
            run._ns, model, run.id, model_path, meta
        )
    except (RegistryError, k8s.Unreachable) as err:
        raise TorchyardSdkError(f"cannot register {model_name}: {err}") from None
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
