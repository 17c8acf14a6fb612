"""The Azure ML SDK (v1) names, on torchyard: the guide "Train PyTorch models at scale"
runs with only its imports changed.

    from torchyard.sdk import (Workspace, Experiment, ScriptRunConfig, Environment,
                               ComputeTarget, AmlCompute, ComputeTargetException,
                               PyTorchConfiguration, MpiConfiguration)

What things are here:

- ``Workspace``: a Kubernetes namespace (and kubeconfig context). ``from_config()`` reads
  ``.torchyard/config.json`` or ``config.json`` (searched upwards from the current folder)::

      {"namespace": "team-a", "context": "gpu-prod", "imageRepository": "reg/team-a/envs",
       "insecureRegistry": false,
       "computeTargets": {"gpu-cluster": "a100"}, "serviceAccount": "trainer",
       "registryService": "torchyard-system/torchyard-registry:8080"}

- ``ComputeTarget``: a node pool (nodes labelled ``torchyard.dev/pool=<name>``), or an
  alias of one in ``computeTargets``. Pools are made by the platform team, so
  ``ComputeTarget.create`` finds an existing pool and explains when there is none.
- ``Environment``: an ordinary ``Environment`` resource; built in the cluster from
  ``docker.base_image`` + conda/pip into ``imageRepository``, or a curated one
  (``Environment.get``).
- ``Experiment.submit(ScriptRunConfig)``: snapshots ``source_directory`` (as
  ``torchyard submit --source`` does) and creates a ``TrainingRun`` labelled with the
  experiment; ``PyTorchConfiguration``/``MpiConfiguration`` give its nodes and processes.
- ``Run``: ``wait_for_completion``, ``get_status``, ``get_details``, ``register_model``
  (a ``ModelVersion`` from the registry service), ``download_file``.
"""

from __future__ import annotations

import json
import secrets
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from torchyard import api, k8s, status
from torchyard.planning import models, pods
from torchyard.sdk import runs, snapshots
from torchyard.sdk.registry import DEFAULT_SERVICE, RegistryClient, RegistryError

CONFIG_FILES = (".torchyard/config.json", "config.json")
# Azure run states by torchyard phase.
STATUS = {
    "Pending": "Queued",
    "Preparing": "Preparing",
    "Queued": "Queued",
    "Running": "Running",
    "Finalizing": "Finalizing",
    "Succeeded": "Completed",
    "Failed": "Failed",
}
DEFAULT_CONDA_BASE_IMAGE = "condaforge/miniforge3:24.11.3-0"


class TorchyardSdkError(Exception):
    """Something the Azure ML SDK does that has another shape here; says what to do."""


class ComputeTargetException(TorchyardSdkError):
    """As ``azureml.core.compute_target.ComputeTargetException``."""


class ActivityFailedException(TorchyardSdkError):
    """A run failed (``wait_for_completion(raise_on_error=True)``); carries the traceback."""


# -- Workspace ---------------------------------------------------------------------------


