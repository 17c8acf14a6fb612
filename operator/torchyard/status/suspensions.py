"""A suspended TrainingRun's status, and a gang that Kueue stopped, as pure functions.

``spec.suspend: true`` stops every node Pod gracefully (their ranks save a just-in-time
checkpoint within ``terminationGracePeriodSeconds``), frees the gang's capacity and keeps
the run ``Suspended`` until ``spec.suspend`` is false again; :func:`suspended_status` is the
status meanwhile: ``Suspending`` while node Pods are still saving and stopping, then
``Suspended``. Kueue stops a gang it handed admission to (``scheduling.queueName``) by
marking its Pods ``TerminationTarget`` (reason ``WorkloadEvictedDueToPreempted`` when it
preempts it, as v0.17 does; ``StoppedByKueue`` in older releases) and deleting them
gracefully: :func:`kueue_stopped` finds that, and the failure policy restarts the gang as a
suspension (no limit is used; Kueue gates the new Pods until it admits them again).
Either way ``policy.activeDeadlineSeconds`` stops counting until the gang runs again
(``status.deadlines``).
Called by ``controller.suspension`` and ``controller.failure_policy``; tested in
tests/unit/status/test_suspensions.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from torchyard.api import Phase, TrainingRun
from torchyard.status import deadlines
from torchyard.status.conditions import condition, merge
from torchyard.status.trainingruns import KSTATUS_TYPES, with_kstatus

SUSPENDED_CONDITION = "Suspended"
# What Kueue writes on a Pod it stops (evicted, preempted, its Workload deactivated): the
# reason starts with Kueue's stop reason (``jobframework.StopReason`` in v0.17, an
# eviction's own reason appended: ``WorkloadEvictedDueToPreempted``; ``StoppedByKueue`` in
# older releases), the message says why (``Preempted to accommodate a workload ...``).
KUEUE_STOP_TYPES = ("TerminationTarget", "DisruptionTarget")
KUEUE_STOP_REASONS = (
    "WorkloadEvicted",
    "WorkloadDeleted",
    "NoMatchingWorkload",
    "NotAdmitted",
    "StoppedByKueue",
)


def kueue_stopped(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """Why Kueue stopped this gang (the condition's message), None when it did not."""
    for pod in pods:
        for cond in pod.get("status", {}).get("conditions", []) or []:
            if (
                cond.get("type") in KUEUE_STOP_TYPES
                and cond.get("status") == "True"
                and str(cond.get("reason") or "").startswith(KUEUE_STOP_REASONS)
            ):
                message = str(cond.get("message") or "").strip()
                return f"Kueue stopped node Pod {pod['metadata']['name']}" + (
                    f": {message}" if message else ""
                )
    return None


def suspended_status(
    run: TrainingRun,
    previous: Mapping[str, Any],
    restarts: int,
    suspensions: int,
    stopping: int,
    now: datetime,
) -> dict[str, Any]:
    """The status of a run whose ``spec.suspend`` is true: ``restarts``/``suspensions``
    as counted after stopping its gang, ``stopping`` node Pods still there (saving their
    checkpoint, stopping). No queue place: a suspended run waits for nothing."""
    gen = run.generation
    grace = run.spec.policy.termination_grace_period_seconds
    if stopping:
        reason = "Suspending"
        message = (
            f"{stopping} node Pod(s) stopping"
            + (
                " after saving a just-in-time checkpoint"
                if run.spec.checkpoints is not None
                else " (no spec.checkpoints: the next attempt starts from the beginning)"
            )
            + f" (at most terminationGracePeriodSeconds, {grace}s)"
        )
    else:
        reason = "Suspended"
        resumes = (
            "resumes from the newest complete checkpoint"
            if run.spec.checkpoints is not None
            else "starts again (no spec.checkpoints)"
        )
        message = (
            "spec.suspend is true: no node Pod runs and the gang holds no capacity; "
            f"set it to false (torchyard resume {run.name}) and the run is admitted in its "
            f"queue order and {resumes}"
        )
    new: dict[str, Any] = {
        key: value for key, value in previous.items() if key not in ("queue", "phase")
    }
    new.update(deadlines.paused(previous, now))  # activeDeadlineSeconds stops counting
    new.update(
        {
            "phase": Phase.SUSPENDED.value,
            "observedGeneration": gen,
            "restarts": restarts,
            "suspensions": suspensions,
            "nodes": {
                "total": run.spec.distribution.node_count,
                "scheduled": 0,
                "running": 0,
                "succeeded": 0,
                "failed": 0,
                "ready": f"0/{run.spec.distribution.node_count}",
            },
        }
    )
    kept = [
        c
        for c in previous.get("conditions", [])
        if c["type"] not in ("Running", "Admitted", SUSPENDED_CONDITION, *KSTATUS_TYPES)
    ]
    desired = [
        *kept,
        condition("Admitted", False, reason, message, observed_generation=gen),
        condition("Running", False, reason, message, observed_generation=gen),
        condition(SUSPENDED_CONDITION, True, reason, message, observed_generation=gen),
    ]
    new["conditions"] = merge(previous.get("conditions"), desired, now)
    return with_kstatus(new, previous, now)
