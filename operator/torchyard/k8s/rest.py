"""Reading and writing objects: get, list, create, server-side apply (one field manager,
forced, so the operator owns what it sets and nothing else), status apply, delete.

Every request goes through :func:`call` over the official client's REST transport (the
shared default client, or the ``api`` a caller passes: the operator's own, through
``clients.Client``) and is
counted in :data:`REQUESTS` by HTTP method (for benchmarks and metrics). Errors surface
as :class:`~torchyard.k8s.errors.ApiError` (the apiserver said no) or
:class:`~torchyard.k8s.errors.Unreachable` (no answer). Called through the package (``k8s.apply``)
by the controller, the SDK and the CLI, and by ``events`` and ``reviews`` beside it.
"""

from __future__ import annotations

import collections
import json
from typing import Any

import urllib3.exceptions
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from torchyard.k8s import connections, errors
from torchyard.k8s.resources import Resource, resource_of

FIELD_MANAGER = "torchyard"
# Requests made through this package, by HTTP method (for benchmarks and metrics).
REQUESTS: collections.Counter[str] = collections.Counter()


def call(
    method: str,
    path: str,
    *,
    query: list[tuple[str, Any]] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    timeout: float = 30,
    api: ApiClient | None = None,
) -> Any:
    """One request with ``api``'s credentials (default: the shared ``connections.load()``);
    the decoded JSON answer (``{}`` when empty)."""
    api = api or connections.load()
    REQUESTS[method] += 1
    try:
        method, url, headers, _, _ = api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params={"Accept": "application/json", "Content-Type": content_type},
            auth_settings=["BearerToken"],
        )
        response = api.call_api(
            method, url, header_params=headers, body=body, _request_timeout=timeout
        )
        raw = response.read()
    except ApiException as exc:
        raise errors.from_exception(exc) from None
    except urllib3.exceptions.HTTPError as err:  # refused, timed out, broken
        raise errors.unreachable(err) from None
    if not 200 <= response.status < 300:
        raise errors.from_response(response.status, response.reason, raw)
    return json.loads(raw) if raw else {}


def get(
    res: Resource, namespace: str | None, name: str, *, api: ApiClient | None = None
) -> dict[str, Any]:
    result: dict[str, Any] = call("GET", res.path(namespace, name), api=api)
    return result


def get_or_none(
    res: Resource, namespace: str | None, name: str, *, api: ApiClient | None = None
) -> dict[str, Any] | None:
    try:
        return get(res, namespace, name, api=api)
    except errors.ApiError as err:
        if err.not_found:
            return None
        raise


def list_(
    res: Resource,
    namespace: str | None = None,
    *,
    label_selector: str | None = None,
    field_selector: str | None = None,
    api: ApiClient | None = None,
) -> list[dict[str, Any]]:
    query: list[tuple[str, Any]] = []
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    data = call("GET", res.path(namespace), query=query, api=api)
    items: list[dict[str, Any]] = data.get("items", [])
    return items


def create(
    manifest: dict[str, Any], *, field_manager: str | None = None, api: ApiClient | None = None
) -> dict[str, Any]:
    """Create ``manifest`` (409 when it exists), its fields owned by ``field_manager``
    when given (as an update's, not an apply's: a later apply of the same manager does
    not remove them by leaving them out)."""
    res = resource_of(manifest)
    namespace = manifest.get("metadata", {}).get("namespace")
    query = [("fieldValidation", "Strict")]
    if field_manager:
        query.append(("fieldManager", field_manager))
    result: dict[str, Any] = call("POST", res.path(namespace), body=manifest, query=query, api=api)
    return result


def apply(
    manifest: dict[str, Any],
    *,
    field_manager: str = FIELD_MANAGER,
    subresource: str = "",
    api: ApiClient | None = None,
) -> dict[str, Any]:
    """Server-side apply ``manifest``, forcing ownership of the fields it sets."""
    res = resource_of(manifest)
    meta = manifest["metadata"]
    result: dict[str, Any] = call(
        "PATCH",
        res.path(meta.get("namespace"), meta["name"], subresource),
        query=[("fieldManager", field_manager), ("force", "true"), ("fieldValidation", "Strict")],
        body=manifest,
        content_type="application/apply-patch+yaml",
        api=api,
    )
    return result


def apply_status(
    manifest: dict[str, Any], *, field_manager: str = FIELD_MANAGER, api: ApiClient | None = None
) -> dict[str, Any]:
    """Server-side apply of the ``status`` subresource (``manifest`` holds only status)."""
    return apply(manifest, field_manager=field_manager, subresource="status", api=api)


def merge_patch(
    res: Resource,
    namespace: str | None,
    name: str,
    patch: dict[str, Any],
    *,
    subresource: str = "",
    api: ApiClient | None = None,
) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386): what server-side apply cannot do, such as clearing
    a field another manager set; a ``metadata.resourceVersion`` in ``patch`` makes it
    conditional (409 when the object changed since)."""
    result: dict[str, Any] = call(
        "PATCH",
        res.path(namespace, name, subresource),
        body=patch,
        content_type="application/merge-patch+json",
        api=api,
    )
    return result


def delete(
    res: Resource,
    namespace: str | None,
    name: str,
    *,
    propagation: str = "Background",
    grace_period_seconds: int | None = None,
    api: ApiClient | None = None,
) -> bool:
    """Delete an object; False when it was already gone."""
    body: dict[str, Any] = {"propagationPolicy": propagation}
    if grace_period_seconds is not None:
        body["gracePeriodSeconds"] = grace_period_seconds
    try:
        call("DELETE", res.path(namespace, name), body=body, api=api)
    except errors.ApiError as err:
        if err.not_found:
            return False
        raise
    return True


__all__ = [
    "FIELD_MANAGER",
    "REQUESTS",
    "apply",
    "apply_status",
    "create",
    "delete",
    "get",
    "get_or_none",
    "list_",
    "merge_patch",
]
