"""The children of a TrainingRun: its headless Service and one Pod per node.

Pure builders (JobSet's ``constructJob`` habit): a function of the typed run, its
Environment's image and the node index, returning the manifest ``dict`` the operator
server-side-applies and ``torchyard submit --dry-run`` prints. Names come from
``names``; the rank contract from ``rank``. The launcher (and the other
``SHIPPED_MODULES``) reaches a Pod as a read-only ConfigMap volume (``shipped``), and the
main container's launcher fetches or copies the source before it starts the ranks: no
init container but a git source's clone.
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from typing_extensions import Unpack

from torchyard import __version__, distributions
from torchyard.api import GitSource, OnlineEndpoint, TrainingRun, wire
from torchyard.api.quantities import format_bytes, quantity
from torchyard.launch import coordination
from torchyard.launch.contract import (
    COORDINATOR_PORT,
    NODE_LAUNCHER,
    TORCHYARD_COORDINATOR,
    TORCHYARD_DISTRIBUTION,
    TORCHYARD_DNS_TIMEOUT,
    TORCHYARD_GPUS_PER_NODE,
    TORCHYARD_LOG_LIMIT_BYTES,
    TORCHYARD_LOG_RULES,
    TORCHYARD_OUTPUTS_OPTIONAL,
    TORCHYARD_REGISTRY_CA,
    TORCHYARD_REGISTRY_TOKEN_FILE,
    TORCHYARD_REGISTRY_URL,
    TORCHYARD_RESTART_BUDGET,
    TORCHYARD_SHIPPED_PATH,
    TORCHYARD_SOURCE_PATH,
    TORCHYARD_STALL_BUDGETS,
    TORCHYARD_STALL_TIMEOUT,
)
from torchyard.planning import checkpoints, exclusions, names, shipped, topology
from torchyard.planning import inputs as run_inputs
from torchyard.planning import tracking as run_tracking
from torchyard.planning.rank import node_env

GANG_GATE = wire.GANG_GATE
GPU_RESOURCE = "nvidia.com/gpu"
POOL_LABEL = wire.LABEL_POOL
ATTEMPT_LABEL = wire.LABEL_ATTEMPT
QUEUED_AT_ANNOTATION = wire.ANNOTATION_QUEUED_AT
PLACEMENT_ANNOTATION = wire.ANNOTATION_PLACEMENT
ADMITTED_ANNOTATION = wire.ANNOTATION_ADMITTED
WORKDIR = "/workspace"
TOOLS_DIR = "/torchyard"
# The stdlib-only modules of the torchyard package that reach every node Pod, in a
# ``torchyard/`` package folder under SHIPPED_ROOT (a ConfigMap, see ``shipped``): the
# launcher (the ``launch`` package, every module of it) runs from there, and the ranks get
# SHIPPED_ROOT on their PYTHONPATH (``checkpoint``, ``progress``).
SHIPPED_MODULES: tuple[str, ...] = ("launch", "checkpoint", "checkpoint_store", "progress")
SHIPPED_ROOT = f"{TOOLS_DIR}/lib"
SHIPPED_PACKAGE = f"{SHIPPED_ROOT}/{shipped.PACKAGE}"
LAUNCHER_PATH = f"{SHIPPED_PACKAGE}/launch/main.py"
SOURCE_MOUNT = f"{TOOLS_DIR}/source"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
# Each attempt is a Pod group of its own: Kueue is not to wait for replacement Pods in it
# (it would keep the stopped Pods' finalizers, and torchyard waits for them to be gone).
KUEUE_RETRIABLE_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
REGISTRY_AUDIENCE = wire.REGISTRY_AUDIENCE
REGISTRY_TOKEN_DIR = "/var/run/secrets/torchyard/registry"
# An Environment build's init container runs in the torchyard image (images/operator),
# whose interpreter this is; the Environment's own (spec.python) runs the trainer.
INIT_PYTHON = "python3"
# The launcher's own SIGTERM-to-SIGKILL time for its ranks (its TORCHYARD_GRACE_PERIOD
# default): the just-in-time checkpoint gets the Pod's grace period less this.
LAUNCHER_GRACE_SECONDS = 10
DEFAULT_SHM_SIZE = "1Gi"


@dataclass(frozen=True)
class Settings:
    """Operator-wide settings the builders need (from the Helm chart / environment)."""

    # The image of an Environment build's init container (it copies envbuild.py); node
    # Pods have none but a git source's clone.
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
    # The most each rank's archived log holds when a run sets no policy.logLimitBytes
    # (``torchyard operator --default-log-limit-bytes``, the chart's
    # operator.defaultLogLimitBytes); None: the launcher's own default.
    log_limit_bytes: int | None = None
    # The namespaces' inputs caches: their claims, and the size their entries keep under.
    inputs_cache: run_inputs.CacheSettings = field(default_factory=run_inputs.CacheSettings)
    # The MLflow tracking server (the chart's tracking.mlflow; no URI: none).
    tracking: run_tracking.Settings = field(default_factory=run_tracking.Settings)
    # How a run with scheduling.queueName goes to Kueue (the chart's kueue.integration):
    # "workload" (torchyard makes its Workload), "podGroups" (plain Pod groups: a Kueue
    # without Workload v1beta2), "auto" (a Workload when Kueue serves v1beta2).
    kueue_integration: str = "auto"

    def resolves(self, host: str) -> bool:
        if self.resolve_curated in ("all", "none"):
            return self.resolve_curated == "all"
        return any(host.startswith(p) for p in self.resolve_curated.split(",") if p)


def owner_reference(owner: TrainingRun | OnlineEndpoint) -> dict[str, Any]:
    """The controller reference of a child of ``owner`` (a run's Pods, an endpoint's
    Deployments)."""
    return {
        "apiVersion": owner.api_version,
        "kind": owner.kind,
        "name": owner.name,
        "uid": str(owner.metadata.get("uid", "")),
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
    """The headless Service that gives node 0 (``MASTER_ADDR``) a DNS name, and every
    node Pod one when the distribution type names them all (MPI's hostfile): selecting
    node 0 alone, its Endpoints change with one Pod, not with each Pod of the gang as
    they start (writes that raced the scheduler in benchmarks/peers.py's fan-out)."""
    selector = {names.LABEL_RUN: run.name}
    if not distributions.of(run.spec.distribution).names_every_node:
        selector[names.LABEL_NODE_RANK] = "0"
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
            "selector": selector,
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
    return requirements(res.cpu, res.memory, res.gpus_per_node)


def requirements(cpu: str | None, memory: str | None, gpus: int) -> dict[str, Any]:
    """A container's resources: CPU requested, memory and GPUs requested and limited."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if cpu:
        requests["cpu"] = cpu
    if memory:
        requests["memory"] = limits["memory"] = memory
    if gpus:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(gpus)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


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


def shipped_files() -> dict[str, str]:
    """The files of the shipped ``torchyard/`` package folder (``SHIPPED_MODULES``)."""
    return shipped.sources(SHIPPED_MODULES)


def launcher_config_map(namespace: str) -> dict[str, Any]:
    """The ConfigMap of the shipped modules in ``namespace``: applied before node Pods."""
    return shipped.config_map(namespace, shipped_files())


def source_arguments(run: TrainingRun) -> list[str]:
    """What the launcher does with the source before it starts the ranks, in the main
    container: copy a ConfigMap's code (or unpack its snapshot) into the working folder
    (``--copy``), or download, check and unpack a registry snapshot (``--fetch``)."""
    source = run.spec.source
    if source.config_map is not None:
        return ["--copy", SOURCE_MOUNT, WORKDIR]
    if source.snapshot is not None:
        return ["--fetch", source.snapshot, WORKDIR]
    return []


def git_clone(
    git: GitSource | None, image: str, security: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The init container of a git source (a node Pod's, a serving Pod's): clone the
    repository into the workspace (none for another source)."""
    if git is None:
        return []
    return [
        {
            "name": "git-clone",
            "image": image,
            "command": [
                "sh",
                "-ec",
                'git clone --quiet "$REPO" /workspace/.src && cd /workspace/.src '
                '&& git checkout --quiet "$REVISION" && cp -a "/workspace/.src/$SUBDIR/." '
                "/workspace/ && rm -rf /workspace/.src",
            ],
            "env": [
                {"name": "REPO", "value": git.url},
                {"name": "REVISION", "value": git.revision},
                {"name": "SUBDIR", "value": git.path},
            ],
            "volumeMounts": [{"name": "workspace", "mountPath": WORKDIR}],
            "securityContext": dict(security),
        }
    ]


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
        {
            "name": "torchyard",
            "configMap": {
                "name": shipped.name_of(SHIPPED_MODULES),
                "defaultMode": 0o444,
                "items": shipped.items(SHIPPED_MODULES),
            },
        },
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(run)}},
    ]
    if run.spec.source.in_workspace:
        vols.append({"name": "workspace", "emptyDir": {}})
    if run.spec.source.config_map is not None:
        vols.append({"name": "source", "configMap": {"name": run.spec.source.config_map}})
    return vols


