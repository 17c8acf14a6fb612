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
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from torchyard.api import Phase, TrainingRun, wire
from torchyard.status import checkpoint_risk, deadlines
from torchyard.status import inputs as run_inputs
from torchyard.status import steps as run_progress
from torchyard.status.conditions import (
    INVALID_SPEC,
    condition,
    invalid_spec_status,
    merge,
    progress,
    timestamp,
)
from torchyard.status.failures import (
    ARCHIVE_FAILED,
    DEADLINE_EXCEEDED,
    Failure,
    archive_failures,
    failure_message,
    newest_in_place,
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
    in_place: int = 0  # of the failed attempts, those restarted in place
    # what the launchers said of the last in-place restart (``launch.coordination.REPORTED``)
    last_in_place: Mapping[str, Any] | None = None
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
    # The run's fetched inputs (``controller.inputs``), None when they were not looked at
    # (the run has none, or its gang already has its Pods).
    inputs: run_inputs.InputsObserved | None = None
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
    new = deadlines.with_suspensions(_trainingrun_status(run, observed, prev, now), prev, now)
    return with_kstatus(new, prev, now)


def with_in_place(observed: Observed, said: Sequence[Mapping[str, Any]]) -> Observed:
    """``observed`` with the running launchers' word on their in-place restarts: the
    counts only grow (a launcher that has not heard of the last one says less)."""
    newest = newest_in_place(said)
    if newest is None or int(newest.get("inPlace") or 0) <= observed.in_place:
        return observed
    return replace(
        observed,
        in_place=int(newest.get("inPlace") or 0),
        failed_attempts=max(observed.failed_attempts, int(newest.get("failedAttempts") or 0)),
        last_in_place=newest,
    )


def in_place_status(said: Mapping[str, Any]) -> dict[str, Any]:
    """``status.lastInPlaceRestart`` of what a launcher said of the last in-place restart."""
    failure: Mapping[str, Any] = said.get("failure") or {}
    if not isinstance(failure, Mapping):
        failure = {}
    at = said.get("at")
    out = {
        "message": str(said.get("message") or "restarted in place"),
        "time": (
            datetime.fromtimestamp(float(at), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            if isinstance(at, (int, float))
            else None
        ),
        "rank": failure.get("rank"),
        "node": failure.get("nodeRank"),
        "class": said.get("failureClass"),
    }
    return {k: v for k, v in out.items() if v is not None}


def in_place_failure(said: Mapping[str, Any]) -> dict[str, Any]:
    """``status.lastFailure`` of the failure restarted in place last (its message: the last
    line, which "the same error at the same step" compares)."""
    failure: Mapping[str, Any] = said.get("failure") or {}
    if not isinstance(failure, Mapping):
        failure = {}
    return public_failure(
        {
            **{k: failure.get(k) for k in ("rank", "exitCode", "signal", "reason", "step")},
            "node": failure.get("nodeRank"),
            "message": failure.get("lastLine"),
            "failureClass": said.get("failureClass"),
        }
    )


def in_place_event(previous: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """The ``RestartedInPlace`` Event's message when the count grew, None when it did not
    (restarts the operator did not see one by one are counted in it)."""
    before, now = int(previous.get("inPlaceRestarts") or 0), int(new.get("inPlaceRestarts") or 0)
    if now <= before:
        return None
    message = str((new.get("lastInPlaceRestart") or {}).get("message") or "restarted in place")
    if now - before > 1:
        return f"{now - before} in-place restarts since the last look; the last: {message}"
    return message


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


@dataclass(frozen=True)
class _Facts:
    """What every decision reads: the run, what was observed, and the node counts."""

    run: TrainingRun
    observed: Observed
    gen: int | None
    total: int
    pods: Sequence[Mapping[str, Any]]
    counts: Mapping[str, Any]
    progress: Mapping[str, Any] | None


@dataclass(frozen=True)
class _Step:
    """What one decision adds: its conditions and, once it decides, the phase (None: the
    next decision goes on), the failure, and the status fields it sets."""

    conditions: Sequence[dict[str, Any]] = ()
    phase: Phase | None = None
    failure: Failure | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)


# The decisions, in the order they are taken (as JobSet's reconcile: the Environment
# first, then whether the run ended, succeeded, is admitted, and how it runs).
def _trainingrun_status(
    run: TrainingRun,
    observed: Observed,
    prev: Mapping[str, Any],
    now: datetime,
) -> dict[str, Any]:
    status, facts = _gather(run, observed, prev, now)
    conds = [
        condition("Accepted", True, "Valid", "the spec is valid", observed_generation=facts.gen)
    ]
    for decide in (_environment, _inputs, _ended, _succeeded, _admission, _running):
        step = decide(facts)
        conds += step.conditions
        if step.phase is not None:
            return _write(status, step, conds, prev, now)
    raise AssertionError("_running always decides")


def _gather(
    run: TrainingRun, observed: Observed, prev: Mapping[str, Any], now: datetime
) -> tuple[dict[str, Any], _Facts]:
    """The status fields every phase carries, and the facts the decisions read."""
    total = run.spec.distribution.node_count
    pods = list(observed.pods)
    status: dict[str, Any] = {
        "observedGeneration": run.generation,
        "worldSize": run.spec.distribution.world_size,
        "nodes": _counts(total, pods),
        "restarts": observed.restarts,
    }
    if observed.failed_attempts:
        status["failedAttempts"] = observed.failed_attempts
    if observed.in_place:
        status["inPlaceRestarts"] = observed.in_place
    if observed.last_in_place is not None:  # newer than a gang restart's: this attempt's
        status["lastInPlaceRestart"] = in_place_status(observed.last_in_place)
        status["lastFailure"] = in_place_failure(observed.last_in_place)
    ran = run_progress.final_progress(pods, now) or observed.progress or prev.get("progress")
    if ran:
        status["progress"] = dict(ran)
    # (status.tracking too: an operator without a tracking server keeps the run's link)
    kept = ("startTime", "lastFailure", "suspensions", "excludedNodes", "inputs", "tracking")
    for key in (*kept, "inPlaceRestarts", "lastInPlaceRestart"):
        if prev.get(key) and key not in status:
            status[key] = prev[key]
    if observed.inputs is not None and observed.inputs.entries:
        status["inputs"] = [dict(e) for e in observed.inputs.entries]
    facts = _Facts(
        run, observed, run.generation, total, pods, status["nodes"], status.get("progress")
    )
    return status, facts


def _write(
    status: dict[str, Any],
    step: _Step,
    conds: Sequence[dict[str, Any]],
    prev: Mapping[str, Any],
    now: datetime,
) -> dict[str, Any]:
    """The one write: the decided phase, its times, failure, fields and conditions."""
    assert step.phase is not None
    status["phase"] = step.phase.value
    if step.phase.value in TERMINAL:
        status["completionTime"] = timestamp(now)
    if step.phase in (Phase.RUNNING, Phase.FINALIZING) or step.phase.value in TERMINAL:
        status.setdefault("startTime", timestamp(now))
    if step.failure is not None:
        status["failure"] = public_failure(step.failure)
    status.update(step.fields)
    status["conditions"] = merge(prev.get("conditions"), list(conds), now)
    return status


def _finished(f: _Facts, failure: Failure | None = None) -> _Step:
    """Failed (with the failure's reason) or Succeeded: Running=False and the verdict."""
    if failure is not None:
        msg, reason = failure_message(failure), str(failure["reason"])
        return _Step(
            [
                condition("Running", False, reason, msg, observed_generation=f.gen),
                condition("Failed", True, reason, msg, observed_generation=f.gen),
            ],
            Phase.FAILED,
            failure,
        )
    done = f"all {f.total} node(s) succeeded"
    return _Step(
        [
            condition(
                "Running", False, "Completed", "all nodes finished", observed_generation=f.gen
            ),
            condition("Succeeded", True, "Completed", done, observed_generation=f.gen),
        ],
        Phase.SUCCEEDED,
        fields={"model": dict(f.observed.model)} if f.observed.model else {},
    )


def _with(first: dict[str, Any], step: _Step) -> _Step:
    """``step`` with the condition ``first`` before its own."""
    return _Step([first, *step.conditions], step.phase, step.failure, step.fields)


def _environment(f: _Facts) -> _Step:
    """Ready: EnvironmentReady=True and on; Failed: the run fails; else it waits, Preparing."""
    run, gen = f.run, f.gen
    env_phase, env_message = _env_phase(f.observed.environment)
    if env_phase == "Failed":
        failed = condition(
            "EnvironmentReady", False, "EnvironmentFailed", env_message, observed_generation=gen
        )
        message = f"Environment {run.spec.environment} failed: {env_message}"
        return _with(failed, _finished(f, {"reason": "EnvironmentFailed", "message": message}))
    if env_phase == "NotFound":
        message = (
            f"spec.environment: Environment {run.spec.environment} does not exist in "
            f"namespace {run.namespace}; the run waits for it"
        )
        waiting = condition(
            "EnvironmentReady", False, "EnvironmentNotFound", message, observed_generation=gen
        )
        return _Step([waiting], Phase.PREPARING)
    if env_phase != "Ready":
        message = f"Environment {run.spec.environment} is {env_phase}"
        waiting = condition(
            "EnvironmentReady", False, "EnvironmentNotReady", message, observed_generation=gen
        )
        return _Step([waiting], Phase.PREPARING)
    message = f"Environment {run.spec.environment} is Ready"
    return _Step([condition("EnvironmentReady", True, "Ready", message, observed_generation=gen)])


def _inputs(f: _Facts) -> _Step:
    """Inputs being fetched: Preparing; a failed fetch: Failed; ready (or none): on."""
    if f.observed.inputs is None:
        return _Step()
    decision = run_inputs.decide(f.observed.inputs, f.gen)
    if decision.failure is not None:
        failed: Failure = {
            "reason": str(decision.failure["reason"]),
            "message": str(decision.failure["message"]),
        }
        return _with(decision.condition, _finished(f, failed))
    if decision.waiting:
        return _Step([decision.condition], Phase.PREPARING)
    return _Step([decision.condition])


def _ended(f: _Facts) -> _Step:
    """Past its deadline, or a failure the failure policy decided on: Failed."""
    if f.observed.deadline_exceeded:
        seconds = f.run.spec.policy.active_deadline_seconds
        message = f"the run exceeded activeDeadlineSeconds ({seconds}s)"
        return _finished(f, {"reason": DEADLINE_EXCEEDED, "message": message})
    if f.observed.failure is not None:
        return _finished(f, f.observed.failure)
    return _Step()


def _succeeded(f: _Facts) -> _Step:
    """Every node succeeded: Finalizing until outputs are archived, then Succeeded."""
    if not f.total or f.counts["succeeded"] != f.total:
        return _Step()
    archived = _archive_condition(f.run, f.pods, f.gen)
    first = [archived] if archived is not None else []
    if not f.observed.finalized:
        message = f.observed.finalizing_message or "archiving outputs and registering the model"
        finalizing = condition("Succeeded", False, "Finalizing", message, observed_generation=f.gen)
        return _Step([*first, finalizing], Phase.FINALIZING)
    done = _finished(f)
    return _Step([*first, *done.conditions], done.phase, fields=done.fields)


def _admission(f: _Facts) -> _Step:
    """Pods that cannot be created yet (Pending), a gang queued or still being created
    (Queued/Pending), else Admitted=True and on."""
    observed, gen, total = f.observed, f.gen, f.total
    if observed.pending is not None:
        reason, message = observed.pending
        return _Step(
            [condition("Admitted", False, reason, message, observed_generation=gen)], Phase.PENDING
        )
    if observed.queued_message is not None:
        queued = condition(
            "Admitted", False, "Queued", observed.queued_message, observed_generation=gen
        )
        return _Step(
            [queued], Phase.QUEUED, fields={"queue": dict(observed.queue)} if observed.queue else {}
        )
    if len(f.pods) < total:
        message = f"creating node Pods ({len(f.pods)}/{total})"
        creating = condition("Admitted", False, "Creating", message, observed_generation=gen)
        return _Step([creating], Phase.PENDING)
    return _Step(
        [condition("Admitted", True, "GangAdmitted", _admitted(f), observed_generation=gen)]
    )


def _admitted(f: _Facts) -> str:
    """How the gang was admitted, as its lowest-ranked Pod says (Kueue's ClusterQueue, the
    domains of its placement), else that it was admitted whole."""
    notes = sorted(
        (int((p.get("metadata", {}).get("labels") or {}).get(wire.LABEL_NODE_RANK, 0)), note)
        for p in f.pods
        if (note := (p.get("metadata", {}).get("annotations") or {}).get(wire.ANNOTATION_ADMITTED))
    )
    return str(notes[0][1]) if notes else f"all {f.total} node Pod(s) admitted together"


def _running(f: _Facts) -> _Step:
    """Every node running (or done): Running; some not yet scheduled: Queued; else Running,
    starting. A checkpoint risk goes before the Running condition (kstatus takes the last
    condition's reason)."""
    counts, total, gen = f.counts, f.total, f.gen
    risk = checkpoint_risk.condition(f.run, f.progress, gen)
    before = [risk] if risk is not None else []
    if counts["running"] + counts["succeeded"] == total:
        message = f"{counts['running']}/{total} node(s) running"
        running = condition("Running", True, "AllNodesRunning", message, observed_generation=gen)
        return _Step([*before, running], Phase.RUNNING)
    phase = Phase.QUEUED if counts["scheduled"] < total else Phase.RUNNING
    message = f"{counts['scheduled']}/{total} scheduled, {counts['running']}/{total} running"
    starting = condition("Running", False, "Starting", message, observed_generation=gen)
    return _Step([*before, starting], phase)


def invalid_trainingrun_status(
    generation: int | None, message: str, previous: Mapping[str, Any] | None, now: datetime
) -> dict[str, Any]:
    """A run the apiserver let through but torchyard cannot run: the one InvalidSpec
    status, its failure saying why."""
    failure = {"reason": INVALID_SPEC, "message": message}
    return invalid_spec_status(generation, message, previous, now, fields={"failure": failure})
