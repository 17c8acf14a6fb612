"""A TrainingRun MultiKueue dispatches (``spec.managedBy: kueue.x-k8s.io/multikueue``), on
the manager cluster.

torchyard does not run such a run here: :func:`manage` creates its Kueue Workload (as for
any queued run: ``workloads.create``), and MultiKueue admits it through its admission
check, copies the run to a worker cluster (``spec.managedBy`` removed, labelled with the
Workload it made there: ``planning.workloads.PREBUILT_LABEL``), where torchyard runs it
like any queued run, and copies the worker's status back onto this object; deleting the
run here deletes its Workload, and MultiKueue deletes the copy on the worker. Until a
worker took it, the status says so (``status.multikueue``); after that torchyard writes
nothing, so the worker's status is the run's.

Called by ``trainingruns`` instead of every later step; tested in
tests/unit/controller/test_multikueue.py and, on two control planes, in
tests/integration/test_multikueue.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from torchyard import api
from torchyard.controller import context, workloads
from torchyard.controller.context import Context, Log, Outcome, Result
from torchyard.planning import workloads as run_workloads
from torchyard.status import multikueue

# How soon a run whose Workload MultiKueue has not dispatched yet is looked at again (the
# Workload's events queue it sooner).
DISPATCH_RETRY_SECONDS = 30.0


def manage(
    ctx: Context, run: api.TrainingRun, previous: Mapping[str, Any], logger: Log, now: datetime
) -> tuple[Outcome | None, Result]:
    """The run's Workload made; the status while no worker has taken it, then nothing."""
    wl = workloads.observe(ctx, run)
    if wl is None:
        wl = workloads.create(ctx, run, logger)
    if wl is not None and (wl.get("status") or {}).get("clusterName"):
        return None, Result()  # a worker runs it: its status is mirrored here
    queue = run.spec.scheduling.queue_name or ""
    message = (
        run_workloads.waiting_message(wl, queue)
        if wl is not None
        else f"waiting for its Workload {run_workloads.name(run)}"
    )
    new = multikueue.dispatching_status(run, previous, message, now)
    return Outcome(new, now, context.phase_events(previous, new)), Result(
        requeue_after=DISPATCH_RETRY_SECONDS
    )
