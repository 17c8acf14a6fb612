"""A TrainingRun's ``status``: its phase, node counts, queue place, failure, progress,
excluded nodes and the model it made, as the operator writes them.

Pydantic models of that field (the CRD is generated from them, ``api.crds``); imported
by ``api.trainingruns`` (``TrainingRun.status``); the status itself is computed by
``torchyard.status``.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum

from pydantic import Field

from torchyard.api._base import (
    CONDITIONS_FIELD_EXTRA,
    Condition,
    Model,
    observed_generation,
)


class Phase(str, Enum):
    """The run lifecycle, as in Azure ML."""

    PENDING = "Pending"
    PREPARING = "Preparing"
    QUEUED = "Queued"
    RUNNING = "Running"
    FINALIZING = "Finalizing"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"  # spec.suspend: the gang saved a checkpoint and was stopped


# The clone runs in the node Pod's init container: a URL it can reach over the network.


# The failure classes of ``launch.classes.RULES``, in their order (a test keeps the two
# the same): the CRD's description of ``status.failure.class`` is made from them.
FAILURE_CLASSES = (
    "EarlyExit",
    "GpuXid",
    "Hang",
    "CudaOOM",
    "HostOOM",
    "Segfault",
    "ImportError",
    "PeerLost",
    "RendezvousTimeout",
    "CollectiveTimeout",
    "PythonException",
)


class InPlaceRestart(Model):
    """One restart of a run's ranks inside its node Pods (the launchers' coordinator)."""

    message: str = Field(description="What failed, and what was counted, as the Event says.")
    time: datetime | None = Field(default=None, description="When the ranks were restarted.")
    rank: int | None = Field(default=None, description="The rank that failed.")
    node: int | None = Field(default=None, description="Its node's rank.")
    failure_class: str | None = Field(
        default=None, alias="class", description="Its failure class, if one matched."
    )


class NodeCounts(Model):
    """How many node Pods are in which state."""

    total: int = Field(default=0, description="Node Pods the run needs (nodeCount).")
    scheduled: int = Field(default=0, description="Node Pods bound to a node.")
    running: int = Field(default=0, description="Node Pods running.")
    succeeded: int = Field(default=0, description="Node Pods that finished successfully.")
    failed: int = Field(default=0, description="Node Pods that failed.")
    ready: str = Field(default="0/0", description="running/total, for display.")


# A Queued run's exact place is kept for the first this many of its pool's queue.
QUEUE_EXACT_POSITIONS = 50


class QueuePlace(Model):
    """Where a Queued run waits: its pool's queue and its place in it."""

    pool: str = Field(description="The pool (compute.pool, else the node selector).")
    position: int | None = Field(
        default=None,
        description="1-based place in the pool's queue (priority class value, then age), "
        "kept for the first 50 of a pool; unset further back (more than 50 ahead).",
    )


class Failure(Model):
    """Which rank failed first, and why."""

    rank: int | None = Field(default=None, description="Global rank of the failing process.")
    node: int | None = Field(default=None, description="Node rank (index of the node Pod).")
    pod: str | None = Field(default=None, description="Name of the failing Pod.")
    exit_code: int | None = Field(default=None, description="Exit code of the failing process.")
    signal: int | None = Field(default=None, description="Signal that ended it, if any.")
    reason: str | None = Field(
        default=None,
        description="Error, OOMKilled, Evicted, DeadlineExceeded, NodeLost, "
        "ImagePullBackOff, EnvironmentFailed, ...",
    )
    message: str | None = Field(
        default=None, description="The tail of the failing rank's traceback."
    )
    failure_class: str | None = Field(
        default=None,
        alias="class",
        description=f"{', '.join(FAILURE_CLASSES[:-1])} or {FAILURE_CLASSES[-1]}: what the "
        "evidence (exit, reason, log) says, checked in this order.",
    )
    retryable: bool | None = Field(
        default=None, description="Whether running the gang again may help."
    )
    advice: str | None = Field(default=None, description="What to do about it.")
    step: int | None = Field(
        default=None, description="The failing rank's last reported step (torchyard.progress)."
    )
    node_name: str | None = Field(
        default=None,
        description="The Node the failing rank ran on (the root cause's, not a cascade's): "
        "the same node in two consecutive failures is left out (excludedNodes).",
    )


class CheckpointSeconds(Model):
    """How long the ranks' steps and checkpoint saves took at most (torchyard.checkpoint)."""

    step: float | None = Field(default=None, description="The slowest step, in seconds.")
    save: float | None = Field(default=None, description="The slowest save, in seconds.")


class Progress(Model):
    """How far the run got, from the ranks' ``@@torchyard {"step": ...}`` lines
    (``torchyard.progress.report``); read from the node Pods at most every 10 s."""

    step: int = Field(description="The leading rank's last reported step.")
    total: int | None = Field(default=None, description="Steps in the whole run, if reported.")
    percent: int | None = Field(default=None, description="step / total, in percent.")
    steps_per_second: float | None = Field(
        default=None, description="The leading rank's speed since its first step (no warm-up)."
    )
    eta: str | None = Field(
        default=None, description="Time left at that speed when this was written (4m10s)."
    )
    last_progress_time: datetime | None = Field(
        default=None, description="When a rank last reported a higher step."
    )
    slowest_rank_lag: int | None = Field(
        default=None, description="Steps between the leading and the slowest rank."
    )
    metrics: dict[str, float] | None = Field(
        default=None, description="The last metric values reported (rank 0's first)."
    )
    checkpoint_seconds: CheckpointSeconds | None = Field(
        default=None,
        description="With spec.checkpoints: the slowest step and the slowest save any rank "
        "timed (torchyard.checkpoint.should_save/done); CheckpointAtRisk compares their sum "
        "with terminationGracePeriodSeconds.",
    )


