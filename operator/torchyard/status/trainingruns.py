"""TrainingRun status: phase, conditions and node counts, as pure functions.

``trainingrun_status`` folds the run, its Environment, its Pods, the failure the
controller's failure policy decided on (found with ``status.failures``) and the admission
decision into the status the controller patches when it changed; ``restarting_status`` is
the status of a gang being restarted. Every status carries the kstatus conditions too:
``Ready`` (True once the run succeeded, as kstatus judges a Job), ``Reconciling`` (True
until it finished) and ``Stalled`` (True once it failed).
Tested as tables in ``tests/unit/status/``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from torchyard.api import Phase, TrainingRun
from torchyard.status import checkpoint_risk, deadlines
from torchyard.status import steps as run_progress
from torchyard.status.conditions import condition, merge, progress, timestamp
from torchyard.status.failures import (
    ARCHIVE_FAILED,
    DEADLINE_EXCEEDED,
    Failure,
    archive_failures,
    failure_message,
    public_failure,
)

TERMINAL = (Phase.SUCCEEDED.value, Phase.FAILED.value)


@dataclass(frozen=True)
class Observed:
    """What the controller saw of a run's world this time."""

    environment: Mapping[str, Any] | None = None  # the Environment object, None if missing
    pods: Sequence[Mapping[str, Any]] = ()  # Pods of the current attempt
    queued_message: str | None = None  # why the gang is not admitted yet
    queue: Mapping[str, Any] | None = None  # {pool, position} in its pool's queue
    lost_pods: Sequence[str] = ()  # Pods of a running gang that vanished
    restarts: int = 0
    failed_attempts: int = 0
    deadline_exceeded: bool = False
    finalized: bool = True  # outputs archived and the model registered (or nothing to do)
    model: Mapping[str, Any] | None = None  # {name, version} of the registered model
    finalizing_message: str = ""
    # The failure the controller's failure policy decided on (a lost node Pod, or the
    # first failed Pod; see ``first_failure``), None when there is none: never recomputed.
    failure: Failure | None = None
    # (reason, message) when the node Pods cannot be created yet (an object the spec
    # names is missing, or the apiserver refuses them for now: ``controller.references``,
    # ``controller.refusals``): the run is Pending with Admitted=False for that reason.
    pending: tuple[str, str] | None = None
    # status.progress as the controller last read it from the node Pods' logs
    # (``controller.progress``), None when it did not read this time.
    progress: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


def _archive_condition(
    run: TrainingRun, pods: Sequence[Mapping[str, Any]], gen: int | None
) -> dict[str, Any] | None:
    failed = archive_failures(pods)
    if not failed:
        return None
    first = min(failed)
    message = f"node {first}: {failed[first]}"
    if len(failed) > 1:
        message = f"{len(failed)} node(s) did not archive everything; {message}"
    if 0 in failed and run.spec.outputs.register_ is not None:
        message = f"the model was not registered (node 0's outputs are missing); {message}"
    return condition("OutputsArchived", False, ARCHIVE_FAILED, message, observed_generation=gen)


