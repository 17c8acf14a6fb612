"""The only code that talks to the Kubernetes API.

A thin, typed layer over the official ``kubernetes`` client's REST transport: get, list,
server-side apply (one field manager, forced, so the operator owns what it sets and
nothing else), status apply, delete. Paths come from a small table of the resources
torchyard uses, so no discovery round-trips are made. Errors surface as
:class:`ApiError` with the HTTP status, which the controller maps to Kopf's retry
vocabulary.

Called by the controller, the SDK and the CLI.
"""

from __future__ import annotations

import collections
import json
import os
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

FIELD_MANAGER = "torchyard"
# Requests made through this module, by HTTP method (for benchmarks and metrics).
REQUESTS: collections.Counter[str] = collections.Counter()


@dataclass(frozen=True)
class Resource:
    """Where a kind of object lives in the REST API."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base


TRAININGRUNS = Resource("torchyard.dev", "v1alpha1", "trainingruns")
ENVIRONMENTS = Resource("torchyard.dev", "v1alpha1", "environments")
MODELVERSIONS = Resource("torchyard.dev", "v1alpha1", "modelversions")
PODS = Resource("", "v1", "pods")
SERVICES = Resource("", "v1", "services")
CONFIGMAPS = Resource("", "v1", "configmaps")
EVENTS = Resource("", "v1", "events")
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)
NODES = Resource("", "v1", "nodes", namespaced=False)
JOBS = Resource("batch", "v1", "jobs")
SECRETS = Resource("", "v1", "secrets")
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts")
ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles")
ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings")
TOKENREVIEWS = Resource("authentication.k8s.io", "v1", "tokenreviews", namespaced=False)
SUBJECTACCESSREVIEWS = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", namespaced=False
)
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)

_BY_KIND: dict[tuple[str, str], Resource] = {
    ("torchyard.dev/v1alpha1", "TrainingRun"): TRAININGRUNS,
    ("torchyard.dev/v1alpha1", "Environment"): ENVIRONMENTS,
    ("torchyard.dev/v1alpha1", "ModelVersion"): MODELVERSIONS,
    ("v1", "Pod"): PODS,
    ("v1", "Service"): SERVICES,
    ("v1", "ConfigMap"): CONFIGMAPS,
    ("v1", "Event"): EVENTS,
    ("v1", "Namespace"): NAMESPACES,
    ("v1", "Node"): NODES,
    ("batch/v1", "Job"): JOBS,
    ("v1", "Secret"): SECRETS,
    ("v1", "ServiceAccount"): SERVICEACCOUNTS,
    ("rbac.authorization.k8s.io/v1", "Role"): ROLES,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ROLEBINDINGS,
    ("authentication.k8s.io/v1", "TokenReview"): TOKENREVIEWS,
    ("authorization.k8s.io/v1", "SubjectAccessReview"): SUBJECTACCESSREVIEWS,
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): CRDS,
}


def resource_of(manifest: dict[str, Any]) -> Resource:
    key = (manifest.get("apiVersion", ""), manifest.get("kind", ""))
    try:
        return _BY_KIND[key]
    except KeyError:
        raise ValueError(f"torchyard does not manage {key[1]} ({key[0]})") from None


class ApiError(Exception):
    """An error answer of the apiserver: ``status`` is the HTTP code."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def invalid(self) -> bool:
        return self.status == 422


def _error(exc: ApiException) -> ApiError:
    reason, message = str(exc.reason or ""), str(exc.body or "")
    try:
        body = json.loads(exc.body or "{}")
        reason = body.get("reason", reason)
        message = body.get("message", message)
    except (ValueError, AttributeError):
        pass
    return ApiError(int(exc.status or 0), reason, message)


_lock = threading.Lock()
_client: client.ApiClient | None = None


