"""A TrainingRun's ``status.tracking`` and its ``TrackingReady`` condition, as a pure
function of what ``controller.tracking`` last did with the MLflow server.

``status.tracking`` holds the MLflow run (``runId``, ``experimentId``, ``experiment``),
the last progress step mirrored (``step``), whether the MLflow run was ended (``ended``)
and, while the server cannot be reached or refuses, the last ``error``. The condition is
True with the run's id, or False with the URL and the error: a Warning, never a failed run.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from torchyard.status.conditions import condition, merge

CONDITION = "TrackingReady"


def tracking_condition(tracking: Mapping[str, Any], uri: str) -> dict[str, Any]:
    """True when the MLflow run exists and the last call went through, else False."""
    error = tracking.get("error")
    if error:
        said = str(error) if uri in str(error) else f"{uri}: {error}"
        return condition(CONDITION, False, "TrackingServerError", said)
    if tracking.get("runId"):
        return condition(
            CONDITION,
            True,
            "RunTracked",
            f"MLflow run {tracking['runId']} in experiment {tracking.get('experimentId', '')} "
            f"at {uri}",
        )
    return condition(CONDITION, False, "Pending", f"no MLflow run at {uri} yet")


def with_tracking(
    status: Mapping[str, Any], tracking: Mapping[str, Any] | None, uri: str, now: datetime
) -> dict[str, Any]:
    """``status`` with ``tracking`` (None: no tracking server, nothing added) and its
    condition, the others kept."""
    out = dict(status)
    if tracking is None:
        return out
    out["tracking"] = {k: v for k, v in tracking.items() if v not in (None, "")}
    conds = [c for c in status.get("conditions") or [] if c.get("type") != CONDITION]
    conds.append(tracking_condition(tracking, uri))
    out["conditions"] = merge(status.get("conditions"), conds, now)
    return out
