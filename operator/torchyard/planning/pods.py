"""The children of a TrainingRun: its headless Service and one Pod per node.

Pure builders (JobSet's ``constructJob`` habit): a function of the typed run, its
Environment's image and the node index, returning the manifest ``dict`` the operator
server-side-applies and ``torchyard submit --dry-run`` prints. Names come from
``names``; the rank contract from ``rank``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchyard import __version__
from torchyard.api import TrainingRun, wire
from torchyard.api.quantities import format_bytes, quantity
from torchyard.planning import names
from torchyard.planning.rank import node_env

GANG_GATE = wire.GANG_GATE
GPU_RESOURCE = "nvidia.com/gpu"
POOL_LABEL = wire.LABEL_POOL
ATTEMPT_LABEL = wire.LABEL_ATTEMPT
QUEUED_AT_ANNOTATION = wire.ANNOTATION_QUEUED_AT
WORKDIR = "/workspace"
TOOLS_DIR = "/torchyard"
LAUNCHER_PATH = f"{TOOLS_DIR}/launcher.py"
SOURCE_MOUNT = f"{TOOLS_DIR}/source"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
REGISTRY_AUDIENCE = wire.REGISTRY_AUDIENCE
REGISTRY_TOKEN_DIR = "/var/run/secrets/torchyard/registry"
# The init containers run in the torchyard image (images/operator), whose interpreter this
# is; the Environment's own (spec.python, e.g. /opt/conda/bin/python) runs the trainer.
INIT_PYTHON = "python3"
DEFAULT_SHM_SIZE = "1Gi"


@dataclass(frozen=True)
class Settings:
    """Operator-wide settings the builders need (from the Helm chart / environment)."""

    init_image: str = f"ghcr.io/torchyard/torchyard:{__version__}"
    git_image: str = "alpine/git:2.47.2"
    dns_timeout_seconds: int = 300
    # Registries whose curated images get their tag resolved to a digest: "all", "none",
    # or host prefixes separated by commas.
    resolve_curated: str = "all"
    # The registry service the node Pods archive to ("" = none), and the token the
    # operator itself shows it when promoting outputs.
    registry_url: str = ""
    registry_token_file: str = ""
    # The CA (PEM) that signed an https registry's certificate: node Pods get it as
    # TORCHYARD_REGISTRY_CA and verify the service with it ("" = the system's CAs).
    registry_ca: str = ""

    def resolves(self, host: str) -> bool:
        if self.resolve_curated in ("all", "none"):
            return self.resolve_curated == "all"
        return any(host.startswith(p) for p in self.resolve_curated.split(",") if p)


def owner_reference(run: TrainingRun) -> dict[str, Any]:
    return {
        "apiVersion": run.api_version,
        "kind": "TrainingRun",
        "name": run.name,
        "uid": str(run.metadata.get("uid", "")),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def labels(run: TrainingRun) -> dict[str, str]:
    return {
        names.LABEL_RUN: run.name,
        names.LABEL_ENVIRONMENT: run.spec.environment,
        "app.kubernetes.io/managed-by": "torchyard",
    }


def service(run: TrainingRun) -> dict[str, Any]:
    """The headless Service that gives node 0 (``MASTER_ADDR``) a DNS name."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.service(run.name),
            "namespace": run.namespace,
            "labels": labels(run),
            "ownerReferences": [owner_reference(run)],
        },
        "spec": {
            "clusterIP": "None",
            # Ranks look node 0 up before it is Ready: publish it at once.
            "publishNotReadyAddresses": True,
            "selector": {names.LABEL_RUN: run.name},
            "ports": [
                {
                    "name": "rendezvous",
                    "port": run.spec.distribution.master_port,
                    "targetPort": run.spec.distribution.master_port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def node_selector(run: TrainingRun) -> dict[str, str]:
    selector = dict(run.spec.compute.node_selector)
    if run.spec.compute.pool:
        selector[POOL_LABEL] = run.spec.compute.pool
    return selector


def tolerations(run: TrainingRun) -> list[dict[str, Any]]:
    out = [t.to_dict() for t in run.spec.compute.tolerations]
    if run.spec.resources.gpus_per_node > 0:
        out.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    return out


def resource_requirements(run: TrainingRun) -> dict[str, Any]:
    res = run.spec.resources
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if res.cpu:
        requests["cpu"] = res.cpu
    if res.memory:
        requests["memory"] = res.memory
        limits["memory"] = res.memory
    if res.gpus_per_node:
        requests[GPU_RESOURCE] = str(res.gpus_per_node)
        limits[GPU_RESOURCE] = str(res.gpus_per_node)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def shm_size(run: TrainingRun) -> str:
    """/dev/shm: the spec's size, else half of the memory limit, else 1Gi (the container
    default of 64 MB is too small). A memory-backed /dev/shm counts against the memory
    limit, so the API refuses a size above ``memory``."""
    res = run.spec.resources
    if res.shm_size:
        return res.shm_size
    if res.memory:
        return format_bytes(quantity(res.memory) / 2)
    return DEFAULT_SHM_SIZE


def _source_init(run: TrainingRun, settings: Settings) -> list[dict[str, Any]]:
    """Init containers: copy the launcher (and a ConfigMap's code) / clone the repository.
    They run in the torchyard image with its own interpreter, never the Environment's."""
    install: dict[str, Any] = {
        "name": "torchyard-init",
        "image": settings.init_image,
        "command": [INIT_PYTHON, "-m", "torchyard.launcher", "--install", LAUNCHER_PATH],
        "volumeMounts": [{"name": "torchyard", "mountPath": TOOLS_DIR}],
        "securityContext": _restricted(),
    }
    containers = [install]
    source = run.spec.source
    if source.config_map is not None:
        install["command"] = [*install["command"], "--copy", SOURCE_MOUNT, WORKDIR]
        install["volumeMounts"] += [
            {"name": "source", "mountPath": SOURCE_MOUNT, "readOnly": True},
            {"name": "workspace", "mountPath": WORKDIR},
        ]
    elif source.snapshot is not None:
        install["command"] = [*install["command"], "--fetch", source.snapshot, WORKDIR]
        install["env"] = [
            {"name": "TORCHYARD_REGISTRY_URL", "value": settings.registry_url},
            {"name": "TORCHYARD_NAMESPACE", "value": run.namespace},
            {"name": "TORCHYARD_REGISTRY_TOKEN_FILE", "value": f"{REGISTRY_TOKEN_DIR}/token"},
        ]
        if settings.registry_ca:
            install["env"].append({"name": "TORCHYARD_REGISTRY_CA", "value": settings.registry_ca})
        install["volumeMounts"] += [
            {"name": "workspace", "mountPath": WORKDIR},
            {"name": "registry-token", "mountPath": REGISTRY_TOKEN_DIR, "readOnly": True},
        ]
    elif source.git is not None:
        containers.append(
            {
                "name": "git-clone",
                "image": settings.git_image,
                "command": [
                    "sh",
                    "-ec",
                    'git clone --quiet "$REPO" /workspace/.src && cd /workspace/.src '
                    '&& git checkout --quiet "$REVISION" && cp -a "/workspace/.src/$SUBDIR/." '
                    "/workspace/ && rm -rf /workspace/.src",
                ],
                "env": [
                    {"name": "REPO", "value": source.git.url},
                    {"name": "REVISION", "value": source.git.revision},
                    {"name": "SUBDIR", "value": source.git.path},
                ],
                "volumeMounts": [{"name": "workspace", "mountPath": WORKDIR}],
                "securityContext": _restricted(),
            }
        )
    return containers


def pod_security(run: TrainingRun) -> dict[str, Any]:
    """seccomp RuntimeDefault always; with spec.runAsUser a non-root user, group and
    fsGroup (the working volumes stay writable): Pod Security "restricted"."""
    context: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    uid = run.spec.run_as_user
    if uid is not None:
        context.update(runAsNonRoot=True, runAsUser=uid, runAsGroup=uid, fsGroup=uid)
    return context


def _restricted() -> dict[str, Any]:
    """What Pod Security "restricted" asks of every container, except runAsNonRoot (the
    image decides its user): a namespace enforcing "baseline" and warning "restricted"
    runs node Pods without a warning but that one."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _volumes(run: TrainingRun) -> list[dict[str, Any]]:
    vols: list[dict[str, Any]] = [
        {"name": "torchyard", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(run)}},
    ]
    if run.spec.source.in_workspace:
        vols.append({"name": "workspace", "emptyDir": {}})
    if run.spec.source.config_map is not None:
        vols.append({"name": "source", "configMap": {"name": run.spec.source.config_map}})
    return vols


def pod(
    run: TrainingRun,
    node_rank: int,
    *,
    image: str,
    python: str = "python3",
    attempt: int = 0,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """The Pod of node ``node_rank``: the launcher starts the ranks inside ``image``."""
    settings = settings or Settings()
    in_workspace = run.spec.source.in_workspace
    workdir = WORKDIR if in_workspace else "."
    env = node_env(run, node_rank, workdir=workdir)
    env["TORCHYARD_DNS_TIMEOUT"] = str(settings.dns_timeout_seconds)
    if settings.registry_url:
        env["TORCHYARD_REGISTRY_URL"] = settings.registry_url
        env["TORCHYARD_REGISTRY_TOKEN_FILE"] = f"{REGISTRY_TOKEN_DIR}/token"
        if settings.registry_ca:
            env["TORCHYARD_REGISTRY_CA"] = settings.registry_ca
        if run.spec.outputs.optional:
            env["TORCHYARD_OUTPUTS_OPTIONAL"] = "1"
    if run.spec.source.git is not None and run.spec.source.git.path:
        env["TORCHYARD_SOURCE_PATH"] = run.spec.source.git.path
    pod_labels = {
        **labels(run),
        names.LABEL_NODE_RANK: str(node_rank),
        ATTEMPT_LABEL: str(attempt),
    }
    annotations: dict[str, str] = {}
    if run.metadata.get("creationTimestamp"):
        annotations[QUEUED_AT_ANNOTATION] = str(run.metadata["creationTimestamp"])
    queue = run.spec.scheduling.queue_name
    if queue:
        pod_labels[KUEUE_QUEUE_LABEL] = queue
        pod_labels[KUEUE_GROUP_LABEL] = f"{run.name}-{attempt}"
        annotations[KUEUE_TOTAL_ANNOTATION] = str(run.spec.distribution.node_count)
    container: dict[str, Any] = {
        "name": "trainer",
        "image": image,
        "command": [python, LAUNCHER_PATH, "--", *run.spec.command],
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "ports": [{"name": "rendezvous", "containerPort": run.spec.distribution.master_port}],
        "volumeMounts": [
            {"name": "torchyard", "mountPath": TOOLS_DIR, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _restricted(),
    }
    if in_workspace:
        container["workingDir"] = WORKDIR
        container["volumeMounts"].append({"name": "workspace", "mountPath": WORKDIR})
    if settings.registry_url:
        container["volumeMounts"].append(
            {"name": "registry-token", "mountPath": REGISTRY_TOKEN_DIR, "readOnly": True}
        )
    resources = resource_requirements(run)
    if resources:
        container["resources"] = resources
    spec: dict[str, Any] = {
        "hostname": names.pod(run.name, node_rank),
        "subdomain": names.service(run.name),
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        # The registry authorises archive uploads by this ServiceAccount (the projected
        # registry token below is its); the API token is mounted only when asked for.
        "serviceAccountName": run.spec.service_account_name,
        "automountServiceAccountToken": run.spec.automount_service_account_token,
        # Pod Security "restricted" but for runAsNonRoot: curated PyTorch images may run
        # as root, so the user a Pod runs as is the image's (see _restricted).
        "securityContext": pod_security(run),
        "initContainers": _source_init(run, settings),
        "containers": [container],
        "volumes": _volumes(run)
        + (
            [
                {
                    "name": "registry-token",
                    "projected": {
                        "sources": [
                            {
                                "serviceAccountToken": {
                                    "audience": REGISTRY_AUDIENCE,
                                    "expirationSeconds": 3600,
                                    "path": "token",
                                }
                            }
                        ]
                    },
                }
            ]
            if settings.registry_url
            else []
        ),
        "terminationGracePeriodSeconds": 30,
    }
    if not queue:
        spec["schedulingGates"] = [{"name": GANG_GATE}]
    selector = node_selector(run)
    if selector:
        spec["nodeSelector"] = selector
    tols = tolerations(run)
    if tols:
        spec["tolerations"] = tols
    if run.spec.compute.priority_class_name:
        spec["priorityClassName"] = run.spec.compute.priority_class_name
    if run.spec.policy.active_deadline_seconds:
        spec["activeDeadlineSeconds"] = run.spec.policy.active_deadline_seconds
    metadata: dict[str, Any] = {
        "name": names.pod(run.name, node_rank),
        "namespace": run.namespace,
        "labels": pod_labels,
        "ownerReferences": [owner_reference(run)],
    }
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def ungate(pod_manifest: dict[str, Any]) -> dict[str, Any]:
    """The same Pod without the gang gate: applying it lets the scheduler place it."""
    spec = {k: v for k, v in pod_manifest["spec"].items() if k != "schedulingGates"}
    return {**pod_manifest, "spec": spec}


def pods(
    run: TrainingRun,
    *,
    image: str,
    python: str = "python3",
    attempt: int = 0,
    settings: Settings | None = None,
) -> list[dict[str, Any]]:
    return [
        pod(run, i, image=image, python=python, attempt=attempt, settings=settings)
        for i in range(run.spec.distribution.node_count)
    ]
