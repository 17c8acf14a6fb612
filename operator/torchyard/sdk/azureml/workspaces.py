"""``Workspace``: a Kubernetes namespace (and kubeconfig context) in Azure ML's clothes.
``Workspace.from_config()`` reads ``.torchyard/config.json`` or ``config.json`` (searched
upwards from the current folder; without one, a workspace for local runs, said in one
line); the workspace lists its node pools and Environments and
gives the registry client that runs, models and snapshots go through. Used by every other
name of ``torchyard.sdk.azureml``; tested in tests/unit/sdk/test_azureml*.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from torchyard import k8s
from torchyard.planning import pods
from torchyard.sdk.azureml.common import TorchyardSdkError, refuse
from torchyard.sdk.azureml.compute import ComputeTarget
from torchyard.sdk.azureml.environments import Environment
from torchyard.sdk.local_registry import LocalRegistry
from torchyard.sdk.registry import DEFAULT_SERVICE, RegistryClient

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
    "localRegistry",
)


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
        local_registry: str | None = None,
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
        self.local_registry_folder = local_registry
        self.datastores: dict[str, Any] = {}  # Datastore.register_s3: this process's

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
            # Local runs need none: a workspace of the kubeconfig's namespace (or
            # "default"), said in one line; what needs a cluster says so when it is used.
            ws = cls()
            print(
                f"[torchyard] no {' or '.join(CONFIG_FILES)} in {start} or above: workspace "
                f"{ws.namespace!r} (compute_target='local' runs on this machine, into "
                f"{ws.local_registry().root}; for a cluster write .torchyard/config.json with "
                '{"namespace": ..., "context": ...})',
                file=sys.stderr,
            )
            return ws
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
            local_registry=data.get("localRegistry"),
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
        refuse(
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

    def local_registry(self) -> LocalRegistry:
        """The local registry of the local compute target (``~/.torchyard/registry``, or
        ``$TORCHYARD_REGISTRY``; ``localRegistry`` in the config file)."""
        return LocalRegistry(
            Path(self.local_registry_folder).expanduser() if self.local_registry_folder else None
        )

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


__all__ = ["Workspace"]
