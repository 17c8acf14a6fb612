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
  experiment; ``PyTorchConfiguration`` gives its nodes and processes.
- ``Run``: ``wait_for_completion``, ``get_status``, ``get_details``, ``register_model``
  (a ``ModelVersion`` from the registry service), ``download_file``.

Every argument of these names either does what it does in Azure ML or, given a value
other than its default, raises ``TorchyardSdkError`` saying what to do instead (table-tested
in ``tests/unit/sdk/test_azureml_arguments.py``); nothing is accepted and then ignored.
``MpiConfiguration`` raises until torchyard launches MPI jobs.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from torchyard import api, k8s, status
from torchyard.planning import models, pods
from torchyard.sdk import runs, snapshots
from torchyard.sdk.registry import DEFAULT_SERVICE, RegistryClient, RegistryError

CONFIG_FILES = (".torchyard/config.json", "config.json")
CONFIG_KEYS = (
    "namespace",
    "context",
    "kubeconfig",
    "imageRepository",
    "insecureRegistry",
    "computeTargets",
    "serviceAccount",
    "registryService",
    "registryUrl",
)
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
        unknown = sorted(set(data) - set(CONFIG_KEYS)) if isinstance(data, dict) else []
        if not isinstance(data, dict) or unknown:
            raise TorchyardSdkError(
                f"{found}: "
                + (f"unknown key(s) {', '.join(unknown)}" if unknown else "not a JSON object")
                + f"; the keys are {', '.join(CONFIG_KEYS)} (Azure's subscription_id, "
                "resource_group and workspace_name have no meaning here: keep them in "
                "config.json and torchyard's in .torchyard/config.json, which is read first)"
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
    def get(
        cls,
        name: str,
        auth: Any = None,
        subscription_id: str | None = None,
        resource_group: str | None = None,
        location: str | None = None,
        cloud: str = "AzureCloud",
        id: str | None = None,  # Azure's name
        *,
        context: str | None = None,
    ) -> Workspace:
        """The namespace ``name`` (in the kubeconfig's ``context``)."""
        _refuse(
            "Workspace.get",
            {
                "auth": (auth, None),
                "subscription_id": (subscription_id, None),
                "resource_group": (resource_group, None),
                "location": (location, None),
                "cloud": (cloud, "AzureCloud"),
                "id": (id, None),
            },
            "a torchyard Workspace is a Kubernetes namespace reached with your kubeconfig: "
            "use Workspace.get(namespace, context=...)",
        )
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


# AmlCompute.provisioning_configuration's arguments and their defaults (Azure ML SDK v1).
PROVISIONING_DEFAULTS: dict[str, Any] = {
    "vm_size": "",
    "vm_priority": "dedicated",
    "min_nodes": 0,
    "max_nodes": None,
    "idle_seconds_before_scaledown": None,
    "admin_username": None,
    "admin_user_password": None,
    "admin_user_ssh_key": None,
    "vnet_resourcegroup_name": None,
    "vnet_name": None,
    "subnet_name": None,
    "tags": None,
    "description": None,
    "remote_login_port_public_access": "NotSpecified",
    "identity_type": None,
    "identity_id": None,
    "location": None,
    "enable_node_public_ip": True,
}
# What ComputeTarget.create can check against an existing pool; the rest would shape
# nodes that torchyard never makes.
PROVISIONING_CHECKED = ("vm_size", "min_nodes", "max_nodes")
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


class AmlCompute:
    @staticmethod
    def provisioning_configuration(**kwargs: Any) -> dict[str, Any]:
        """What was asked for, by Azure's argument names. torchyard never creates nodes:
        ``ComputeTarget.create`` finds an existing pool and checks it against ``vm_size``,
        ``min_nodes`` and ``max_nodes``; any other setting raises there."""
        unknown = sorted(set(kwargs) - set(PROVISIONING_DEFAULTS))
        if unknown:
            raise TorchyardSdkError(
                f"AmlCompute.provisioning_configuration got unknown argument(s) "
                f"{', '.join(unknown)}; it takes {', '.join(PROVISIONING_DEFAULTS)}"
            )
        return {k: v for k, v in kwargs.items() if v != PROVISIONING_DEFAULTS[k]}


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
    def create(
        workspace: Workspace, name: str, provisioning_configuration: dict[str, Any]
    ) -> ComputeTarget:
        """The existing pool ``name``, when it is what ``provisioning_configuration`` asks
        for (torchyard never creates or scales nodes)."""
        target = ComputeTarget(workspace, name)
        asked = dict(provisioning_configuration or {})
        never = sorted(k for k in asked if k not in PROVISIONING_CHECKED)
        if never:
            raise ComputeTargetException(
                f"{', '.join(never)} would shape nodes that torchyard never creates or scales: "
                f"leave them out (the pool {target.pool!r} is made by your platform team), "
                f"or use ComputeTarget(ws, {name!r}) as it is"
            )
        count = len(target.nodes)
        if asked.get("min_nodes") and count < int(asked["min_nodes"]):
            raise ComputeTargetException(
                f"node pool {target.pool!r} has {count} node(s), fewer than "
                f"min_nodes={asked['min_nodes']}; torchyard never adds nodes: ask your "
                "platform team for a larger pool"
            )
        if asked.get("max_nodes") is not None and count > int(asked["max_nodes"]):
            raise ComputeTargetException(
                f"node pool {target.pool!r} has {count} nodes, more than "
                f"max_nodes={asked['max_nodes']}; torchyard never removes nodes: leave "
                "max_nodes out (a run uses only the nodes its node_count asks for)"
            )
        if asked.get("vm_size"):
            types = {
                str(n["metadata"].get("labels", {}).get(INSTANCE_TYPE_LABEL, ""))
                for n in target.nodes
            }
            if {t.lower() for t in types} != {str(asked["vm_size"]).lower()}:
                shown = ", ".join(sorted(t or "(none)" for t in types))
                raise ComputeTargetException(
                    f"node pool {target.pool!r} is not all vm_size={asked['vm_size']!r} "
                    f"(its nodes' {INSTANCE_TYPE_LABEL}: {shown}); torchyard never creates "
                    f"nodes: leave vm_size out, or name a pool of that size"
                )
        return target

    def _ready(self) -> list[dict[str, Any]]:
        return [
            n
            for n in self.nodes
            if any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in n.get("status", {}).get("conditions", [])
            )
        ]

    def wait_for_completion(
        self,
        show_output: bool = False,
        min_node_count: int | None = None,
        timeout_in_minutes: float = 25,
        is_delete_operation: bool = False,
    ) -> None:
        """Until ``min_node_count`` nodes of the pool are Ready (at most
        ``timeout_in_minutes``); at once when no count is asked for."""
        if is_delete_operation:
            raise ComputeTargetException(
                "torchyard never deletes node pools: is_delete_operation=True has nothing "
                "to wait for"
            )
        deadline = time.monotonic() + timeout_in_minutes * 60
        while True:
            ready = self._ready()
            if not min_node_count or len(ready) >= min_node_count:
                break
            if time.monotonic() >= deadline:
                raise ComputeTargetException(
                    f"node pool {self.pool} has {len(ready)} ready nodes, fewer than "
                    f"{min_node_count}, after {timeout_in_minutes:g} minutes"
                )
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
            self.nodes = k8s.list_(k8s.NODES, label_selector=f"{pods.POOL_LABEL}={self.pool}")
        if show_output:
            print(f"node pool {self.pool}: {len(ready)}/{len(self.nodes)} nodes ready")

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
        if version is not None:
            raise TorchyardSdkError(
                f"Environments have no versions here (version={version!r}): an Environment "
                "is one resource whose image is rebuilt when its spec changes; leave version "
                "out, or register the old recipe under another name"
            )
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

    def __post_init__(self) -> None:
        if str(self.communication_backend).lower() != "nccl":
            raise TorchyardSdkError(
                f"communication_backend={self.communication_backend!r} is not passed to the "
                "processes here: your script chooses it in "
                "torch.distributed.init_process_group(backend=...); leave "
                "communication_backend out"
            )
        if not isinstance(self.node_count, int) or self.node_count < 1:
            raise TorchyardSdkError(
                f"node_count must be a whole number >= 1, not {self.node_count!r}"
            )
        if self.process_count is not None and (
            not isinstance(self.process_count, int) or self.process_count < 1
        ):
            raise TorchyardSdkError(
                f"process_count must be a whole number >= 1, not {self.process_count!r}"
            )


