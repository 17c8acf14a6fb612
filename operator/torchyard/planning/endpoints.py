"""The children of an OnlineEndpoint: a Deployment per served version (``primary``: the
spec's model version; ``canary``: the other version of ``spec.traffic``), the Service in
front of both, a HorizontalPodAutoscaler, or instead one KServe InferenceService whose
custom predictor is the same serving Pod.

Pure builders. A serving Pod: an init container in the torchyard image copies the serving
runtime and its server libraries into an emptyDir (``torchyard.serving.prepare``) and the
scoring code into the working folder (a ConfigMap's or a registry snapshot's, as a node
Pod's launcher does; a git source is cloned by its own init container), then the
Environment's image runs ``python -m torchyard.serving``. The model's files are the
model version's entry of the namespace's inputs cache (fetched by the inputs fetch Job,
each file checked against the version's manifest), mounted read-only at
``AZUREML_MODEL_DIR``: never baked into an image. Non-root, Pod Security "restricted", no
API token (the registry token a snapshot needs is the init container's alone). A rollout
is the Deployment's: ``maxUnavailable: 0``, a new Pod counts once ``init()`` returned
(readiness), and an old one drains before it stops (``serving.draining``). Called by
``controller.endpoints`` and the SDK's dry run; tested in tests/unit/planning/test_endpoints.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchyard.api import Input, InvalidSpec, OnlineEndpoint, parse_endpoint, wire
from torchyard.inputs import uris
from torchyard.inputs.cache import DATA
from torchyard.launch.contract import (
    TORCHYARD_NAMESPACE,
    TORCHYARD_REGISTRY_TOKEN_FILE,
    TORCHYARD_REGISTRY_URL,
)
from torchyard.planning import names
from torchyard.planning.environments import restricted
from torchyard.planning.pods import (
    GPU_RESOURCE,
    INIT_PYTHON,
    REGISTRY_AUDIENCE,
    REGISTRY_TOKEN_DIR,
    SOURCE_MOUNT,
    WORKDIR,
    Settings,
    git_clone,
    owner_reference,
    requirements,
)
from torchyard.serving import contract

COMPONENT = "serving"
# Where the guide's scripts find a model (Azure ML's own path): AZUREML_MODEL_DIR.
MODELS_ROOT = "/var/azureml-app/azureml-models"
KSERVE_API_VERSION = "serving.kserve.io/v1beta1"
KSERVE_MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
KSERVE_CONTAINER = "kserve-container"  # KServe's name for a custom predictor's container
# A new Pod must stay ready this long before the rollout takes an old one away: time for
# the Service's endpoints to reach every kube-proxy (the old Pod drains besides).
MIN_READY_SECONDS = 1
TERMINATION_MARGIN_SECONDS = 10


@dataclass(frozen=True)
class Track:
    """One Deployment of the endpoint: the version it serves and its share."""

    name: str  # "primary" or "canary"
    version: int
    percent: int
    replicas: int | None  # None: the autoscaler decides


def tracks(ep: OnlineEndpoint, version: int) -> list[Track]:
    """The Deployments of ``ep`` serving ``version`` (its model's, pinned): one, or with
    ``spec.traffic`` one per version with a share above 0, their Pods in proportion
    (each at least one)."""
    spec = ep.spec
    if spec.traffic is None:
        replicas = None if spec.autoscaling is not None else spec.replicas
        return [Track("primary", version, 100, replicas)]
    other = [(int(v), p) for v, p in spec.traffic.items() if int(v) != version and p > 0]
    primary = spec.traffic.get(str(version), 0)
    canary_pods = max(1, round(spec.replicas * other[0][1] / 100)) if other else 0
    out = []
    if primary > 0:
        out.append(Track("primary", version, primary, max(1, spec.replicas - canary_pods)))
    if other:
        out.append(Track("canary", other[0][0], other[0][1], canary_pods))
    return out


def shares(plan: list[Track]) -> dict[int, int]:
    """Each version's share of the requests as its Pods make it (kube-proxy spreads
    connections evenly over the Service's ready Pods), in percent."""
    total = sum(t.replicas or 0 for t in plan)
    if total == 0 or len(plan) == 1:
        return {t.version: 100 for t in plan}
    return {t.version: round(100 * (t.replicas or 0) / total) for t in plan}


def model_input(ep: OnlineEndpoint, model: str, version: int) -> Input:
    """The model version as an input of the inputs cache (read by the endpoint's
    ServiceAccount, like a TrainingRun's model:// input)."""
    return Input(name=names.endpoint_model_input(version), uri=f"model://{model}/{version}")


def model_source(ep: OnlineEndpoint, model: str, version: int) -> uris.Source:
    return model_input(ep, model, version).source(ep.spec.service_account_name)


def cache_keys(body: Mapping[str, Any]) -> list[str]:
    """The inputs cache keys an endpoint's Pods mount or will mount (an invalid one's: none):
    the eviction of cache entries leaves them alone (``controller.inputs``)."""
    try:
        ep = parse_endpoint(dict(body))
    except InvalidSpec:
        return []
    served = (body.get("status") or {}).get("model") or {}
    pinned = ep.spec.model.name_and_version
    model, version = pinned or (str(served.get("name") or ""), int(served.get("version") or 0))
    if not model or not version:
        return []
    versions = {version, *(int(v) for v in (ep.spec.traffic or {}))}
    return sorted(model_source(ep, model, v).key for v in versions)


def model_dir(model: str, version: int) -> str:
    return f"{MODELS_ROOT}/{model}/{version}"


def scoring_uri(ep: OnlineEndpoint) -> str:
    host = names.endpoint_service(ep.name)
    if ep.spec.backend == "KServe":
        host = f"{ep.name}-predictor"  # KServe's Service of a Standard-mode predictor
    return f"http://{host}.{ep.namespace}.svc{contract.SCORE_PATH}"


def access_url(ep: OnlineEndpoint, settings: Settings) -> str:
    """The registry's access route for ``ep``'s callers' tokens ('' for a public one)."""
    if ep.spec.public:
        return ""
    if not settings.registry_url:
        raise ValueError(
            "an endpoint that is not public checks its callers' tokens through the registry "
            "service, and this operator has none (registry.enabled in the chart); set "
            "spec.public: true to serve without tokens"
        )
    base = settings.registry_url.rstrip("/")
    return f"{base}/v1/namespaces/{ep.namespace}/endpoints/{ep.name}/access"


def labels(ep: OnlineEndpoint, track: Track | None = None) -> dict[str, str]:
    out = {
        names.LABEL_ENDPOINT: ep.name,
        names.LABEL_ENVIRONMENT: ep.spec.environment,
        "app.kubernetes.io/managed-by": "torchyard",
        "app.kubernetes.io/component": COMPONENT,
    }
    if track is not None:
        out[wire.LABEL_TRACK] = track.name
        out[wire.LABEL_MODEL_VERSION] = str(track.version)
    return out


def _metadata(ep: OnlineEndpoint, name: str, track: Track | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": ep.namespace,
        "labels": labels(ep, track),
        "ownerReferences": [owner_reference(ep)],
    }


def service(ep: OnlineEndpoint) -> dict[str, Any]:
    """The Service of every version's ready Pods (port 80, the scoring URI's)."""
    port = {
        "name": contract.PORT_NAME,
        "port": contract.SERVICE_PORT,
        "targetPort": contract.PORT_NAME,
        "protocol": "TCP",
    }
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(ep, names.endpoint_service(ep.name)),
        "spec": {"selector": {names.LABEL_ENDPOINT: ep.name}, "ports": [port]},
    }