class Workspace:
    def __init__(
        self,
        subscription_id: str | None = None,
        resource_group: str | None = None,
        workspace_name: str | None = None,
        *,
        namespace: str | None = None,
        context: str | None = None,
        kubeconfig: str | None = None,
        image_repository: str | None = None,
        insecure_registry: bool = False,
        compute_targets: dict[str, str] | None = None,
        service_account: str | None = None,
        registry_service: str = DEFAULT_SERVICE,
        registry_url: str | None = None,
    ) -> None:
        if subscription_id or resource_group:
            raise TorchyardSdkError(
                "a torchyard Workspace is a Kubernetes namespace, not an Azure subscription "
                "or resource group: use Workspace(namespace=..., context=...) or "
                "Workspace.from_config() with a .torchyard/config.json"
            )
        self.context = context
        self.kubeconfig = kubeconfig
        if kubeconfig or context:
            k8s.load(kubeconfig, context)
        self.namespace = namespace or workspace_name or k8s.default_namespace(kubeconfig, context)
        self.name = self.namespace
        self.image_repository = image_repository
        self.insecure_registry = insecure_registry
        self.compute_target_aliases = dict(compute_targets or {})
        self.service_account = service_account
        self.registry_service = registry_service
        self.registry_url = registry_url

    @classmethod
    def from_config(cls, path: str | None = None, _file_name: str | None = None) -> Workspace:
        """The first config file found from ``path`` (default: the current folder) up."""
        start = Path(path or ".").resolve()
        if start.is_file():
            found: Path | None = start
        else:
            names_ = [_file_name] if _file_name else list(CONFIG_FILES)
            found = next(
                (d / n for d in (start, *start.parents) for n in names_ if (d / n).is_file()),
                None,
            )
        if found is None:
            raise TorchyardSdkError(
                f"no {' or '.join(CONFIG_FILES)} in {start} or above: write one with "
                '{"namespace": "...", "context": "..."} (see torchyard.sdk.azureml)'
            )
        data = json.loads(found.read_text())
        if "subscription_id" in data and "namespace" not in data:
            raise TorchyardSdkError(
                f"{found} is an Azure ML config (subscription_id); torchyard needs "
                '{"namespace": ..., "context": ...}'
            )
        return cls(
            namespace=data.get("namespace"),
            context=data.get("context"),
            kubeconfig=data.get("kubeconfig"),
            image_repository=data.get("imageRepository"),
            insecure_registry=bool(data.get("insecureRegistry", False)),
            compute_targets=data.get("computeTargets"),
            service_account=data.get("serviceAccount"),
            registry_service=data.get("registryService", DEFAULT_SERVICE),
            registry_url=data.get("registryUrl"),
        )

    @classmethod
    def get(cls, name: str, context: str | None = None, **_: Any) -> Workspace:
        return cls(namespace=name, context=context)

    @property
    def compute_targets(self) -> dict[str, ComputeTarget]:
        pools = sorted(
            {
                n["metadata"].get("labels", {}).get(pods.POOL_LABEL)
                for n in k8s.list_(k8s.NODES)
                if n["metadata"].get("labels", {}).get(pods.POOL_LABEL)
            }
        )
        return {p: ComputeTarget(self, p) for p in pools}

    @property
    def environments(self) -> dict[str, Environment]:
        return {
            e["metadata"]["name"]: Environment._from_resource(e)
            for e in k8s.list_(k8s.ENVIRONMENTS, self.namespace)
        }

    def registry(self) -> RegistryClient:
        if self.registry_url:
            return RegistryClient.for_service_account(
                self.registry_url, self.namespace, self.service_account or "default"
            )
        return RegistryClient.through_kubernetes(
            self.namespace, self.service_account, self.registry_service
        )

    def __repr__(self) -> str:
        return f"Workspace(namespace={self.namespace!r}, context={self.context!r})"


# -- Compute -----------------------------------------------------------------------------


class AmlCompute:
    @staticmethod
    def provisioning_configuration(**kwargs: Any) -> dict[str, Any]:
        """Kept for the guide's code: torchyard never creates nodes, so this only records
        what was asked; ``ComputeTarget.create`` then looks for an existing pool."""
        return dict(kwargs)