@dataclass
class MpiConfiguration:
    """Kept so the guide's imports work: torchyard does not launch MPI jobs yet, so
    making one raises and says what to use instead."""

    process_count_per_node: int = 1
    node_count: int = 1

    def __post_init__(self) -> None:
        raise TorchyardSdkError(
            "distribution.type mpi is not supported yet (torchyard starts no mpirun): use "
            f"PyTorchConfiguration(process_count={self.process_count_per_node * self.node_count}"
            f", node_count={self.node_count}), whose processes get RANK, WORLD_SIZE, "
            "LOCAL_RANK and MASTER_ADDR/MASTER_PORT; a script that reads OMPI_COMM_WORLD_* "
            "must read those instead"
        )


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
        distributed_job_config: PyTorchConfiguration | None = None,
        resume_from: Any = None,
        max_run_duration_seconds: int | None = None,
        command: list[Any] | str | None = None,
        docker_runtime_config: Any = None,
    ) -> None:
        if script is None and command is None:
            raise TorchyardSdkError("ScriptRunConfig needs script= or command=")
        if script is not None and command is not None:
            raise TorchyardSdkError(
                "ScriptRunConfig takes script= or command=, not both: put the script into "
                "the command (command=['python', 'train.py', ...])"
            )
        _refuse(
            "ScriptRunConfig",
            {
                "run_config": (run_config, None),
                "_telemetry_values": (_telemetry_values, None),
                "resume_from": (resume_from, None),
                "docker_runtime_config": (docker_runtime_config, None),
            },
            "a RunConfiguration's parts are ScriptRunConfig's own arguments here "
            "(environment=, compute_target=, distributed_job_config=, "
            "max_run_duration_seconds=); shared memory and the like are TrainingRun spec "
            "fields (resources.shmSize), set with torchyard submit; to resume, restore your "
            "checkpoint in the script (run.download_file)",
        )
        if distributed_job_config is not None and not isinstance(
            distributed_job_config, PyTorchConfiguration
        ):
            raise TorchyardSdkError(
                f"distributed_job_config={type(distributed_job_config).__name__} is not "
                "supported: use PyTorchConfiguration(process_count=..., node_count=...)"
            )
        if max_run_duration_seconds is not None and (
            not isinstance(max_run_duration_seconds, int) or max_run_duration_seconds < 1
        ):
            raise TorchyardSdkError(
                f"max_run_duration_seconds must be a whole number >= 1, not "
                f"{max_run_duration_seconds!r}"
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
        if ws.service_account:
            # The node Pods run as it, so their registry token is its (item: serviceAccount).
            spec["serviceAccountName"] = ws.service_account
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
        """Until the run Succeeds or Fails (``show_output``: its states and every rank's
        log). A run is Succeeded only after its Finalizing phase (outputs archived, model
        registered), so this always waits for post-processing, as
        ``wait_post_processing=True`` asks."""
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
        model_framework: str | None = None,
        model_framework_version: str | None = None,
        description: str | None = None,
        datasets: Any = None,
        sample_input_dataset: Any = None,
        sample_output_dataset: Any = None,
        resource_configuration: Any = None,
    ) -> Model:
        """Promote ``model_path`` of the run's archive (default: outputs) to the model's
        next version, recorded as the ModelVersion ``<model>-v<N>``; tags, properties,
        description and the framework go into the version's manifest."""
        _refuse(
            "register_model",
            {
                "datasets": (datasets, None),
                "sample_input_dataset": (sample_input_dataset, None),
                "sample_output_dataset": (sample_output_dataset, None),
                "resource_configuration": (resource_configuration, None),
            },
            "torchyard has no datasets or deployment resources: keep such notes in "
            "properties= (recorded in the version's manifest)",
        )
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
        if model_framework or model_framework_version:
            meta["framework"] = {
                "name": model_framework or "",
                "version": model_framework_version or "",
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


def _refuse(where: str, given: dict[str, tuple[Any, Any]], advice: str) -> None:
    """Raise for every argument given a value other than its default (value, default):
    an argument torchyard cannot honour is refused, never silently dropped."""
    bad = [name for name, (value, default) in given.items() if value != default]
    if bad:
        raise TorchyardSdkError(f"{where}: {', '.join(bad)} has no meaning here: {advice}")


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
