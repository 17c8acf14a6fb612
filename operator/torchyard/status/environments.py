"""Environment status from its spec (and, for builds, its build Job).

Besides ``Accepted`` and ``Ready``, the kstatus conditions: ``Reconciling`` True while
the image is pending or building, ``Stalled`` True when the build failed or the spec
cannot be built (only an edit of the spec helps). Called by the controller; tested in
``tests/unit/status/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from torchyard.api import Environment, EnvironmentPhase
from torchyard.status.conditions import condition, invalid_spec_status, merge, progress


@dataclass(frozen=True)
class BuildObserved:
    """What the controller saw of an Environment build."""

    hash: str
    image: str | None = None  # repository@digest when the image is in the registry
    job: str | None = None  # the build Job's name, when there is one
    job_state: str = ""  # "", "Running", "Complete" or "Failed"
    job_message: str = ""  # the builder's error (or its log tail) when the Job failed
    registry_error: str = ""  # why asking the registry failed, if it did
    job_seconds: float | None = None  # how long the build Job ran, once it ended


def environment_status(
    env: Environment,
    previous: Mapping[str, Any] | None,
    now: datetime,
    build: BuildObserved | None = None,
) -> dict[str, Any]:
    prev = previous or {}
    gen = env.metadata.get("generation")
    desired = [condition("Accepted", True, "Valid", "the spec is valid", observed_generation=gen)]
    status: dict[str, Any] = {"observedGeneration": gen}

    def ready(reason: str, message: str, phase: EnvironmentPhase) -> dict[str, Any]:
        status["phase"] = phase.value
        desired.append(
            condition(
                "Ready", phase == EnvironmentPhase.READY, reason, message, observed_generation=gen
            )
        )
        desired.extend(
            progress(
                phase in (EnvironmentPhase.PENDING, EnvironmentPhase.BUILDING),
                phase == EnvironmentPhase.FAILED,
                reason,
                message,
                observed_generation=gen,
            )
        )
        status["conditions"] = merge(prev.get("conditions"), desired, now)
        return status

    if env.spec.image is not None:
        status["image"] = build.image if build is not None and build.image else env.spec.image
        message = (
            f"prebuilt image, resolved to {status['image']}"
            if status["image"] != env.spec.image
            else "prebuilt image, used as it is"
        )
        return ready("Curated", message, EnvironmentPhase.READY)
    if build is None:
        return ready("Pending", "waiting for the build to be planned", EnvironmentPhase.PENDING)
    status["hash"] = build.hash
    if build.job:
        status["buildJob"] = build.job
    if build.image:
        status["image"] = build.image
        # Ready as soon as the image is in the registry: while its build Job still ends
        # (the builder exits after the push), it was built by that Job all the same.
        if not build.job:
            return ready("Cached", "image found in the registry", EnvironmentPhase.READY)
        how = {"Complete": "", "Failed": " (the Job then failed: see its Pod's log)"}.get(
            build.job_state, " (the Job is ending)"
        )
        return ready("Built", f"image built by Job {build.job}{how}", EnvironmentPhase.READY)
    if build.job_state == "Failed":
        status["message"] = build.job_message
        last = build.job_message.strip().splitlines()[-1] if build.job_message.strip() else ""
        return ready(
            "BuildFailed", f"build Job {build.job} failed: {last}", EnvironmentPhase.FAILED
        )
    if build.job_state == "Complete":
        status["message"] = "the build Job succeeded but the image is not in the registry"
        return ready("ImageMissing", status["message"], EnvironmentPhase.FAILED)
    message = f"build Job {build.job} is building the image"
    if build.registry_error:
        message += f" (asking the registry failed: {build.registry_error})"
    return ready("Building", message, EnvironmentPhase.BUILDING)


def invalid_environment_status(
    generation: int | None, message: str, previous: Mapping[str, Any] | None, now: datetime
) -> dict[str, Any]:
    """An Environment the controller cannot build: the one InvalidSpec status (an
    Environment has no Failed condition), its message beside the phase."""
    return invalid_spec_status(
        generation, message, previous, now, failed_condition=False, fields={"message": message}
    )
