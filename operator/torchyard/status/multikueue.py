"""The status of a TrainingRun MultiKueue dispatches, on the manager cluster, before a
worker runs it.

A run with ``spec.managedBy: kueue.x-k8s.io/multikueue`` is run on a worker cluster;
MultiKueue copies the worker's status onto it. Until a worker took it (its Workload has
no ``status.clusterName`` yet), torchyard on the manager says what it waits for:
:func:`dispatching_status`, phase Queued with ``Admitted`` False, reason ``MultiKueue``
and Kueue's own words. Once a worker took it, torchyard writes nothing more.

Pure. Called by ``controller.multikueue``; tested in tests/unit/status/test_multikueue.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from torchyard.api import Phase, TrainingRun
from torchyard.status.conditions import condition, merge
from torchyard.status.trainingruns import with_kstatus

REASON = "MultiKueue"


def dispatching_status(
    run: TrainingRun, previous: Mapping[str, Any], message: str, now: datetime
) -> dict[str, Any]:
    """Queued, waiting for MultiKueue to hand the run to a worker cluster (``message``:
    why, in Kueue's words)."""
    gen = run.generation
    said = (
        f"dispatched by MultiKueue (spec.managedBy): a worker cluster runs it, and its "
        f"status shows here once one took it; {message}"
    )
    new: dict[str, Any] = {
        key: value for key, value in previous.items() if key not in ("phase", "conditions")
    }
    new.update({"phase": Phase.QUEUED.value, "observedGeneration": gen})
    desired = [condition("Admitted", False, REASON, said, observed_generation=gen)]
    new["conditions"] = merge(previous.get("conditions"), desired, now)
    return with_kstatus(new, previous, now)
