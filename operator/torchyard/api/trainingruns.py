"""The TrainingRun resource: a distributed PyTorch run (~ Azure ML ScriptRunConfig + submit).

Typed spec and status, with the field descriptions that ``kubectl explain`` shows and the
CEL rules the apiserver enforces (the CRD in ``crds/`` is generated from these models by
``torchyard.api.crds``). Parsed once per event by the controller, by local mode and by
the SDK; no I/O here. Long because it is one concern: every field of the spec and status
with the description users read in ``kubectl explain`` and the rules that check it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from torchyard import distributions
from torchyard.api._base import (
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    ENV_VAR_NAME,
    LABEL_KEY_PREFIX_MAX_LENGTH,
    LABEL_VALUE,
    LABEL_VALUE_MAX_LENGTH,
    QUANTITY,
    QUANTITY_MAX_LENGTH,
    Model,
    Named,
    NoNulStr,
    label_key,
    label_key_cel,
    memory_floor_rule,
    nested,
    service_account,
    with_rules,
)
from torchyard.api.checkpoints import SPEC_RULE as CHECKPOINTS_RULE
from torchyard.api.checkpoints import Checkpoints, check_shared
from torchyard.api.inputs import INPUTS_RULES, MAX_INPUTS, Input, check_inputs
from torchyard.api.placement import SPEC_RULES as PLACEMENT_RULES
from torchyard.api.placement import Placement, managed_by_field
from torchyard.api.placement import check as check_placement
from torchyard.api.policies import Policy
from torchyard.api.quantities import quantity
from torchyard.api.trainingrun_status import TrainingRunStatus
from torchyard.api.wire import API_VERSION, DEFAULT_MASTER_PORT, LABEL_POOL
from torchyard.launch.contract import RANK_CONTRACT_VARIABLES

# Pods are named <run>-<node>, the headless Service <run>: DNS-1035 labels of <= 63 chars.
RUN_NAME_MAX = 52
RUN_NAME_RULE = (
    "a TrainingRun name must be a DNS-1035 label (lower-case letters, digits and '-', "
    f"starting with a letter) of at most {RUN_NAME_MAX} characters, so that its Pods and "
    "Service can be named after it"
)


GIT_URL = r"^((https?|ssh|git)://[^/]|[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:)"
GIT_URL_MAX_LENGTH = 2048
GIT_URL_RULE = (
    "source.git.url must be an https://, http://, ssh:// or git:// URL, or user@host:path "
    "(ssh): the clone runs in the node Pod, where a file:// URL or a local path names "
    "nothing of yours; push the repository to a Git server, or send the folder with "
    "source.configMap (torchyard submit --source DIR)"
)


class GitSource(Model):
    """Code cloned from a Git repository by an init container."""

    model_config = with_rules(
        {
            "rule": "self.url.matches(r'" + GIT_URL + "')",
            "message": GIT_URL_RULE,
            "fieldPath": ".url",
            "reason": "FieldValueInvalid",
        }
    )

    url: NoNulStr = Field(
        min_length=1,
        max_length=GIT_URL_MAX_LENGTH,
        description="URL of the repository to clone: https://, http://, ssh://, git:// or "
        "user@host:path (no file:// nor a local path: the clone runs in the node Pod).",
    )
    revision: NoNulStr = Field(
        default="HEAD",
        min_length=1,
        description="Branch, tag or commit to check out.",
    )
    path: NoNulStr = Field(
        default="",
        description="Sub-folder of the repository to run the command in ('' = the root).",
    )

    @model_validator(mode="after")
    def _cloneable_url(self) -> GitSource:
        if not re.match(GIT_URL, self.url):
            raise ValueError(f"{GIT_URL_RULE}; got {self.url!r}")
        return self


class Source(Model):
    """Where the training code comes from: exactly one of configMap, snapshot, git or
    image."""

    model_config = with_rules(
        {
            "rule": "[has(self.configMap), has(self.snapshot), has(self.git), has(self.image)]"
            ".filter(x, x).size() == 1",
            "message": "exactly one of source.configMap, source.snapshot, source.git or "
            "source.image must be set",
        },
        {
            "rule": "!has(self.image) || self.image",
            "message": "source.image must be true when set (the code is in the image)",
            "fieldPath": ".image",
        },
    )

    config_map: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
        description="Name of a ConfigMap in the run's namespace holding the code "
        "(`torchyard submit --source DIR` makes one); mounted as the working directory. "
        "The run waits (Admitted False, ConfigMapNotFound) until it exists.",
    )
    snapshot: str | None = Field(
        default=None,
        pattern=r"^[a-f0-9]{64}$",
        description="sha256 of a source snapshot in the model registry service "
        "(`torchyard submit --source DIR` uploads folders over ~900 KiB there); "
        "fetched, checked and unpacked into the working directory.",
    )
    git: GitSource | None = Field(default=None, description="A Git repository to clone.")
    image: bool | None = Field(
        default=None,
        description="true: the code is already in the Environment's image; the command "
        "runs in the image's working directory.",
    )

    @property
    def in_workspace(self) -> bool:
        """The code is put into a writable working folder (not the image's own)."""
        return self.image is None

    @model_validator(mode="after")
    def _exactly_one(self) -> Source:
        chosen = [
            self.config_map is not None,
            self.snapshot is not None,
            self.git is not None,
            self.image is not None,
        ]
        if sum(chosen) != 1:
            raise ValueError(
                "exactly one of source.configMap, source.snapshot, source.git or source.image "
                "must be set"
            )
        if self.image is False:
            raise ValueError("source.image must be true when set (the code is in the image)")
        return self


class Distribution(Model):
    """How the run is spread over nodes and processes (~ PyTorchConfiguration)."""

    # every registered type's rules (distributions.Rule); the CRD carries the built-in ones
    model_config = with_rules(*(rule.cel for rule in distributions.BUILT_IN_RULES))

    type: str = Field(
        default="pytorch",
        description="pytorch: torch.distributed with the rank contract (MASTER_ADDR, "
        "WORLD_SIZE, RANK, ...); none: one process, no rendezvous; mpi: node 0 runs "
        "mpirun over all nodes (OMPI_COMM_WORLD_RANK/SIZE come from mpirun; ~ "
        "MpiConfiguration).",
        # the types this torchyard ships; a type registered at run time (a test's) is
        # known to local mode and the SDK only
        json_schema_extra={"enum": list(distributions.BUILT_IN)},
    )
    implementation: str | None = Field(
        default=None,
        max_length=32,
        description="type mpi only: the MPI implementation the image carries. Only "
        "'openmpi' (the default) is supported.",
    )
    mpirun_args: list[NoNulStr] | None = Field(
        default=None,
        max_length=64,
        description="type mpi only: extra arguments for mpirun, placed before the command "
        "(e.g. [--mca, btl_tcp_if_include, eth0]).",
    )
    node_count: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Number of nodes (one Pod each), ~ PyTorchConfiguration(node_count).",
    )
    process_count_per_node: int = Field(
        default=1,
        ge=1,
        le=128,
        description="Processes per node; with GPUs usually one per GPU. The world size is "
        "nodeCount x processCountPerNode (~ PyTorchConfiguration(process_count)).",
    )
    launch: Literal["process", "node"] = Field(
        default="process",
        description="process: torchyard starts every rank with RANK and LOCAL_RANK set; "
        "node: the command runs once per node (e.g. `torchrun script.py`) with NODE_RANK "
        "and the PET_* variables set.",
    )
    master_port: int = Field(
        default=DEFAULT_MASTER_PORT,
        ge=1024,
        le=65535,
        description="Port of the rendezvous on node 0 (MASTER_PORT), 1024-65535.",
    )

    @field_validator("type")
    @classmethod
    def _registered(cls, value: str) -> str:
        distributions.get(value)  # a ValueError naming the registered types
        return value

    @model_validator(mode="after")
    def _type_rules(self) -> Distribution:
        for rule in distributions.rules():
            if not rule.holds(self):
                raise ValueError(rule.message)
        return self

    @property
    def world_size(self) -> int:
        return self.node_count * self.process_count_per_node


