"""Reconcilers: parse -> plan -> apply -> compute status -> patch if changed.

Plain functions over a resource body, called by the Kopf handlers in ``handlers.py``
(and by the resync loop). Only ``torchyard.k8s`` is used to talk to the API; a spec the
apiserver let through but torchyard cannot run is reported in status once, not retried.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from torchyard import api, k8s, status

Clock = Callable[[], datetime]
Log = logging.Logger | logging.LoggerAdapter[Any]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _status_manifest(body: Mapping[str, Any], new_status: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {
        "apiVersion": body["apiVersion"],
        "kind": body["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "status": new_status,
    }


def _patch_status_if_changed(
    body: Mapping[str, Any], new_status: dict[str, Any], logger: Log
) -> bool:
    """Apply ``new_status`` unless the object already shows it; True when written."""
    current = dict(body.get("status") or {})
    if all(current.get(k) == v for k, v in new_status.items()) and set(current) <= set(new_status):
        return False
    k8s.apply_status(_status_manifest(body, new_status))
    logger.debug("status of %s/%s updated", body["metadata"]["namespace"], body["metadata"]["name"])
    return True


def trainingrun(body: Mapping[str, Any], logger: Log, now: Clock = utcnow) -> bool:
    """Reconcile one TrainingRun; returns whether its status was written."""
    previous = body.get("status") or {}
    generation = body["metadata"].get("generation")
    try:
        run = api.parse_trainingrun(dict(body))
    except api.InvalidSpec as err:
        logger.warning("TrainingRun %s is invalid: %s", body["metadata"]["name"], err)
        new = status.invalid_trainingrun_status(generation, str(err), previous, now())
        return _patch_status_if_changed(body, new, logger)
    new = status.trainingrun_status(run, previous, now())
    return _patch_status_if_changed(body, new, logger)


def environment(body: Mapping[str, Any], logger: Log, now: Clock = utcnow) -> bool:
    """Reconcile one Environment; returns whether its status was written."""
    previous = body.get("status") or {}
    generation = body["metadata"].get("generation")
    try:
        env = api.parse_environment(dict(body))
    except api.InvalidSpec as err:
        logger.warning("Environment %s is invalid: %s", body["metadata"]["name"], err)
        new = status.invalid_environment_status(generation, str(err), previous, now())
        return _patch_status_if_changed(body, new, logger)
    new = status.environment_status(env, previous, now())
    return _patch_status_if_changed(body, new, logger)
