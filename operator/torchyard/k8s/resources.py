"""Where each kind torchyard touches lives in the REST API: a small table, so no discovery
round-trips are made.

:class:`Resource` builds the paths; :func:`resource_of` finds the row of a manifest. Used
by every other module of ``torchyard.k8s`` and, through the package, by the controller,
the SDK and the CLI (``k8s.PODS``, ``k8s.TRAININGRUNS`` ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchyard.api import wire


@dataclass(frozen=True)
class Resource:
    """Where a kind of object lives in the REST API."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base


TRAININGRUNS = Resource(wire.GROUP, wire.VERSION, "trainingruns")
ENVIRONMENTS = Resource(wire.GROUP, wire.VERSION, "environments")
MODELVERSIONS = Resource(wire.GROUP, wire.VERSION, "modelversions")
SWEEPS = Resource(wire.GROUP, wire.VERSION, "sweeps")
ONLINEENDPOINTS = Resource(wire.GROUP, wire.VERSION, "onlineendpoints")
PODS = Resource("", "v1", "pods")
SERVICES = Resource("", "v1", "services")
CONFIGMAPS = Resource("", "v1", "configmaps")
PERSISTENTVOLUMECLAIMS = Resource("", "v1", "persistentvolumeclaims")
EVENTS = Resource("", "v1", "events")
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)
NODES = Resource("", "v1", "nodes", namespaced=False)
JOBS = Resource("batch", "v1", "jobs")
DEPLOYMENTS = Resource("apps", "v1", "deployments")
HORIZONTALPODAUTOSCALERS = Resource("autoscaling", "v2", "horizontalpodautoscalers")
SECRETS = Resource("", "v1", "secrets")
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts")
ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles")
ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings")
TOKENREVIEWS = Resource("authentication.k8s.io", "v1", "tokenreviews", namespaced=False)
SUBJECTACCESSREVIEWS = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", namespaced=False
)
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
PRIORITYCLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", namespaced=False)
# Kueue's queues: its version is the one the cluster's CRD serves (``local_queues``).
# KServe's InferenceService (an OnlineEndpoint's backend KServe), where its CRD is installed.
KSERVE_GROUP = "serving.kserve.io"
INFERENCESERVICES = Resource(KSERVE_GROUP, "v1beta1", "inferenceservices")
INFERENCESERVICES_CRD = f"inferenceservices.{KSERVE_GROUP}"
KUEUE_GROUP = "kueue.x-k8s.io"
LOCALQUEUES_CRD = f"localqueues.{KUEUE_GROUP}"


def local_queues(version: str) -> Resource:
    """Kueue's LocalQueues as ``version`` serves them (v1beta1, v1beta2 ...)."""
    return Resource(KUEUE_GROUP, version, "localqueues")


# Kueue's kinds torchyard reads and writes as a job's controller: v1beta2 only (a Kueue
# that does not serve it gets plain Pod groups: ``controller.workloads``).
KUEUE_VERSION = "v1beta2"
WORKLOADS_CRD = f"workloads.{KUEUE_GROUP}"
WORKLOADS = Resource(KUEUE_GROUP, KUEUE_VERSION, "workloads")
TOPOLOGIES = Resource(KUEUE_GROUP, KUEUE_VERSION, "topologies", namespaced=False)
RESOURCEFLAVORS = Resource(KUEUE_GROUP, KUEUE_VERSION, "resourceflavors", namespaced=False)


_BY_KIND: dict[tuple[str, str], Resource] = {
    (wire.API_VERSION, "TrainingRun"): TRAININGRUNS,
    (wire.API_VERSION, "Environment"): ENVIRONMENTS,
    (wire.API_VERSION, "ModelVersion"): MODELVERSIONS,
    (wire.API_VERSION, "Sweep"): SWEEPS,
    (wire.API_VERSION, "OnlineEndpoint"): ONLINEENDPOINTS,
    ("v1", "Pod"): PODS,
    ("v1", "Service"): SERVICES,
    ("v1", "ConfigMap"): CONFIGMAPS,
    ("v1", "PersistentVolumeClaim"): PERSISTENTVOLUMECLAIMS,
    ("v1", "Event"): EVENTS,
    ("v1", "Namespace"): NAMESPACES,
    ("v1", "Node"): NODES,
    ("batch/v1", "Job"): JOBS,
    ("apps/v1", "Deployment"): DEPLOYMENTS,
    ("autoscaling/v2", "HorizontalPodAutoscaler"): HORIZONTALPODAUTOSCALERS,
    (f"{KSERVE_GROUP}/v1beta1", "InferenceService"): INFERENCESERVICES,
    ("v1", "Secret"): SECRETS,
    ("v1", "ServiceAccount"): SERVICEACCOUNTS,
    ("rbac.authorization.k8s.io/v1", "Role"): ROLES,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ROLEBINDINGS,
    ("authentication.k8s.io/v1", "TokenReview"): TOKENREVIEWS,
    ("authorization.k8s.io/v1", "SubjectAccessReview"): SUBJECTACCESSREVIEWS,
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): CRDS,
    ("scheduling.k8s.io/v1", "PriorityClass"): PRIORITYCLASSES,
    (f"{KUEUE_GROUP}/{KUEUE_VERSION}", "Workload"): WORKLOADS,
}


def resource_of(manifest: dict[str, Any]) -> Resource:
    key = (manifest.get("apiVersion", ""), manifest.get("kind", ""))
    try:
        return _BY_KIND[key]
    except KeyError:
        raise ValueError(f"torchyard does not manage {key[1]} ({key[0]})") from None


__all__ = [
    "CONFIGMAPS",
    "CRDS",
    "DEPLOYMENTS",
    "ENVIRONMENTS",
    "EVENTS",
    "HORIZONTALPODAUTOSCALERS",
    "INFERENCESERVICES",
    "INFERENCESERVICES_CRD",
    "JOBS",
    "KSERVE_GROUP",
    "KUEUE_GROUP",
    "KUEUE_VERSION",
    "LOCALQUEUES_CRD",
    "MODELVERSIONS",
    "NAMESPACES",
    "NODES",
    "ONLINEENDPOINTS",
    "PERSISTENTVOLUMECLAIMS",
    "PODS",
    "PRIORITYCLASSES",
    "RESOURCEFLAVORS",
    "ROLEBINDINGS",
    "ROLES",
    "SECRETS",
    "SERVICEACCOUNTS",
    "SERVICES",
    "SUBJECTACCESSREVIEWS",
    "SWEEPS",
    "TOKENREVIEWS",
    "TOPOLOGIES",
    "TRAININGRUNS",
    "WORKLOADS",
    "WORKLOADS_CRD",
    "Resource",
    "local_queues",
    "resource_of",
]
