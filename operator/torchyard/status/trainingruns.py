"""TrainingRun status: phase, conditions and node counts from the run and its Pods.

Called by the controller after every reconcile; tested as a table in
``tests/unit/status/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from torchyard.api import Phase, TrainingRun
from torchyard.status.conditions import condition, merge


def trainingrun_status(
    run: TrainingRun, previous: Mapping[str, Any] | None, now: datetime
) -> dict[str, Any]:
    """The status of an accepted run that has no Pods yet."""
    prev = previous or {}
    gen = run.generation
    total = run.spec.distribution.node_count
    desired = [
        condition("Accepted", True, "Valid", "the spec is valid", observed_generation=gen),
    ]
    return {
        "phase": prev.get("phase") or Phase.PENDING.value,
        "observedGeneration": gen,
        "worldSize": run.spec.distribution.world_size,
        "nodes": {
            "total": total,
            "scheduled": 0,
            "running": 0,
            "succeeded": 0,
            "failed": 0,
            "ready": f"0/{total}",
        },
        "conditions": merge(prev.get("conditions"), desired, now),
    }


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
    return status