def autoscaler(ep: OnlineEndpoint) -> dict[str, Any] | None:
    """The HorizontalPodAutoscaler of the primary Deployment (None without autoscaling)."""
    scaling = ep.spec.autoscaling
    if scaling is None:
        return None
    target = {"type": "Utilization", "averageUtilization": scaling.target_cpu_utilization}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(ep, names.endpoint_deployment(ep.name, "primary")),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": names.endpoint_deployment(ep.name, "primary"),
            },
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": target}}],
        },
    }


@dataclass(frozen=True)
class PodInputs:
    """What a serving Pod is made of besides the endpoint's spec."""

    model: str
    image: str  # the Environment's (by digest when known)
    key: str  # the model version's inputs cache entry
    settings: Settings
    python: str = "python3"
    source_sha256: str = ""  # a ConfigMap source's content hash: a change rolls the Pods


def _prepare(ep: OnlineEndpoint, parts: PodInputs) -> dict[str, Any]:
    """The init container: the runtime into ``runtime``, the source into the workspace."""
    source = ep.spec.source
    args = ["--runtime", contract.RUNTIME_ROOT]
    mounts: list[dict[str, Any]] = [
        {"name": "runtime", "mountPath": contract.RUNTIME_ROOT},
        {"name": "prepare-tmp", "mountPath": "/tmp"},  # (a snapshot is downloaded there)
    ]
    env: list[dict[str, Any]] = []
    if source.config_map is not None:
        args += ["--", "--copy", SOURCE_MOUNT, WORKDIR]
        mounts.append({"name": "source", "mountPath": SOURCE_MOUNT, "readOnly": True})
    elif source.snapshot is not None:
        args += ["--", "--fetch", source.snapshot, WORKDIR]
        mounts.append({"name": "registry-token", "mountPath": REGISTRY_TOKEN_DIR, "readOnly": True})
        env += [
            {"name": TORCHYARD_REGISTRY_URL, "value": parts.settings.registry_url},
            {"name": TORCHYARD_NAMESPACE, "value": ep.namespace},
            {"name": TORCHYARD_REGISTRY_TOKEN_FILE, "value": f"{REGISTRY_TOKEN_DIR}/token"},
        ]
        if parts.settings.registry_ca:
            env.append({"name": contract.REGISTRY_CA, "value": parts.settings.registry_ca})
    if source.in_workspace and source.git is None:
        mounts.append({"name": "workspace", "mountPath": WORKDIR})
    container: dict[str, Any] = {
        "name": contract.PREPARE_CONTAINER,
        "image": parts.settings.init_image,
        "command": [INIT_PYTHON, "-m", "torchyard.serving.prepare", *args],
        "volumeMounts": mounts,
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {**restricted(), "readOnlyRootFilesystem": True},
    }
    if env:
        container["env"] = env
    return container