SHM_RULE = (
    "resources.shmSize must not exceed resources.memory: /dev/shm is memory-backed and "
    "counts against the container's memory limit (leave shmSize out for half of memory)"
)
# The launcher and one Python process need about this much before any training code runs:
# a smaller limit only gets the node Pod OOM-killed at its start.
MIN_MEMORY = "32Mi"
MIN_MEMORY_RULE = (
    f"resources.memory must be at least {MIN_MEMORY}: the launcher and a Python process "
    "need that much before any training code runs (a PyTorch rank needs hundreds of Mi); "
    "write it with a unit, e.g. 8Gi or 512Mi (1Ki is 1024 bytes)"
)


class Resources(Model):
    """What each node Pod asks for."""

    model_config = with_rules(
        {
            # isQuantity first: a value the pattern lets through but Kubernetes cannot
            # parse is refused by the pattern's own message, not by a CEL runtime error.
            "rule": "!has(self.shmSize) || !has(self.memory) || !isQuantity(self.shmSize) || "
            "!isQuantity(self.memory) || "
            "quantity(self.shmSize).compareTo(quantity(self.memory)) <= 0",
            "message": SHM_RULE,
            "fieldPath": ".shmSize",
            "reason": "FieldValueInvalid",
        },
        memory_floor_rule(MIN_MEMORY, MIN_MEMORY_RULE),
    )

    gpus_per_node: int = Field(
        default=0,
        ge=0,
        le=64,
        description="nvidia.com/gpu per node Pod (0 = a CPU run).",
    )
    cpu: str | None = Field(
        default=None,
        pattern=QUANTITY,
        max_length=QUANTITY_MAX_LENGTH,
        description='CPU per node Pod, as a Kubernetes quantity (e.g. "8" or "500m").',
    )
    memory: str | None = Field(
        default=None,
        pattern=QUANTITY,
        max_length=QUANTITY_MAX_LENGTH,
        description="Memory per node Pod (request and limit), as a Kubernetes quantity "
        f"(e.g. 64Gi); at least {MIN_MEMORY}.",
    )
    shm_size: str | None = Field(
        default=None,
        pattern=QUANTITY,
        max_length=QUANTITY_MAX_LENGTH,
        description="Size of /dev/shm (a memory emptyDir: it counts against the memory "
        "limit); the container default of 64 MB breaks DataLoader workers and NCCL. "
        "Default: half of memory, else 1Gi. At most memory.",
    )

    @model_validator(mode="after")
    def _shm_fits_memory(self) -> Resources:
        if self.memory is not None:
            try:
                too_small = quantity(self.memory) < quantity(MIN_MEMORY)
            except ValueError:
                too_small = False  # the pattern says what is wrong
            if too_small:
                raise ValueError(f"{MIN_MEMORY_RULE}; got {self.memory}")
        if self.shm_size is None or self.memory is None:
            return self
        try:
            shm, memory = quantity(self.shm_size), quantity(self.memory)
        except ValueError:
            return self  # the pattern says what is wrong (as the CRD's isQuantity guard)
        if shm > memory:
            raise ValueError(f"{SHM_RULE}; got shmSize {self.shm_size} > memory {self.memory}")
        return self