class ComputeTarget:
    def __init__(self, workspace: Workspace, name: str) -> None:
        self.workspace = workspace
        self.name = name
        self.pool = workspace.compute_target_aliases.get(name, name)
        nodes = k8s.list_(k8s.NODES, label_selector=f"{pods.POOL_LABEL}={self.pool}")
        if not nodes:
            raise ComputeTargetException(
                f"no node pool {self.pool!r}: no node is labelled {pods.POOL_LABEL}={self.pool}"
                + (f" (alias {name!r})" if self.pool != name else "")
                + "; ask your platform team for one, or map the name to an existing pool "
                'in .torchyard/config.json, e.g. "computeTargets": {"' + name + '": "a100"}'
            )
        self.nodes = nodes
        gpus = [
            int(n.get("status", {}).get("allocatable", {}).get(pods.GPU_RESOURCE, 0)) for n in nodes
        ]
        self.gpus_per_node = min(gpus) if gpus else 0

    @staticmethod
    def create(workspace: Workspace, name: str, provisioning_configuration: Any) -> ComputeTarget:
        return ComputeTarget(workspace, name)

    def wait_for_completion(
        self, show_output: bool = False, min_node_count: int | None = None, **_: Any
    ) -> None:
        ready = [
            n
            for n in self.nodes
            if any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in n.get("status", {}).get("conditions", [])
            )
        ]
        if show_output:
            print(f"node pool {self.pool}: {len(ready)}/{len(self.nodes)} nodes ready")
        if min_node_count and len(ready) < min_node_count:
            raise ComputeTargetException(
                f"node pool {self.pool} has {len(ready)} ready nodes, fewer than {min_node_count}"
            )

    def get_status(self) -> dict[str, Any]:
        return {"nodeCount": len(self.nodes), "gpusPerNode": self.gpus_per_node}

    def __repr__(self) -> str:
        return f"ComputeTarget(pool={self.pool!r}, nodes={len(self.nodes)})"