def _env(ep: OnlineEndpoint, track: Track, parts: PodInputs) -> list[dict[str, Any]]:
    c = contract
    limits = ep.spec.limits
    entry = ep.spec.entry_script
    values = {
        "PYTHONPATH": c.RUNTIME_LIB,
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        c.MODEL_DIR: model_dir(parts.model, track.version),
        c.ENTRY_SCRIPT: f"{WORKDIR}/{entry}" if ep.spec.source.in_workspace else entry,
        c.MODEL_NAME: parts.model,
        c.MODEL_VERSION: str(track.version),
        c.ENDPOINT: ep.name,
        c.NAMESPACE: ep.namespace,
        c.MAX_BODY_BYTES: str(limits.max_body_bytes),
        c.REQUEST_TIMEOUT: str(limits.request_timeout_seconds),
        c.CONCURRENCY: str(limits.concurrency),
        c.DRAIN_SECONDS: str(c.DEFAULT_DRAIN_SECONDS),
    }
    url = access_url(ep, parts.settings)
    if url:
        values[c.ACCESS_URL] = url
        if parts.settings.registry_ca:
            values[c.REGISTRY_CA] = parts.settings.registry_ca
    own = [{"name": k, "value": v} for k, v in sorted(values.items())]
    return own + [e.to_dict() for e in ep.spec.env]


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": contract.PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": max(1, period // 2),
        "failureThreshold": failures,
    }


def _scorer(ep: OnlineEndpoint, track: Track, parts: PodInputs, name: str) -> dict[str, Any]:
    """The serving container, in the Environment's image."""
    mounts = [
        {"name": "runtime", "mountPath": contract.RUNTIME_ROOT, "readOnly": True},
        {
            "name": "inputs-cache",
            "mountPath": model_dir(parts.model, track.version),
            "subPath": f"entries/{parts.key}/{DATA}",
            "readOnly": True,
        },
    ]
    container: dict[str, Any] = {
        "name": name,
        "image": parts.image,
        "command": [parts.python, "-m", "torchyard.serving"],
        "env": _env(ep, track, parts),
        "ports": [{"name": contract.PORT_NAME, "containerPort": contract.PORT}],
        "readinessProbe": _probe(contract.READY_PATH, 1, 3),
        "livenessProbe": _probe(contract.LIVE_PATH, 10, 3),
        "volumeMounts": mounts,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": restricted(),
    }
    if ep.spec.source.in_workspace:
        container["workingDir"] = WORKDIR
        mounts.append({"name": "workspace", "mountPath": WORKDIR})
    res = ep.spec.resources
    resources = requirements(res.cpu, res.memory, res.gpus)
    if resources:
        container["resources"] = resources
    return container


