"""A finished run: stop what still runs, and clean up after ``policy.ttlSecondsAfterFinished``.

Once a run Succeeded or Failed its status stays as it is; :func:`finished` deletes any
node Pod still running (no surviving rank holds a GPU) and, once the TTL counted from
``completionTime`` is over, the run's Pods and headless Service (the TrainingRun itself
stays, with its status and model). Called by ``trainingruns.reconcile`` for a run
whose status is terminal; :func:`seconds_left` is pure. Tested in
tests/unit/controller/test_reconcile.py and tests/integration/test_trainingruns.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from torchyard import api, k8s
from torchyard.controller import context
from torchyard.controller.context import Context, Result
from torchyard.planning import names

# How long after the TTL is over the run is looked at again (the clocks' rounding).
MARGIN_SECONDS = 0.5


def seconds_left(run: api.TrainingRun, completed: datetime | None, now: datetime) -> float | None:
    """Seconds until the TTL is over (0 or less: over), None when there is none yet."""
    ttl = run.spec.policy.ttl_seconds_after_finished
    if ttl is None or completed is None:
        return None
    return (completed + timedelta(seconds=ttl) - now).total_seconds()


def finished(
    ctx: Context,
    run: api.TrainingRun,
    children: Sequence[Mapping[str, Any]],
    completed: datetime | None,
    now: datetime,
) -> Result:
    """Stop the live Pods of a finished run; after its TTL, delete its Pods and Service."""
    context.delete_pods(ctx, run.namespace, [p for p in children if context.live(p)])
    left = seconds_left(run, completed, now)
    if left is None:
        return Result()
    if left > 0:
        return Result(requeue_after=left + MARGIN_SECONDS)
    context.delete_pods(ctx, run.namespace, children)
    ctx.k8s.delete(k8s.SERVICES, run.namespace, names.service(run.name))
    return Result()
