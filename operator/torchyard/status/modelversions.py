"""ModelVersion status: ``Available`` once the registry service published its files.

The operator records a ModelVersion only after the registry renamed the version's files
into place and recorded each one's sha256, so the status it writes with it says so at
once (read by ``kubectl wait --for=condition=Available`` and the Argo CD health check).
Called by the controller; tested in ``tests/unit/status/``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from torchyard.status.conditions import condition, merge


def modelversion_status(
    files: int,
    size: str,
    created: str | None,
    generation: int | None,
    now: datetime,
) -> dict[str, Any]:
    message = f"{files} file(s), {size}, published with their sha256 by the registry"
    available = condition("Available", True, "Published", message, observed_generation=generation)
    status: dict[str, Any] = {"conditions": merge(None, [available], now)}
    if created:
        status["createdTime"] = created
    return status
