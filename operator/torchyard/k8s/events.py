"""core/v1 Events: :func:`record_event` writes one about an object (best effort),
:func:`events_of` reads an object's, oldest first. The controller records through
``Context.k8s``; ``torchyard describe`` and the SDK read them.
"""

from __future__ import annotations

import os
from typing import Any

from kubernetes.client import ApiClient

from torchyard.k8s import errors, rest
from torchyard.k8s.resources import EVENTS


def record_event(
    obj: dict[str, Any],
    type_: str,
    reason: str,
    message: str,
    *,
    now: str,
    api: ApiClient | None = None,
) -> dict[str, Any] | None:
    """A core/v1 Event about ``obj`` (best effort: an Event that fails is not an error)."""
    meta = obj["metadata"]
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": rest.FIELD_MANAGER},
        "reportingComponent": rest.FIELD_MANAGER,
        "reportingInstance": os.environ.get("HOSTNAME", rest.FIELD_MANAGER),
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        return rest.create(event, api=api)
    except errors.ApiError:
        return None


def events_of(namespace: str, name: str, uid: str | None = None) -> list[dict[str, Any]]:
    """Events about one object, oldest first."""
    selector = f"involvedObject.name={name}" + (f",involvedObject.uid={uid}" if uid else "")
    items = rest.list_(EVENTS, namespace, field_selector=selector)
    return sorted(
        items,
        key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or "",
    )


__all__ = ["events_of", "record_event"]