def watch_env(run: TrainingRun, default_log_limit: int | None = None) -> dict[str, str]:
    """What the launcher watches the ranks with (policy): the stall timeout
    (``launch.node_launcher.Launcher._check_stall``), the stall budgets of the phases
    (``launch.stalls.stall_budgets``), the log rules (``launch.output.LogScanner``) and the
    limit of each rank's log (``launch.output.CappedLog``): the run's own, else
    ``default_log_limit`` (the operator's, ``Settings.log_limit_bytes``), else none (the
    launcher's default). Local mode passes the same, with no operator's default."""
    env: dict[str, str] = {}
    policy = run.spec.policy
    if policy.stall_timeout_seconds:
        env[TORCHYARD_STALL_TIMEOUT] = str(policy.stall_timeout_seconds)
    if policy.stall_budgets is not None and policy.stall_budgets.to_dict():
        env[TORCHYARD_STALL_BUDGETS] = json.dumps(
            policy.stall_budgets.to_dict(), separators=(",", ":")
        )
    if policy.log_rules:
        env[TORCHYARD_LOG_RULES] = json.dumps(
            [r.to_dict() for r in policy.log_rules], separators=(",", ":")
        )
    log_limit = policy.log_limit_bytes if policy.log_limit_bytes is not None else default_log_limit
    if log_limit is not None:
        env[TORCHYARD_LOG_LIMIT_BYTES] = str(log_limit)
    return env