def _volumes(ep: OnlineEndpoint) -> list[dict[str, Any]]:
    source = ep.spec.source
    vols: list[dict[str, Any]] = [
        {"name": "runtime", "emptyDir": {"sizeLimit": "256Mi"}},
        {"name": "prepare-tmp", "emptyDir": {}},
        {
            "name": "inputs-cache",
            "persistentVolumeClaim": {"claimName": names.INPUTS_CLAIM, "readOnly": True},
        },
    ]
    if source.in_workspace:
        vols.append({"name": "workspace", "emptyDir": {}})
    if source.config_map is not None:
        vols.append({"name": "source", "configMap": {"name": source.config_map}})
    if source.snapshot is not None:
        token = {"audience": REGISTRY_AUDIENCE, "expirationSeconds": 3600, "path": "token"}
        vols.append(
            {"name": "registry-token", "projected": {"sources": [{"serviceAccountToken": token}]}}
        )
    return vols


def pod_spec(
    ep: OnlineEndpoint, track: Track, parts: PodInputs, container: str = "scorer"
) -> dict[str, Any]:
    """A serving Pod's spec (see the module docstring)."""
    spec = ep.spec
    uid = spec.run_as_user
    pod: dict[str, Any] = {
        "serviceAccountName": spec.service_account_name,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": uid,
            "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [
            *git_clone(spec.source.git, parts.settings.git_image, restricted()),
            _prepare(ep, parts),
        ],
        "containers": [_scorer(ep, track, parts, container)],
        "volumes": _volumes(ep),
        "terminationGracePeriodSeconds": contract.DEFAULT_DRAIN_SECONDS
        + spec.limits.request_timeout_seconds
        + TERMINATION_MARGIN_SECONDS,
    }
    selector = dict(spec.compute.node_selector)
    if spec.compute.pool:
        selector[wire.LABEL_POOL] = spec.compute.pool
    if selector:
        pod["nodeSelector"] = selector
    tolerations = [t.to_dict() for t in spec.compute.tolerations]
    if spec.resources.gpus:
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    if tolerations:
        pod["tolerations"] = tolerations
    if spec.compute.priority_class_name:
        pod["priorityClassName"] = spec.compute.priority_class_name
    return pod


def _template_annotations(parts: PodInputs) -> dict[str, str]:
    return {wire.ANNOTATION_SOURCE_SHA256: parts.source_sha256} if parts.source_sha256 else {}


def deployment(ep: OnlineEndpoint, track: Track, parts: PodInputs) -> dict[str, Any]:
    """The Deployment of ``track``: rolled with ``maxUnavailable: 0`` (its replicas left
    to the autoscaler when there is one)."""
    template_meta: dict[str, Any] = {"labels": labels(ep, track)}
    if parts.source_sha256:
        template_meta["annotations"] = _template_annotations(parts)
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {names.LABEL_ENDPOINT: ep.name, wire.LABEL_TRACK: track.name}},
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
        },
        "minReadySeconds": MIN_READY_SECONDS,
        "revisionHistoryLimit": 3,
        "template": {"metadata": template_meta, "spec": pod_spec(ep, track, parts)},
    }
    if track.replicas is not None:
        spec["replicas"] = track.replicas
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(ep, names.endpoint_deployment(ep.name, track.name), track),
        "spec": spec,
    }


def inference_service(ep: OnlineEndpoint, track: Track, parts: PodInputs) -> dict[str, Any]:
    """KServe's InferenceService with the same serving Pod as its custom predictor
    (Standard deployment mode: a Deployment and Service of KServe's own)."""
    predictor = pod_spec(ep, track, parts, KSERVE_CONTAINER)
    scaling = ep.spec.autoscaling
    if scaling is None:
        predictor.update(minReplicas=ep.spec.replicas, maxReplicas=ep.spec.replicas)
    else:
        predictor.update(
            minReplicas=scaling.min_replicas,
            maxReplicas=scaling.max_replicas,
            scaleMetric="cpu",
            scaleTarget=scaling.target_cpu_utilization,
        )
    predictor["labels"] = labels(ep, track)
    if parts.source_sha256:
        predictor["annotations"] = _template_annotations(parts)
    predictor["deploymentStrategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    meta = _metadata(ep, names.endpoint_deployment(ep.name, "primary"), track)
    meta["annotations"] = {KSERVE_MODE_ANNOTATION: "Standard"}
    return {
        "apiVersion": KSERVE_API_VERSION,
        "kind": "InferenceService",
        "metadata": meta,
        "spec": {"predictor": predictor},
    }
