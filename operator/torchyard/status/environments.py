"""Environment status from its spec (and, for builds, its build Job).

Called by the controller; tested in ``tests/unit/status/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from torchyard.api import Environment, EnvironmentPhase
from torchyard.status.conditions import condition, merge


def environment_status(
    env: Environment, previous: Mapping[str, Any] | None, now: datetime
) -> dict[str, Any]:
    prev = previous or {}
    gen = env.metadata.get("generation")
    desired = [condition("Accepted", True, "Valid", "the spec is valid", observed_generation=gen)]
    status: dict[str, Any] = {"observedGeneration": gen}
    if env.spec.image is not None:
        status["phase"] = EnvironmentPhase.READY.value
        status["image"] = env.spec.image
        desired.append(
            condition(
                "Ready", True, "Curated", "prebuilt image, used as it is", observed_generation=gen
            )
        )
    else:
        status["phase"] = EnvironmentPhase.PENDING.value
        desired.append(
            condition(
                "Ready",
                False,
                "BuildUnsupported",
                "this operator version cannot build images yet: use a prebuilt image",
                observed_generation=gen,
            )
        )
    status["conditions"] = merge(prev.get("conditions"), desired, now)
    return status


def invalid_environment_status(
    generation: int | None, message: str, previous: Mapping[str, Any] | None, now: datetime
) -> dict[str, Any]:
    prev = previous or {}
    desired = [
        condition("Accepted", False, "InvalidSpec", message, observed_generation=generation),
        condition("Ready", False, "InvalidSpec", message, observed_generation=generation),
    ]
    status: dict[str, Any] = {
        "phase": EnvironmentPhase.FAILED.value,
        "message": message,
        "conditions": merge(prev.get("conditions"), desired, now),
    }
    if generation is not None:
        status["observedGeneration"] = generation
    return status