class Toleration(Model):
    """A toleration of node taints (core/v1 Toleration)."""

    key: str | None = Field(default=None, description="Taint key; empty with Exists matches all.")
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists or Equal.")
    value: str | None = Field(default=None, description="Taint value for operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None, description="For NoExecute: how long the Pod stays bound after the taint."
    )


NODE_SELECTOR_MAX = 64
NODE_SELECTOR_KEY_RULE = (
    "compute.nodeSelector: every key must be a label key, as a node's labels are: a name "
    f"of at most {LABEL_VALUE_MAX_LENGTH} letters, digits, '-', '_' or '.' that starts and "
    "ends with a letter or digit, with an optional prefix (a DNS subdomain of at most "
    f"{LABEL_KEY_PREFIX_MAX_LENGTH} characters) and '/' before it, e.g. "
    "topology.kubernetes.io/zone"
)


class Compute(Model):
    """Which nodes run the run (~ an Azure ML compute target)."""

    model_config = with_rules(
        {
            "rule": f"!has(self.nodeSelector) || self.nodeSelector.all(k, {label_key_cel('k')})",
            "message": NODE_SELECTOR_KEY_RULE,
            "fieldPath": ".nodeSelector",
            "reason": "FieldValueInvalid",
        }
    )

    pool: str | None = Field(
        default=None,
        max_length=63,
        pattern=DNS1123_LABEL,
        description=f"Node pool: selects nodes labelled {LABEL_POOL}=<pool>.",
    )
    node_selector: dict[
        str,
        Annotated[str, Field(max_length=LABEL_VALUE_MAX_LENGTH, pattern=LABEL_VALUE)],
    ] = Field(
        default_factory=dict,
        max_length=NODE_SELECTOR_MAX,
        description="Extra node labels the node Pods require: keys and values as a node's "
        f"labels are (a value: at most {LABEL_VALUE_MAX_LENGTH} letters, digits, '-', '_' "
        "or '.', starting and ending with a letter or digit, or empty).",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=32,
        description="Extra tolerations; GPU runs tolerate nvidia.com/gpu taints already.",
    )
    priority_class_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
        description="PriorityClass of the node Pods; the run waits (Admitted False, "
        "PriorityClassNotFound) until it exists.",
    )

    @model_validator(mode="after")
    def _label_keys(self) -> Compute:
        bad = sorted(k for k in self.node_selector if not label_key(k))
        if bad:
            raise ValueError(f"{NODE_SELECTOR_KEY_RULE}; got {', '.join(map(repr, bad))}")
        return self