def place(run: TrainingRun) -> distributions.Place:
    """Where the run's node Pods are, for its distribution type: their DNS names through
    the headless Service, node 0 first, and the name of the run's key Secret."""
    return _place(run.name, run.spec.distribution.node_count)


@functools.lru_cache(maxsize=64)
def _place(run_name: str, node_count: int) -> distributions.Place:
    """:func:`place`, made once per run and size: every node Pod's manifest asks for it,
    and it names every node (a gang of 1024 built 2 million names, 0.8 s, before)."""
    service = names.service(run_name)
    hosts = tuple(f"{names.pod(run_name, i)}.{service}" for i in range(node_count))
    return distributions.Place(hosts=hosts, domain=service, key_secret=names.key_secret(run_name))


def key_secret(run: TrainingRun, key: str) -> dict[str, Any]:
    """The run's key Secret, for a distribution type that ``needs_key`` (``key``: random,
    made once by the controller), owned by the run, mounted read-only into its node Pods
    (the type's ``pod_parts``); never in an environment variable."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": place(run).key_secret,
            "namespace": run.namespace,
            "labels": {names.LABEL_RUN: run.name, "app.kubernetes.io/managed-by": "torchyard"},
            "ownerReferences": [owner_reference(run)],
        },
        "data": {"key": base64.b64encode(key.encode()).decode()},
    }


def launcher_env(
    run: TrainingRun,
    node_rank: int,
    *,
    workdir: str,
    grace_period: int,
    attempt: str,
    master_addr: str | None = None,
    master_port: int | None = None,
    local: bool = False,
    default_log_limit: int | None = None,
) -> dict[str, str]:
    """The TORCHYARD_* variables (and the rank contract) of node ``node_rank``'s launcher,
    in a node Pod and in local mode alike: ``rank.node_env``, what it watches the ranks
    with (:func:`watch_env`), MPI's (``local``: one mpirun over this machine's slots) and
    the checkpoint folder's (``grace_period``: the launcher's SIGTERM-to-SIGKILL time,
    ``attempt``: the same on every node of one attempt; ``default_log_limit``: the
    operator's, for a run that sets none). Each side adds its own: the Pod the DNS wait,
    the shipped folder, the GPUs and the registry; local mode its files."""
    env = node_env(
        run, node_rank, master_addr=master_addr, master_port=master_port, workdir=workdir
    )
    env.update(watch_env(run, default_log_limit))
    dist = run.spec.distribution
    kind = distributions.of(dist)
    if kind.launcher != NODE_LAUNCHER:  # the launcher class that runs the node
        env[TORCHYARD_DISTRIBUTION] = kind.launcher
    env.update(kind.launcher_env(dist, None if local else place(run)))
    env.update(checkpoints.env(run, grace_period, attempt))
    return env


def in_place_env(
    run: TrainingRun, budget: coordination.Budget | None, coordinator: str | None = None
) -> dict[str, str]:
    """Where node 0's coordinator listens (``coordinator``: "host:port", node 0's DNS name
    by default) and what ``policy.backoffLimit`` has left, for the launchers to restart
    their ranks in place (``launch.coordination``): for a distribution type whose nodes
    run the node launcher (mpirun's gang restarts whole). Local mode passes its own."""
    kind = distributions.of(run.spec.distribution)
    if budget is None or kind.launcher != NODE_LAUNCHER:
        return {}
    return {
        TORCHYARD_COORDINATOR: coordinator or f"{place(run).hosts[0]}:{COORDINATOR_PORT}",
        TORCHYARD_RESTART_BUDGET: budget.to_json(),
    }


def pod(
    run: TrainingRun,
    node_rank: int,
    *,
    image: str,
    python: str = "python3",
    attempt: int = 0,
    settings: Settings | None = None,
    excluded: Sequence[str] = (),
    deadline_left: int | None = None,
    tracking: Mapping[str, Any] | None = None,
    placement: topology.Request | None = None,
    gated: bool = True,
    pod_group: bool = False,
    restart_budget: coordination.Budget | None = None,
) -> dict[str, Any]:
    """The Pod of node ``node_rank``: the launcher starts the ranks inside ``image``, on
    none of the ``excluded`` nodes (the run's ``status.excludedNodes``); its
    ``activeDeadlineSeconds`` is ``deadline_left``, the seconds left of the run's
    ``policy.activeDeadlineSeconds`` (``status.deadlines.pod_seconds``; None: all of it);
    ``tracking`` is the run's ``status.tracking`` (its MLflow run, ``planning.tracking.env``);
    ``placement`` its ``spec.placement`` as torchyard's own gang admission reads it (an
    annotation of the gated Pod, ``planning.admission``); ``gated`` False: a Pod of a gang
    Kueue admitted, created without the gang gate (``planning.workloads``); ``pod_group``:
    handed to Kueue as a plain Pod group (the fallback of a Kueue without Workload
    v1beta2: its labels, and Kueue's own gate instead of torchyard's);
    ``restart_budget``: what ``policy.backoffLimit`` has left, for the launchers to restart
    their ranks in place (:func:`in_place_env`; None: nothing left)."""
    settings = settings or Settings()
    in_workspace = run.spec.source.in_workspace
    env = launcher_env(
        run,
        node_rank,
        workdir=WORKDIR if in_workspace else ".",
        grace_period=LAUNCHER_GRACE_SECONDS,
        attempt=checkpoints.attempt_id(run, attempt),
        default_log_limit=settings.log_limit_bytes,
    )
    env[TORCHYARD_DNS_TIMEOUT] = str(settings.dns_timeout_seconds)
    env.update(run_inputs.env(run))
    env[TORCHYARD_SHIPPED_PATH] = SHIPPED_ROOT
    env.update(in_place_env(run, restart_budget))
    if run.spec.resources.gpus_per_node:  # PyTorch's NCCL flight recorder
        env[TORCHYARD_GPUS_PER_NODE] = str(run.spec.resources.gpus_per_node)
    extra = distributions.of(run.spec.distribution).pod_parts(run.spec.distribution, place(run))
    if settings.registry_url:
        env[TORCHYARD_REGISTRY_URL] = settings.registry_url
        env[TORCHYARD_REGISTRY_TOKEN_FILE] = f"{REGISTRY_TOKEN_DIR}/token"
        if settings.registry_ca:
            env[TORCHYARD_REGISTRY_CA] = settings.registry_ca
        if run.spec.outputs.optional:
            env[TORCHYARD_OUTPUTS_OPTIONAL] = "1"
    if run.spec.source.git is not None and run.spec.source.git.path:
        env[TORCHYARD_SOURCE_PATH] = run.spec.source.git.path
    pod_labels = {
        **labels(run),
        names.LABEL_NODE_RANK: str(node_rank),
        ATTEMPT_LABEL: str(attempt),
    }
    annotations: dict[str, str] = {}
    if run.metadata.get("creationTimestamp"):
        annotations[QUEUED_AT_ANNOTATION] = str(run.metadata["creationTimestamp"])
    if placement is not None:
        annotations[PLACEMENT_ANNOTATION] = placement.to_json()
    queue = run.spec.scheduling.queue_name
    if queue and pod_group:
        pod_labels[KUEUE_QUEUE_LABEL] = queue
        pod_labels[KUEUE_GROUP_LABEL] = f"{run.name}-{attempt}"
        annotations[KUEUE_TOTAL_ANNOTATION] = str(run.spec.distribution.node_count)
        annotations[KUEUE_RETRIABLE_ANNOTATION] = "false"
    container: dict[str, Any] = {
        "name": "trainer",
        "image": image,
        "command": [python, LAUNCHER_PATH, *source_arguments(run), "--", *run.spec.command],
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())]
        + run_tracking.env(settings.tracking, tracking),
        "ports": [{"name": "rendezvous", "containerPort": run.spec.distribution.master_port}],
        "volumeMounts": [
            {"name": "torchyard", "mountPath": SHIPPED_PACKAGE, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _restricted(),
    }
    if in_workspace:
        container["workingDir"] = WORKDIR
        container["volumeMounts"].append({"name": "workspace", "mountPath": WORKDIR})
    if run.spec.source.config_map is not None:
        container["volumeMounts"].append(
            {"name": "source", "mountPath": SOURCE_MOUNT, "readOnly": True}
        )
    if settings.registry_url:
        container["volumeMounts"].append(
            {"name": "registry-token", "mountPath": REGISTRY_TOKEN_DIR, "readOnly": True}
        )
    container["volumeMounts"].extend(checkpoints.mounts(run))
    container["volumeMounts"].extend(run_inputs.mounts(run))
    container["volumeMounts"].extend(extra.mounts)
    container["ports"].extend(extra.ports)
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
        "terminationGracePeriodSeconds": run.spec.policy.termination_grace_period_seconds,
    }
    spec["volumes"].extend(checkpoints.volumes(run))
    spec["volumes"].extend(run_inputs.volumes(run))
    init = git_clone(run.spec.source.git, settings.git_image, _restricted())
    if init:
        spec["initContainers"] = init
    spec["volumes"].extend(extra.volumes)
    if gated and not pod_group:
        spec["schedulingGates"] = [{"name": GANG_GATE}]
    selector = node_selector(run)
    if selector:
        spec["nodeSelector"] = selector
    tols = tolerations(run)
    if tols:
        spec["tolerations"] = tols
    # The nodes that failed this run (status.excludedNodes): never again for it.
    avoid = exclusions.node_affinity(excluded)
    if avoid is not None:
        spec["affinity"] = avoid
    if run.spec.compute.priority_class_name:
        spec["priorityClassName"] = run.spec.compute.priority_class_name
    deadline = run.spec.policy.active_deadline_seconds
    if deadline:
        left = deadline if deadline_left is None else max(1, min(deadline, deadline_left))
        spec["activeDeadlineSeconds"] = left
    metadata: dict[str, Any] = {
        "name": names.pod(run.name, node_rank),
        "namespace": run.namespace,
        "labels": pod_labels,
        "ownerReferences": [owner_reference(run)],
    }
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def ungate(
    pod_manifest: dict[str, Any],
    selector: Mapping[str, str] | None = None,
    tolerations_: Sequence[Mapping[str, Any]] = (),
    admitted: str | None = None,
) -> dict[str, Any]:
    """The same Pod without the gang gate: applying it lets the scheduler place it; with
    ``selector`` and ``tolerations_`` added (its domain of the placement, a Kueue
    flavor's labels and taints: a gated Pod's node selector and tolerations may grow) and
    ``admitted``, how its gang was admitted, as :data:`ADMITTED_ANNOTATION`."""
    if admitted:
        meta = dict(pod_manifest["metadata"])
        meta["annotations"] = {**meta.get("annotations", {}), ADMITTED_ANNOTATION: admitted}
        pod_manifest = {**pod_manifest, "metadata": meta}
    spec = {k: v for k, v in pod_manifest["spec"].items() if k != "schedulingGates"}
    if selector:
        spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **selector}
    if tolerations_:
        have = list(spec.get("tolerations", []))
        spec["tolerations"] = have + [dict(t) for t in tolerations_ if t not in have]
    return {**pod_manifest, "spec": spec}


class PodOptions(TypedDict, total=False):
    """:func:`pod`'s options besides the image, as :func:`pods` passes them on."""

    python: str
    attempt: int
    settings: Settings | None
    excluded: Sequence[str]
    deadline_left: int | None
    tracking: Mapping[str, Any] | None
    placement: topology.Request | None
    gated: bool
    pod_group: bool
    restart_budget: coordination.Budget | None


def pods(run: TrainingRun, *, image: str, **options: Unpack[PodOptions]) -> list[dict[str, Any]]:
    """Every node's :func:`pod`."""
    return [pod(run, i, image=image, **options) for i in range(run.spec.distribution.node_count)]
