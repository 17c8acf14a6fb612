"""``spec.suspend`` in the reconcile: stop the gang gracefully, free its room, wait.

:func:`suspend` is the step ``trainingruns.reconcile`` takes instead of the failure policy
and the children while a (not finished) run's ``spec.suspend`` is true: it deletes the
node Pods with their own ``terminationGracePeriodSeconds`` (the kubelet sends SIGTERM; with
``spec.checkpoints`` every launcher asks its ranks for one just-in-time checkpoint at the
same step and stops them once it is complete, within that grace period), counts the
stopped attempt as a suspension (a new attempt, no limit used) and says ``Suspended``
(``status.suspensions.suspended_status``). A deleted Pod's room is free to admission once
it is gone (the Pod events start an admission pass that lets waiting gangs in). With
``spec.suspend`` false again the reconcile creates the next attempt's gang, which is
admitted in its queue order (priority, then the run's age) and resumes from the newest
complete checkpoint. A run with a Kueue Workload has it deactivated meanwhile, and its
quota released once its Pods are gone (``workloads.suspend``). :func:`stop_gracefully`
is also how a gang Kueue stopped or evicted is restarted (``failure_policy``): never with a
shorter grace period than its own.
Tested in tests/unit/controller/test_suspension.py, on a real control plane in
tests/integration/test_suspend.py and on the real node in tests/node/test_suspend.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from torchyard import api, k8s
from torchyard.controller import context, workloads
from torchyard.controller.context import Context, Log, Outcome, Result
from torchyard.status import suspensions

if TYPE_CHECKING:
    from torchyard.controller.trainingruns import Observed

# How soon a run whose node Pods are still stopping is looked at again (their deletion
# events queue it too).
STOPPING_RETRY_SECONDS = 2.0


def to_suspend(run: api.TrainingRun, phase: str | None) -> bool:
    """Whether the run is to be suspended now: spec.suspend, unless every node already
    succeeded (a Finalizing run archives and registers, it does not train again)."""
    return run.spec.suspend and phase != api.Phase.FINALIZING.value


def stop_gracefully(ctx: Context, namespace: str, pods: Iterable[Mapping[str, Any]]) -> None:
    """Delete Pods not being deleted yet, each with its own terminationGracePeriodSeconds."""
    context.parallel(
        lambda p: ctx.k8s.delete(k8s.PODS, namespace, p["metadata"]["name"]),
        [p for p in pods if not p["metadata"].get("deletionTimestamp")],
    )


def suspend(
    ctx: Context, run: api.TrainingRun, seen: Observed, logger: Log, now: datetime
) -> tuple[Outcome, Result]:
    """Stop the gang (its current attempt becomes a suspension), or wait for its Pods to
    be gone, and say so in the status."""
    attempts = seen.attempts
    if seen.current:
        attempts = attempts.suspended()
        logger.info(
            "TrainingRun %s/%s suspended: stopping %d node Pod(s)",
            run.namespace,
            run.name,
            len(seen.current),
        )
    stop_gracefully(ctx, run.namespace, seen.children)
    workloads.suspend(ctx, seen.workload, len(seen.children), now)  # Kueue's quota freed
    new = suspensions.suspended_status(
        run, seen.previous, attempts.restarts, attempts.suspensions, len(seen.children), now
    )
    outcome = Outcome(new, now, context.phase_events(seen.previous, new))
    return outcome, Result(requeue_after=STOPPING_RETRY_SECONDS if seen.children else None)