def _counts(total: int, pods: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    phases = [p.get("status", {}).get("phase") for p in pods]
    running = phases.count("Running")
    return {
        "total": total,
        "scheduled": sum(1 for p in pods if p.get("spec", {}).get("nodeName")),
        "running": running,
        "succeeded": phases.count("Succeeded"),
        "failed": phases.count("Failed"),
        "ready": f"{running}/{total}",
    }


def _env_phase(env: Mapping[str, Any] | None) -> tuple[str, str]:
    if env is None:
        return "NotFound", ""
    st = env.get("status", {}) or {}
    return str(st.get("phase") or "Pending"), str(st.get("message") or "")


KSTATUS_TYPES = ("Ready", "Reconciling", "Stalled")


def with_kstatus(
    status: dict[str, Any], previous: Mapping[str, Any] | None, now: datetime
) -> dict[str, Any]:
    """``status`` with Ready, Reconciling and Stalled added from its phase. Their reason
    and message are those of the last condition the phase computation wrote, which is
    the most advanced fact about the run (Admitted after EnvironmentReady, Running after
    Admitted, Failed after Running)."""
    phase = status.get("phase")
    gen = status.get("observedGeneration")
    own = [c for c in status.get("conditions", []) if c["type"] not in KSTATUS_TYPES]
    last = own[-1] if own else {"reason": str(phase), "message": ""}
    reason, message = str(last.get("reason") or phase), str(last.get("message") or "")
    succeeded = phase == Phase.SUCCEEDED.value
    desired = [
        *own,
        condition("Ready", succeeded, reason, message, observed_generation=gen),
        *progress(
            phase not in TERMINAL,
            phase == Phase.FAILED.value,
            reason,
            message,
            observed_generation=gen,
        ),
    ]
    return {**status, "conditions": merge((previous or {}).get("conditions"), desired, now)}


def trainingrun_status(
    run: TrainingRun,
    observed: Observed,
    previous: Mapping[str, Any] | None,
    now: datetime,
) -> dict[str, Any]:
    """The whole status of a valid run (see the module docstring)."""
    prev = dict(previous or {})
    if prev.get("phase") in TERMINAL:
        # A finished run stays finished (its Pods may be cleaned up afterwards).
        return {**prev, "observedGeneration": run.generation}
    new = deadlines.carried(_trainingrun_status(run, observed, prev, now), prev, now)
    return with_kstatus(new, prev, now)


def restarting_status(
    previous: Mapping[str, Any],
    generation: int | None,
    restarts: int,
    failed_attempts: int,
    message: str,
    now: datetime,
    last_failure: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The status of a gang being restarted: back to Pending, Running=False/Restarting,
    no longer admitted (the next attempt's gang is admitted afresh), none of its Pods
    counted yet; ``last_failure`` (``status.failure``'s fields) is what restarted it."""
    new = {
        **previous,
        "phase": Phase.PENDING.value,
        "restarts": restarts,
        "observedGeneration": generation,
    }
    if "nodes" in previous:  # the counts are the new attempt's: none of its Pods yet
        new["nodes"] = _counts(int(previous["nodes"].get("total") or 0), [])
    if last_failure is not None:
        new["lastFailure"] = public_failure(last_failure)
    if failed_attempts:
        new["failedAttempts"] = failed_attempts
    kept = [
        c
        for c in previous.get("conditions", [])
        if c["type"] not in ("Running", "Admitted", *KSTATUS_TYPES)
    ]
    restarting = condition("Running", False, "Restarting", message, observed_generation=generation)
    new["conditions"] = merge(previous.get("conditions"), [*kept, restarting], now)
    return with_kstatus(new, previous, now)


def _trainingrun_status(
    run: TrainingRun,
    observed: Observed,
    prev: Mapping[str, Any],
    now: datetime,
) -> dict[str, Any]:
    gen = run.generation
    total = run.spec.distribution.node_count
    pods = list(observed.pods)
    conds = [condition("Accepted", True, "Valid", "the spec is valid", observed_generation=gen)]
    status: dict[str, Any] = {
        "observedGeneration": gen,
        "worldSize": run.spec.distribution.world_size,
        "nodes": _counts(total, pods),
        "restarts": observed.restarts,
    }
    if observed.failed_attempts:
        status["failedAttempts"] = observed.failed_attempts
    ran = run_progress.final_progress(pods, now) or observed.progress or prev.get("progress")
    if ran:
        status["progress"] = dict(ran)
    for key in ("startTime", "lastFailure", "suspensions", "excludedNodes"):
        if prev.get(key):
            status[key] = prev[key]

    def finish(phase: Phase, failure: Failure | None = None) -> dict[str, Any]:
        status["phase"] = phase.value
        status["completionTime"] = timestamp(now)
        status.setdefault("startTime", timestamp(now))
        if failure is not None:
            status["failure"] = public_failure(failure)
            msg = failure_message(failure)
            conds.append(
                condition("Running", False, str(failure["reason"]), msg, observed_generation=gen)
            )
            conds.append(
                condition("Failed", True, str(failure["reason"]), msg, observed_generation=gen)
            )
        else:
            conds.append(
                condition(
                    "Running", False, "Completed", "all nodes finished", observed_generation=gen
                )
            )
            conds.append(
                condition(
                    "Succeeded",
                    True,
                    "Completed",
                    f"all {total} node(s) succeeded",
                    observed_generation=gen,
                )
            )
        status["conditions"] = merge(prev.get("conditions"), conds, now)
        return status

    env_phase, env_message = _env_phase(observed.environment)
    if env_phase == "Failed":
        conds.append(
            condition(
                "EnvironmentReady", False, "EnvironmentFailed", env_message, observed_generation=gen
            )
        )
        return finish(
            Phase.FAILED,
            {
                "reason": "EnvironmentFailed",
                "message": f"Environment {run.spec.environment} failed: {env_message}",
            },
        )
    if env_phase != "Ready":
        reason = "EnvironmentNotFound" if env_phase == "NotFound" else "EnvironmentNotReady"
        message = (
            f"spec.environment: Environment {run.spec.environment} does not exist in "
            f"namespace {run.namespace}; the run waits for it"
            if env_phase == "NotFound"
            else f"Environment {run.spec.environment} is {env_phase}"
        )
        conds.append(condition("EnvironmentReady", False, reason, message, observed_generation=gen))
        status["phase"] = Phase.PREPARING.value
        status["conditions"] = merge(prev.get("conditions"), conds, now)
        return status
    conds.append(
        condition(
            "EnvironmentReady",
            True,
            "Ready",
            f"Environment {run.spec.environment} is Ready",
            observed_generation=gen,
        )
    )

    if observed.deadline_exceeded:
        return finish(
            Phase.FAILED,
            {
                "reason": DEADLINE_EXCEEDED,
                "message": f"the run exceeded activeDeadlineSeconds "
                f"({run.spec.policy.active_deadline_seconds}s)",
            },
        )
    if observed.failure is not None:
        return finish(Phase.FAILED, observed.failure)
    counts = status["nodes"]
    if total and counts["succeeded"] == total:
        archived = _archive_condition(run, pods, gen)
        if archived is not None:
            conds.append(archived)
        if not observed.finalized:
            status["phase"] = Phase.FINALIZING.value
            status.setdefault("startTime", timestamp(now))
            conds.append(
                condition(
                    "Succeeded",
                    False,
                    "Finalizing",
                    observed.finalizing_message or "archiving outputs and registering the model",
                    observed_generation=gen,
                )
            )
            status["conditions"] = merge(prev.get("conditions"), conds, now)
            return status
        if observed.model:
            status["model"] = dict(observed.model)
        return finish(Phase.SUCCEEDED)

    if observed.pending is not None:
        reason, message = observed.pending
        conds.append(condition("Admitted", False, reason, message, observed_generation=gen))
        status["phase"] = Phase.PENDING.value
        status["conditions"] = merge(prev.get("conditions"), conds, now)
        return status
    if observed.queued_message is not None or len(pods) < total:
        message = observed.queued_message or f"creating node Pods ({len(pods)}/{total})"
        conds.append(
            condition(
                "Admitted",
                False,
                "Queued" if observed.queued_message else "Creating",
                message,
                observed_generation=gen,
            )
        )
        status["phase"] = Phase.QUEUED.value if observed.queued_message else Phase.PENDING.value
        if observed.queued_message and observed.queue:
            status["queue"] = dict(observed.queue)
        status["conditions"] = merge(prev.get("conditions"), conds, now)
        return status

    conds.append(
        condition(
            "Admitted",
            True,
            "GangAdmitted",
            f"all {total} node Pod(s) admitted together",
            observed_generation=gen,
        )
    )
    if counts["running"] + counts["succeeded"] == total:
        status["phase"] = Phase.RUNNING.value
        status.setdefault("startTime", timestamp(now))
        conds.append(
            condition(
                "Running",
                True,
                "AllNodesRunning",
                f"{counts['running']}/{total} node(s) running",
                observed_generation=gen,
            )
        )
    else:
        status["phase"] = Phase.QUEUED.value if counts["scheduled"] < total else Phase.RUNNING.value
        if status["phase"] == Phase.RUNNING.value:
            status.setdefault("startTime", timestamp(now))
        conds.append(
            condition(
                "Running",
                False,
                "Starting",
                f"{counts['scheduled']}/{total} scheduled, {counts['running']}/{total} running",
                observed_generation=gen,
            )
        )
    risk = checkpoint_risk.condition(run, status.get("progress"), gen)
    if risk is not None:  # before Running: kstatus takes the last condition's reason
        conds.insert(len(conds) - 1, risk)
    status["conditions"] = merge(prev.get("conditions"), conds, now)
    return status


def invalid_trainingrun_status(
    generation: int | None, message: str, previous: Mapping[str, Any] | None, now: datetime
) -> dict[str, Any]:
    """A run the apiserver let through but torchyard cannot run: Failed, said once."""
    prev = previous or {}
    desired = [
        condition("Accepted", False, "InvalidSpec", message, observed_generation=generation),
        condition("Failed", True, "InvalidSpec", message, observed_generation=generation),
    ]
    status: dict[str, Any] = {
        "phase": Phase.FAILED.value,
        "conditions": merge(prev.get("conditions"), desired, now),
        "failure": {"reason": "InvalidSpec", "message": message},
    }
    if generation is not None:
        status["observedGeneration"] = generation
    return with_kstatus(status, prev, now)
