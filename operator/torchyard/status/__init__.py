"""Status as pure functions of a resource and what was observed of its children.

Nothing here reads a clock or the API: the controller passes ``now`` and the observed
objects, and patches the result only when it differs from what the resource shows.
"""

from __future__ import annotations

from torchyard.status.conditions import condition, find, merge, phase_event, progress, timestamp
from torchyard.status.environments import (
    BuildObserved,
    environment_status,
    invalid_environment_status,
)
from torchyard.status.modelversions import modelversion_status
from torchyard.status.trainingruns import (
    invalid_trainingrun_status,
    restarting_status,
    trainingrun_status,
)

__all__ = [
    "BuildObserved",
    "condition",
    "environment_status",
    "find",
    "invalid_environment_status",
    "invalid_trainingrun_status",
    "merge",
    "modelversion_status",
    "phase_event",
    "progress",
    "restarting_status",
    "timestamp",
    "trainingrun_status",
]