class ExcludedNode(Model):
    """A node the run's next attempts avoid (a required node affinity NotIn)."""

    node: str = Field(description="The Node's name.")
    reason: str = Field(
        description="GpuXid (the failure class says the node's GPU is faulty), LogRule "
        "(a policy.logRules excludeNode line), NodeNotReady, NodeUnhealthy, "
        "DeletionByTaintManager or RepeatedFailure (two consecutive failures on the node, "
        "not the same error at the same step)."
    )
    evidence: str | None = Field(default=None, description="What said so: a line, a condition.")
    since: datetime | None = Field(default=None, description="When it was excluded.")


class ModelRef(Model):
    """The model version a successful run registered."""

    name: str = Field(description="Model name.")
    version: int = Field(description="Version number.")


class TrackingStatus(Model):
    """The run's MLflow run, with a tracking server configured (``controller.tracking``)."""

    run_id: str | None = Field(default=None, description="The MLflow run's id.")
    experiment_id: str | None = Field(default=None, description="Its experiment's id.")
    experiment: str | None = Field(
        default=None, description="Its experiment's name: the run's experiment, else its namespace."
    )
    step: int | None = Field(default=None, description="The last progress step mirrored into it.")
    ended: bool | None = Field(default=None, description="Whether its end was sent (runs/update).")
    model_version: str | None = Field(
        default=None,
        description="The version of the run's model in MLflow's model registry "
        "(outputs.register.mlflowRegistry), once registered.",
    )
    error: str | None = Field(
        default=None, description="The last error of the tracking server (TrackingReady=False)."
    )


class InputStatus(Model):
    """An input as the run got it: what its cache entry holds and what was fetched."""

    name: str = Field(description="The input's name.")
    uri: str = Field(description="Its URI (a model's revision written into it).")
    revision: str | None = Field(
        default=None, description="What pins the content: the sha256, or the model's version."
    )
    digest: str | None = Field(
        default=None, description="sha256 of the entry's file list (paths, sizes, sha256s)."
    )
    bytes: int | None = Field(default=None, description="The entry's size.")
    fetched_bytes: int | None = Field(
        default=None,
        description="Bytes fetched for this run: 0 when the cache had the entry already.",
    )
    key: str | None = Field(default=None, description="The cache entry's key.")


class TrainingRunStatus(Model):
    """Observed state of a TrainingRun, written by the operator."""

    phase: Phase | None = Field(
        default=None,
        description="Pending, Preparing, Queued, Running, Finalizing, Succeeded, Failed or "
        "Suspended.",
    )
    observed_generation: int | None = observed_generation()
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Accepted, EnvironmentReady, Admitted, Running, Succeeded, Failed, and "
        "Recorded once the ended run's record is in the registry.",
        json_schema_extra=CONDITIONS_FIELD_EXTRA,
    )
    world_size: int | None = Field(
        default=None, description="Total processes: nodeCount x processCountPerNode."
    )
    nodes: NodeCounts | None = Field(default=None, description="Node Pods by state.")
    queue: QueuePlace | None = Field(
        default=None,
        description="While Queued: the run's place in its pool's queue (updated when it moves).",
    )
    restarts: int | None = Field(
        default=None, description="Times the gang was restarted (for any reason)."
    )
    failed_attempts: int | None = Field(
        default=None,
        description="Restarts caused by the user's code, counted against policy.backoffLimit "
        "(gang restarts and in-place restarts alike).",
    )
    in_place_restarts: int | None = Field(
        default=None,
        description="Restarts of the ranks inside the node Pods that kept running (a rank's "
        "failure, restarted from the newest complete checkpoint with no Pod recreated); "
        "counted in failedAttempts, not in restarts.",
    )
    last_in_place_restart: InPlaceRestart | None = Field(
        default=None, description="The last in-place restart: what failed, and when."
    )
    suspensions: int | None = Field(
        default=None,
        description="Restarts that were suspensions (spec.suspend, or Kueue stopping the "
        "gang): counted in restarts, never against a limit.",
    )
    start_time: datetime | None = Field(default=None, description="When the run started.")
    suspended_seconds: int | None = Field(
        default=None,
        description="Seconds the run was suspended after it started, until its gang ran "
        "again: not counted in policy.activeDeadlineSeconds.",
    )
    suspended_since: datetime | None = Field(
        default=None,
        description="When the suspension going on began (spec.suspend, or Kueue stopping the "
        "gang); it ends when the gang runs again.",
    )
    completion_time: datetime | None = Field(default=None, description="When the run finished.")
    failure: Failure | None = Field(default=None, description="Why the run failed.")
    last_failure: Failure | None = Field(
        default=None,
        description="The failure that restarted the gang last: the same error at the same "
        "step again stops the retries.",
    )
    progress: Progress | None = Field(default=None, description="How far the run got.")
    excluded_nodes: list[ExcludedNode] | None = Field(
        default=None,
        max_length=64,
        description="Nodes that failed this run (a faulty GPU, a logRules excludeNode line, "
        "NotReady or unhealthy): the gang's next attempts are not placed on them, and "
        "admission does not count them for this run.",
    )
    model: ModelRef | None = Field(default=None, description="The registered model version.")
    inputs: list[InputStatus] | None = Field(
        default=None, description="The inputs as the run got them, once each is ready."
    )
    tracking: TrackingStatus | None = Field(
        default=None, description="The run's MLflow run (with a tracking server configured)."
    )