_TRAVERSAL = r"(^|[/\\])(\.|%2[eE])(\.|%2[eE])([/\\]|$)"
REGISTER_PATH_RULE = (
    "the path must be relative to the working directory and stay inside it: "
    "no leading '/', no '..' (e.g. outputs/model.pt)"
)


class ModelOutput(Model):
    """A model and the file or folder of a run's outputs that makes it up (a TrainingRun's
    ``outputs.register``, a Sweep's ``registerBest``)."""

    model_config = with_rules(
        {
            "rule": "!self.path.startsWith('/') && !self.path.matches(r'" + _TRAVERSAL + "')",
            "message": REGISTER_PATH_RULE,
            "fieldPath": ".path",
            "reason": "FieldValueInvalid",
        }
    )

    model: str = Field(
        max_length=63,
        pattern=DNS1123_LABEL,
        description="Model name; each successful run adds version N+1.",
    )
    path: str = Field(
        default="outputs",
        min_length=1,
        max_length=1024,
        description="File or folder, relative to the working directory, that makes up "
        "the model (inside ./outputs); no leading '/' and no '..'.",
    )

    @model_validator(mode="after")
    def _path_stays_inside(self) -> ModelOutput:
        if self.path.startswith("/") or re.search(_TRAVERSAL, self.path):
            raise ValueError(f"{REGISTER_PATH_RULE}; got {self.path!r}")
        return self


class Register(ModelOutput):
    """Register the run's outputs as a model version (~ run.register_model)."""

    export_onnx: bool = Field(
        default=False,
        description="Also export the trained model to outputs/model.onnx and check it runs.",
    )
    mlflow_registry: bool = Field(
        default=False,
        description="With an MLflow tracking server: also register the new version in "
        "MLflow's model registry, as a version of the registered model of the same name "
        "made from the run's MLflow run (its source model://<model>/<version>).",
    )


class Outputs(Model):
    """What happens to ./outputs and ./logs after the run."""

    register_: Register | None = Field(
        default=None,
        alias="register",
        description="Register the outputs as a new model version.",
    )
    optional: bool = Field(
        default=False,
        description="false: a node whose upload of ./outputs or ./logs to the model "
        "registry fails fails the run (reason ArchiveFailed); true: the run still "
        "succeeds, with condition OutputsArchived=False saying what was lost (and no "
        "model registered when node 0's outputs are missing).",
    )


class EnvVar(Model):
    """An extra environment variable for every process."""

    model_config = with_rules(
        {
            "rule": "!(self.name in " + str(list(RANK_CONTRACT_VARIABLES)) + ")",
            "message": "this variable belongs to the rank contract and is set by torchyard",
            "fieldPath": ".name",
        }
    )

    name: str = Field(min_length=1, max_length=256, pattern=ENV_VAR_NAME, description="Name.")
    value: NoNulStr = Field(default="", description="Value (no NUL byte).")

    @model_validator(mode="after")
    def _not_rank_contract(self) -> EnvVar:
        if self.name in RANK_CONTRACT_VARIABLES:
            raise ValueError(
                f"env {self.name} belongs to the rank contract and is set by torchyard"
            )
        return self


class Scheduling(Model):
    """Admission of the gang."""

    queue_name: str | None = Field(
        default=None,
        max_length=63,
        pattern=DNS1123_LABEL,
        description="Hand admission to Kueue's LocalQueue of this name instead of "
        "torchyard's own gang admission; the run waits (Admitted False) until Kueue is "
        "installed and the LocalQueue exists in the run's namespace.",
    )


_SPEC_RULES: list[dict[str, Any]] = [
    {
        "rule": "self.resources.gpusPerNode == 0 || "
        "self.distribution.processCountPerNode <= self.resources.gpusPerNode",
        "message": "distribution.processCountPerNode must not exceed resources.gpusPerNode "
        "(one process per GPU at most)",
        "fieldPath": ".distribution.processCountPerNode",
        "reason": "FieldValueInvalid",
    },
    CHECKPOINTS_RULE,
    *PLACEMENT_RULES,
]