# -- Environment -------------------------------------------------------------------------


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
        body = k8s.get_or_none(k8s.ENVIRONMENTS, workspace.namespace, name)
        if body is None:
            known = ", ".join(sorted(workspace.environments)) or "none"
            raise TorchyardSdkError(
                f"no Environment {name!r} in namespace {workspace.namespace} (there: {known}); "
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
        if self.image and not (self.python.conda_yaml or self.python.pip_requirements):
            spec = {"image": self.image}
        elif self.docker.base_dockerfile:
            spec = {"dockerfile": self.docker.base_dockerfile}
        else:
            base = self.docker.base_image or (
                DEFAULT_CONDA_BASE_IMAGE if self.python.conda_yaml else "python:3.11-slim"
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
            "metadata": {"name": _dns(self.name), "namespace": workspace.namespace},
            "spec": spec,
        }
        api.parse_environment(body)
        return body

    def __repr__(self) -> str:
        return f"Environment(name={self.name!r})"


# -- Run configuration -------------------------------------------------------------------


@dataclass
class PyTorchConfiguration:
    """``process_count`` processes over ``node_count`` nodes; with ``command=`` in the
    ScriptRunConfig the command runs once per node (it starts the processes itself)."""

    communication_backend: str = "Nccl"
    process_count: int | None = None
    node_count: int = 1


@dataclass
class MpiConfiguration:
    """``process_count_per_node`` processes on each of ``node_count`` nodes, started by the
    torchyard launcher with the PyTorch rank contract (no MPI daemon is involved)."""

    process_count_per_node: int = 1
    node_count: int = 1


class ScriptRunConfig:
    def __init__(
        self,
        source_directory: str,
        script: str | None = None,
        arguments: list[Any] | None = None,
        run_config: Any = None,
        _telemetry_values: Any = None,
        compute_target: ComputeTarget | str | None = None,
        environment: Environment | None = None,
        distributed_job_config: PyTorchConfiguration | MpiConfiguration | None = None,
        resume_from: Any = None,
        max_run_duration_seconds: int | None = None,
        command: list[Any] | str | None = None,
        docker_runtime_config: Any = None,
    ) -> None:
        if script is None and command is None:
            raise TorchyardSdkError("ScriptRunConfig needs script= or command=")
        if resume_from is not None:
            raise TorchyardSdkError(
                "resume_from has no meaning here: restore your checkpoint from the "
                "registry in the script (run.download_file) instead"
            )
        self.source_directory = source_directory
        self.script = script
        self.arguments = [str(a) for a in (arguments or [])]
        self.compute_target = compute_target
        self.environment = environment
        self.distributed_job_config = distributed_job_config
        self.max_run_duration_seconds = max_run_duration_seconds
        self.command = command.split() if isinstance(command, str) else command

    def _distribution(self) -> dict[str, Any]:
        dist = self.distributed_job_config
        if dist is None:
            return {"type": "none", "nodeCount": 1, "processCountPerNode": 1}
        if isinstance(dist, MpiConfiguration):
            return {
                "type": "pytorch",
                "nodeCount": dist.node_count,
                "processCountPerNode": dist.process_count_per_node,
                "launch": "process",
            }
        nodes = dist.node_count
        procs = dist.process_count or nodes
        if procs % nodes:
            raise TorchyardSdkError(
                f"process_count={procs} does not split evenly over node_count={nodes}"
            )
        return {
            "type": "pytorch",
            "nodeCount": nodes,
            "processCountPerNode": procs // nodes,
            "launch": "node" if self.command else "process",
        }


# -- Experiment and Run ------------------------------------------------------------------


class Experiment:
    def __init__(self, workspace: Workspace, name: str) -> None:
        self.workspace = workspace
        self.name = name

    def submit(self, config: ScriptRunConfig, tags: dict[str, str] | None = None) -> Run:
        ws = self.workspace
        ns = ws.namespace
        env = config.environment
        env_name = "default"
        if env is not None:
            if not env._registered or env.python.conda_yaml or env.python.pip_requirements:
                env.register(ws)
            env_name = _dns(env.name)
        snap = snapshots.snapshot(Path(config.source_directory))
        try:
            print(snap.report(), file=sys.stderr)
            snapshots.store(snap, ns, ws.registry)
            source = snap.source
        finally:
            snap.close()
        python = env.python.interpreter_path if env else "python"
        command = (
            [*(str(c) for c in config.command), *config.arguments]
            if config.command
            else [python, str(config.script), *config.arguments]
        )
        dist = config._distribution()
        spec: dict[str, Any] = {
            "environment": env_name,
            "source": source,
            "command": command,
            "distribution": dist,
        }
        target = config.compute_target
        if isinstance(target, str):
            target = ComputeTarget(ws, target)
        if target is not None:
            spec["compute"] = {"pool": target.pool}
            if target.gpus_per_node:
                per_node = dist["processCountPerNode"] if dist.get("launch") != "node" else 1
                spec["resources"] = {"gpusPerNode": min(per_node, target.gpus_per_node)}
        if config.max_run_duration_seconds:
            spec["policy"] = {"activeDeadlineSeconds": config.max_run_duration_seconds}
        exp = _dns(self.name)[:40].rstrip("-")
        name = f"{exp}-{secrets.token_hex(3)}"
        body = {
            "apiVersion": api.API_VERSION,
            "kind": "TrainingRun",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": {"torchyard.dev/experiment": exp, **(tags or {})},
                "annotations": {"torchyard.dev/experiment-name": self.name},
            },
            "spec": spec,
        }
        api.parse_trainingrun(body)
        k8s.create(body)
        print(f"TrainingRun {ns}/{name} submitted (experiment {self.name})", file=sys.stderr)
        return Run(self, name)


