"""``CheckpointAtRisk``: is the node Pods' grace period long enough for a just-in-time save?

When a node Pod is stopped (a preemption, an eviction, ``spec.suspend``), its ranks finish
the step they are in and save a checkpoint, all before the kubelet's SIGKILL at the end of
``terminationGracePeriodSeconds``. The ranks time their steps and saves
(``torchyard.checkpoint``), the launchers put the slowest of each in their progress line,
and ``status.progress.checkpointSeconds`` holds them; :func:`condition` turns them into the
condition: True (a warning, with the grace period to set) when the grace period is shorter
than the slowest step plus the slowest save, False when it is longer, absent before any
timing or without ``spec.checkpoints``. Pure; called by ``status.trainingruns``; tested
in tests/unit/status/test_checkpoint_risk.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from torchyard.api import TrainingRun
from torchyard.status.conditions import condition as make_condition

TYPE = "CheckpointAtRisk"
# What the launcher keeps of the grace period to stop its ranks after the save
# (TORCHYARD_GRACE_PERIOD, 10 s, and 2 s to report): part of the advice.
STOP_SECONDS = 12


def condition(
    run: TrainingRun, progress: Mapping[str, Any] | None, generation: int | None
) -> dict[str, Any] | None:
    """The CheckpointAtRisk condition for these timings (see the module docstring)."""
    if run.spec.checkpoints is None:
        return None
    timed = (progress or {}).get("checkpointSeconds")
    if not isinstance(timed, Mapping):
        return None
    step, save = _seconds(timed.get("step")), _seconds(timed.get("save"))
    if step is None and save is None:
        return None
    need = (step or 0.0) + (save or 0.0)
    grace = run.spec.policy.termination_grace_period_seconds
    seen = f"the slowest step ({step or 0.0:.1f}s) plus the slowest save ({save or 0.0:.1f}s)"
    if grace < need:
        advice = math.ceil(need) + STOP_SECONDS
        return make_condition(
            TYPE,
            True,
            "GracePeriodTooShort",
            f"terminationGracePeriodSeconds ({grace}s) is shorter than {seen} seen: a node "
            "Pod that is stopped may be killed before its just-in-time checkpoint is "
            f"complete; set spec.policy.terminationGracePeriodSeconds to {advice} or more "
            "(or save faster)",
            observed_generation=generation,
        )
    return make_condition(
        TYPE,
        False,
        "GracePeriodSufficient",
        f"terminationGracePeriodSeconds ({grace}s) covers {seen} seen",
        observed_generation=generation,
    )


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return float(value) if math.isfinite(value) else None