class TrainingRunSpec(Model):
    """Desired state of a TrainingRun."""

    model_config = with_rules(*_SPEC_RULES)

    environment: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
        description="Name of the Environment (in the same namespace) whose image runs the code.",
    )
    source: Source = Field(
        default_factory=lambda: Source(image=True),
        description="Where the code comes from: a ConfigMap, a Git repository, or the image.",
        json_schema_extra={"default": {"image": True}},
    )
    command: list[NoNulStr] = Field(
        min_length=1,
        description="Command run in the working directory, e.g. "
        "[python, train.py, --num_epochs, '30'] (~ ScriptRunConfig script + arguments); "
        "no argument may hold a NUL byte.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="Extra environment variables for every process.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    distribution: Distribution = Field(
        default_factory=Distribution,
        description="Nodes, processes per node and launch mode; immutable once created.",
        json_schema_extra={
            "default": Distribution().to_dict(),
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "distribution is immutable"}
            ],
        },
    )
    resources: Resources = nested(Resources, "GPUs, CPU, memory and /dev/shm per node Pod.")
    compute: Compute = nested(Compute, "Node pool, node selector and tolerations.")
    policy: Policy = nested(Policy, "Restarts and lifetimes of the run.")
    outputs: Outputs = nested(Outputs, "Archiving of ./outputs and ./logs, model registration.")
    scheduling: Scheduling = nested(Scheduling, "Gang admission settings.")
    placement: Placement | None = Field(
        default=None,
        description="Where the gang goes in the network: one domain (rack, block, NVLink "
        "domain) of a node label's values, or as few as fit; node ranks are numbered "
        "domain by domain. With scheduling.queueName, Kueue's topology-aware scheduling "
        "places it; else torchyard's own gang admission.",
    )
    managed_by: str | None = managed_by_field()
    inputs: list[Input] = Field(
        default_factory=list,
        max_length=MAX_INPUTS,
        description="Data and models the run reads: each is fetched once into the "
        "namespace's inputs cache (or mounted, for pvc://) before the gang is admitted, "
        "while the run is Preparing and holds no GPU, and every process finds it in "
        "TORCHYARD_INPUT_<NAME>.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "x-kubernetes-validations": INPUTS_RULES,
        },
    )
    checkpoints: Checkpoints | None = Field(
        default=None,
        description="A folder for checkpoints, mounted in every node Pod "
        "(TORCHYARD_CHECKPOINT_DIR): every gang restart resumes from the newest complete "
        "one (TORCHYARD_RESUME_FROM, TORCHYARD_RESUME_STEP), and a stopped Pod's ranks "
        "save one just in time (torchyard.checkpoint).",
    )
    suspend: bool = Field(
        default=False,
        description="true: every node Pod is stopped gracefully (with spec.checkpoints its "
        "ranks save a just-in-time checkpoint first, within terminationGracePeriodSeconds), "
        "the gang's capacity is freed and the run is Suspended; false again: the run is "
        "admitted in its queue order and resumes from the newest complete checkpoint. "
        "Neither counts against backoffLimit or platformRestartLimit.",
    )
    run_as_user: int | None = Field(
        default=None,
        ge=1,
        le=2147483647,
        description="Run every container of the node Pods as this non-root user (and group, "
        "and fsGroup), so they pass Pod Security 'restricted'; the curated images' user is "
        "1000. Unset: the image decides (which may be root).",
    )
    service_account_name: str = service_account(
        "ServiceAccount (in the run's namespace) the node Pods run as. The "
        "model registry accepts the run's archive uploads only from it, so it needs "
        "create on modelversions in the namespace.",
    )
    automount_service_account_token: bool = Field(
        default=False,
        description="Mount the ServiceAccount's Kubernetes API token into the node Pods. "
        "false (default): the training code gets no API credentials; the registry token "
        "(audience torchyard-registry, for archiving) is mounted either way.",
    )

    @model_validator(mode="after")
    def _processes_fit_gpus(self) -> TrainingRunSpec:
        gpus = self.resources.gpus_per_node
        procs = self.distribution.process_count_per_node
        if gpus and procs > gpus:
            raise ValueError(f"processCountPerNode ({procs}) must not exceed gpusPerNode ({gpus})")
        check_shared(self.checkpoints, self.distribution.node_count)
        check_placement(
            self.placement,
            self.distribution.node_count,
            self.managed_by,
            self.scheduling.queue_name,
        )
        check_inputs(self.inputs)
        return self


class TrainingRun(Named, Model):
    """A TrainingRun as the API holds it (metadata kept as a plain mapping)."""

    api_version: str = Field(default=API_VERSION, description="APIVersion.")
    kind: Literal["TrainingRun"] = Field(default="TrainingRun", description="Kind.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard metadata.")
    spec: TrainingRunSpec = Field(description="Desired state.")
    status: TrainingRunStatus = Field(
        default_factory=TrainingRunStatus, description="Observed state."
    )

    @model_validator(mode="after")
    def _name_fits_pods_and_service(self) -> TrainingRun:
        self.check_name(RUN_NAME_MAX, RUN_NAME_RULE)
        return self