class Run:
    def __init__(self, experiment: Experiment, run_id: str) -> None:
        self.experiment = experiment
        self.id = run_id
        self.name = run_id

    @property
    def _ns(self) -> str:
        return self.experiment.workspace.namespace

    def _body(self) -> dict[str, Any]:
        return runs.get(self._ns, self.id)

    def get_status(self) -> str:
        return STATUS.get(self._body().get("status", {}).get("phase", "Pending"), "NotStarted")

    def get_details(self) -> dict[str, Any]:
        body = self._body()
        st = body.get("status", {})
        details: dict[str, Any] = {
            "runId": self.id,
            "target": (body["spec"].get("compute") or {}).get("pool"),
            "status": STATUS.get(st.get("phase", "Pending"), "NotStarted"),
            "startTimeUtc": st.get("startTime"),
            "endTimeUtc": st.get("completionTime"),
            "properties": {"namespace": self._ns, "environment": body["spec"]["environment"]},
            "runDefinition": body["spec"],
        }
        if st.get("phase") == "Failed":
            details["error"] = {"message": runs.failure_text(body)}
        return details

    def wait_for_completion(
        self,
        show_output: bool = False,
        wait_post_processing: bool = False,
        raise_on_error: bool = True,
    ) -> dict[str, Any]:
        body = runs.wait(
            self._ns, self.id, show_output=show_output, registry=self.experiment.workspace.registry
        )
        code, text = runs.outcome(body)
        if show_output:
            print(text)
        if code and raise_on_error:
            raise ActivityFailedException(text)
        return self.get_details()

    def get_file_names(self) -> list[str]:
        return self.experiment.workspace.registry().run_files(self._ns, self.id)

    def download_file(self, name: str, output_file_path: str | None = None) -> None:
        dest = Path(output_file_path or Path(name).name)
        if dest.is_dir():
            dest = dest / Path(name).name
        self.experiment.workspace.registry().download_run_file(self._ns, self.id, name, dest)

    def register_model(
        self,
        model_name: str,
        model_path: str | None = None,
        tags: dict[str, str] | None = None,
        properties: dict[str, Any] | None = None,
        description: str | None = None,
        **_: Any,
    ) -> Model:
        """Promote ``model_path`` of the run's archive (default: outputs) to the model's
        next version, recorded as the ModelVersion ``<model>-v<N>``."""
        body = self._body()
        if body.get("status", {}).get("phase") != "Succeeded":
            raise TorchyardSdkError(
                f"run {self.id} has not succeeded ({body.get('status', {}).get('phase')}): "
                "register a model from a completed run"
            )
        model = _dns(model_name)
        env = k8s.get_or_none(k8s.ENVIRONMENTS, self._ns, body["spec"]["environment"]) or {}
        image = str(env.get("status", {}).get("image") or "")
        uid = str(body["metadata"].get("uid", ""))
        meta = {
            "run": {"name": self.id, "uid": uid},
            "environmentImage": image,
            "command": body["spec"]["command"],
            "tags": tags or {},
            "properties": properties or {},
            "description": description or "",
        }
        try:
            manifest = self.experiment.workspace.registry().promote(
                self._ns, model, self.id, model_path or "outputs", meta
            )
        except RegistryError as err:
            raise TorchyardSdkError(f"cannot register {model_name}: {err}") from None
        mv = k8s.apply(
            models.model_version(
                self._ns,
                model,
                manifest,
                run=self.id,
                run_uid=uid,
                command=body["spec"]["command"],
                image=image,
            ),
            field_manager="torchyard-sdk",
        )
        k8s.apply_status(
            {
                "apiVersion": api.API_VERSION,
                "kind": "ModelVersion",
                "metadata": {"name": mv["metadata"]["name"], "namespace": self._ns},
                "status": status.modelversion_status(
                    len(manifest.get("files", [])),
                    str(manifest.get("size", "")),
                    manifest.get("created"),
                    mv["metadata"].get("generation"),
                    datetime.now(timezone.utc),
                ),
            },
            field_manager="torchyard-sdk",
        )
        return Model(self.experiment.workspace, model, int(manifest["version"]), manifest)

    def __repr__(self) -> str:
        return f"Run(id={self.id!r}, namespace={self._ns!r})"


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


def _dns(name: str) -> str:
    """A Kubernetes name from an Azure one ('Tutorial-pytorch-birds' -> tutorial-pytorch-birds)."""
    out = "".join(c if c.isalnum() else "-" for c in name.lower())
    while "--" in out:
        out = out.replace("--", "-")
    out = out.strip("-")[:63].rstrip("-")
    if not out or not out[0].isalpha():
        out = "x-" + out
    return out


__all__ = [
    "ActivityFailedException",
    "AmlCompute",
    "ComputeTarget",
    "ComputeTargetException",
    "Environment",
    "Experiment",
    "Model",
    "MpiConfiguration",
    "PyTorchConfiguration",
    "Run",
    "ScriptRunConfig",
    "TorchyardSdkError",
    "Workspace",
]