def load(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """Configure the client once: in-cluster when running in a Pod, else the kubeconfig."""
    global _client
    with _lock:
        if _client is not None and kubeconfig is None and context is None:
            return _client
        cfg = client.Configuration()
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(
                config_file=kubeconfig or os.environ.get("KUBECONFIG"),
                context=context,
                client_configuration=cfg,
            )
        # Fan-out of many Pods in parallel needs more than the default 4 connections.
        cfg.connection_pool_maxsize = 32
        _client = client.ApiClient(configuration=cfg)
        return _client


def default_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The namespace kubectl would use: the context's, in a Pod its own, else default."""
    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
                return f.read().strip() or "default"
        except OSError:
            return "default"
    try:
        contexts, current = config.list_kube_config_contexts(
            config_file=kubeconfig or os.environ.get("KUBECONFIG")
        )
    except (config.ConfigException, OSError, TypeError):
        return "default"
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


@dataclass(frozen=True)
class Connection:
    """How to reach the apiserver without the client library (for streaming through
    the service proxy): its URL, a TLS context with the kubeconfig's CA and client
    certificate, and the ``Authorization`` header when the kubeconfig has a token."""

    host: str
    ssl_context: ssl.SSLContext | None
    headers: dict[str, str]

    @property
    def bearer_token(self) -> str | None:
        value = self.headers.get("Authorization", "")
        return value[7:] if value.startswith("Bearer ") else None


def connection() -> Connection:
    cfg = load().configuration
    context = None
    if cfg.host.startswith("https"):
        context = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
        if not cfg.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if cfg.cert_file:
            context.load_cert_chain(cfg.cert_file, cfg.key_file)
    if cfg.refresh_api_key_hook is not None:  # exec plugins and expiring tokens
        cfg.refresh_api_key_hook(cfg)
    token = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken") or ""
    headers = {"Authorization": token} if token else {}
    return Connection(cfg.host.rstrip("/"), context, headers)


def proxy_url(namespace: str, service: str, port: int, scheme: str = "") -> str:
    """The apiserver's proxy to a Service's port, over ``scheme`` (http when empty; with
    https the apiserver encrypts but does not verify the backend's certificate). RBAC:
    ``get``/``create`` on ``services/proxy``, resourceName ``[<scheme>:]<service>:<port>``."""
    ref = f"{scheme}:{service}:{port}" if scheme else f"{service}:{port}"
    return f"{SERVICES.path(namespace, ref)}/proxy"


def reset() -> None:
    """Forget the configured client (tests point it at another cluster)."""
    global _client
    with _lock:
        _client = None


def _call(
    method: str,
    path: str,
    *,
    query: list[tuple[str, Any]] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    timeout: float = 30,
) -> Any:
    api = load()
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
        raise _error(exc) from None
    if not 200 <= response.status < 300:
        raise _error(
            ApiException(
                status=response.status,
                reason=response.reason,
                body=raw.decode(errors="replace") if raw else "",
            )
        )
    return json.loads(raw) if raw else {}


def get(res: Resource, namespace: str | None, name: str) -> dict[str, Any]:
    result: dict[str, Any] = _call("GET", res.path(namespace, name))
    return result


def get_or_none(res: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
    try:
        return get(res, namespace, name)
    except ApiError as err:
        if err.not_found:
            return None
        raise


def list_(
    res: Resource,
    namespace: str | None = None,
    *,
    label_selector: str | None = None,
    field_selector: str | None = None,
) -> list[dict[str, Any]]:
    query: list[tuple[str, Any]] = []
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    data = _call("GET", res.path(namespace), query=query)
    items: list[dict[str, Any]] = data.get("items", [])
    return items


def create(manifest: dict[str, Any]) -> dict[str, Any]:
    res = resource_of(manifest)
    namespace = manifest.get("metadata", {}).get("namespace")
    result: dict[str, Any] = _call(
        "POST", res.path(namespace), body=manifest, query=[("fieldValidation", "Strict")]
    )
    return result


def apply(
    manifest: dict[str, Any], *, field_manager: str = FIELD_MANAGER, subresource: str = ""
) -> dict[str, Any]:
    """Server-side apply ``manifest``, forcing ownership of the fields it sets."""
    res = resource_of(manifest)
    meta = manifest["metadata"]
    result: dict[str, Any] = _call(
        "PATCH",
        res.path(meta.get("namespace"), meta["name"], subresource),
        query=[("fieldManager", field_manager), ("force", "true"), ("fieldValidation", "Strict")],
        body=manifest,
        content_type="application/apply-patch+yaml",
    )
    return result


def apply_status(manifest: dict[str, Any], *, field_manager: str = FIELD_MANAGER) -> dict[str, Any]:
    """Server-side apply of the ``status`` subresource (``manifest`` holds only status)."""
    return apply(manifest, field_manager=field_manager, subresource="status")


def delete(
    res: Resource,
    namespace: str | None,
    name: str,
    *,
    propagation: str = "Background",
    grace_period_seconds: int | None = None,
) -> bool:
    """Delete an object; False when it was already gone."""
    body: dict[str, Any] = {"propagationPolicy": propagation}
    if grace_period_seconds is not None:
        body["gracePeriodSeconds"] = grace_period_seconds
    try:
        _call("DELETE", res.path(namespace, name), body=body)
    except ApiError as err:
        if err.not_found:
            return False
        raise
    return True


def record_event(
    obj: dict[str, Any], type_: str, reason: str, message: str, *, now: str
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
        "source": {"component": FIELD_MANAGER},
        "reportingComponent": FIELD_MANAGER,
        "reportingInstance": os.environ.get("HOSTNAME", FIELD_MANAGER),
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        return create(event)
    except ApiError:
        return None


def pod_log_lines(
    namespace: str,
    pod: str,
    *,
    container: str | None = None,
    follow: bool = False,
    tail_lines: int | None = None,
) -> Iterator[str]:
    """A Pod's log, line by line (``follow``: until the container ends). The apiserver
    gets it from the node's kubelet; errors surface as :class:`ApiError`."""
    api = load()
    query: list[tuple[str, Any]] = []
    if container:
        query.append(("container", container))
    if follow:
        query.append(("follow", "true"))
    if tail_lines is not None:
        query.append(("tailLines", tail_lines))
    REQUESTS["GET"] += 1
    try:
        method, url, headers, _, _ = api.param_serialize(
            method="GET",
            resource_path=PODS.path(namespace, pod, "log"),
            query_params=query,
            header_params={"Accept": "*/*"},
            auth_settings=["BearerToken"],
        )
        response = api.call_api(
            method, url, header_params=headers, _request_timeout=None if follow else 60
        )
    except ApiException as exc:
        raise _error(exc) from None
    if not 200 <= response.status < 300:
        raw = response.read()
        raise _error(
            ApiException(status=response.status, reason=response.reason, body=raw.decode())
        )
    pending = b""
    try:
        for chunk in response.response.stream(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode("utf-8", "replace")
        if pending:
            yield pending.decode("utf-8", "replace")
    finally:
        response.response.release_conn()


def events_of(namespace: str, name: str, uid: str | None = None) -> list[dict[str, Any]]:
    """Events about one object, oldest first."""
    selector = f"involvedObject.name={name}" + (f",involvedObject.uid={uid}" if uid else "")
    items = list_(EVENTS, namespace, field_selector=selector)
    return sorted(
        items,
        key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or "",
    )


def review_token(token: str, audiences: list[str]) -> dict[str, Any] | None:
    """TokenReview: the user a bearer token belongs to, or None when it is not valid. With
    ``audiences``, the token must be bound to one of them: the answer's
    ``status.audiences`` (what the authenticator vouches for) must name one, as the API
    asks callers to check (an authenticator may ignore the requested audiences)."""
    review = create(
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": audiences},
        }
    )
    st = review.get("status", {})
    if not st.get("authenticated"):
        return None
    if audiences and not set(audiences) & set(st.get("audiences") or []):
        return None
    user: dict[str, Any] = st.get("user", {})
    return user


def allowed(
    user: dict[str, Any], verb: str, namespace: str, resource: str, group: str = "torchyard.dev"
) -> bool:
    """SubjectAccessReview: may ``user`` (from review_token) do ``verb`` on ``resource``?"""
    review = create(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user.get("username", ""),
                "uid": user.get("uid", ""),
                "groups": user.get("groups", []),
                "extra": user.get("extra", {}),
                "resourceAttributes": {
                    "namespace": namespace,
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                },
            },
        }
    )
    return bool(review.get("status", {}).get("allowed"))


def request_token(
    namespace: str, service_account: str, audiences: list[str], seconds: int = 600
) -> str:
    """A short-lived token of a ServiceAccount (TokenRequest)."""
    path = SERVICEACCOUNTS.path(namespace, service_account, "token")
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"audiences": audiences, "expirationSeconds": seconds},
    }
    result = _call("POST", path, body=body)
    return str(result["status"]["token"])


__all__ = [
    "CONFIGMAPS",
    "CRDS",
    "ENVIRONMENTS",
    "EVENTS",
    "FIELD_MANAGER",
    "JOBS",
    "MODELVERSIONS",
    "NAMESPACES",
    "NODES",
    "PODS",
    "REQUESTS",
    "SECRETS",
    "SERVICES",
    "TRAININGRUNS",
    "ApiError",
    "Connection",
    "Resource",
    "allowed",
    "apply",
    "apply_status",
    "connection",
    "create",
    "default_namespace",
    "delete",
    "events_of",
    "get",
    "get_or_none",
    "list_",
    "load",
    "pod_log_lines",
    "proxy_url",
    "record_event",
    "request_token",
    "reset",
    "resource_of",
    "review_token",
]
