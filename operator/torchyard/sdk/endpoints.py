"""OnlineEndpoints from a script or the CLI: list and read them, call them, read their
serving Pods' logs, delete them.

:func:`invoke` sends a request to an endpoint's Service: from inside the cluster
directly to its scoring URI, from a laptop through the apiserver's service proxy (the
kubeconfig's credentials reach the apiserver only; the endpoint sees, in
``X-Torchyard-Token``, a 10-minute token of a ServiceAccount bound to the endpoint's own
audience, minted by TokenRequest: the kubeconfig's user needs ``create`` on
``serviceaccounts/token``, the ServiceAccount ``get`` on the endpoint). A public endpoint
gets no token. :func:`logs` reads every serving Pod's log, and the run before a restart of
a Pod whose scoring script failed (where its traceback is). Used by the Azure ML names
(``sdk.azureml.webservices``) and the CLI (``torchyard endpoints``); tested in
tests/unit/sdk/test_endpoints.py and on the real node.
"""

from __future__ import annotations

import os
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from torchyard import k8s
from torchyard.api import wire
from torchyard.planning import names
from torchyard.serving import contract

TOKEN_SECONDS = 600
SERVING_CONTAINERS = ("scorer", "kserve-container")


class EndpointNotFound(LookupError):
    """No OnlineEndpoint of that name in the namespace."""


@dataclass(frozen=True)
class Answer:
    """An endpoint's answer: its HTTP status, content type and body."""

    status: int
    content_type: str
    body: bytes


_tokens: dict[tuple[str, str, str], tuple[float, str]] = {}


def get(namespace: str, name: str) -> dict[str, Any]:
    found = k8s.get_or_none(k8s.ONLINEENDPOINTS, namespace, name)
    if found is None:
        raise EndpointNotFound(f"no OnlineEndpoint {name} in namespace {namespace}")
    return found


def list_endpoints(namespace: str) -> list[dict[str, Any]]:
    items = k8s.list_(k8s.ONLINEENDPOINTS, namespace)
    return sorted(items, key=lambda e: str(e["metadata"]["name"]))


def pods(namespace: str, name: str) -> list[dict[str, Any]]:
    items = k8s.list_(k8s.PODS, namespace, label_selector=f"{names.LABEL_ENDPOINT}={name}")
    return sorted(items, key=lambda p: str(p["metadata"]["name"]))


def token(namespace: str, name: str, service_account: str = "default") -> str:
    """A token of ``service_account`` for endpoint ``namespace/name`` (kept until a minute
    before it expires)."""
    key = (namespace, name, service_account)
    kept = _tokens.get(key)
    if kept is not None and kept[0] > time.monotonic():
        return kept[1]
    audience = wire.endpoint_audience(namespace, name)
    minted = k8s.request_token(namespace, service_account, [audience], TOKEN_SECONDS)
    _tokens[key] = (time.monotonic() + TOKEN_SECONDS - 60, minted)
    return minted


def _service(body: dict[str, Any]) -> str:
    name = str(body["metadata"]["name"])
    if (body.get("spec") or {}).get("backend") == "KServe":
        return f"{name}-predictor"
    return names.endpoint_service(name)


def route(body: dict[str, Any], protocol: str = "score") -> str:
    """The path of ``protocol`` (``score``: the guide's, ``v1``, ``v2``: the Open Inference
    Protocol's) of endpoint ``body``."""
    if protocol == "score":
        return contract.SCORE_PATH
    model = str(((body.get("status") or {}).get("model") or {}).get("name") or "")
    if not model:
        name = body["metadata"]["name"]
        raise EndpointNotFound(f"endpoint {name} serves no model yet: try again once it does")
    return {"v1": contract.V1_PREDICT, "v2": contract.V2_INFER}[protocol].format(model=model)


def invoke(
    namespace: str,
    name: str,
    data: bytes,
    *,
    route: str = contract.SCORE_PATH,
    content_type: str = "application/json",
    service_account: str = "default",
    direct: bool | None = None,
    timeout: float = 60,
) -> Answer:
    """POST ``data`` to ``route`` of the endpoint (see the module docstring); ``direct``:
    to its scoring URI (default: when this process runs in a Pod)."""
    body = get(namespace, name)
    public = bool((body.get("spec") or {}).get("public"))
    headers = {"Content-Type": content_type}
    context: ssl.SSLContext | None = None
    if direct is None:
        direct = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if direct:
        url = f"http://{_service(body)}.{namespace}.svc:{contract.SERVICE_PORT}{route}"
        if not public:
            headers["Authorization"] = f"Bearer {token(namespace, name, service_account)}"
    else:
        conn = k8s.connection()
        proxy = k8s.proxy_url(namespace, _service(body), contract.SERVICE_PORT)
        url = conn.host + proxy + route
        headers.update(conn.headers)
        context = conn.ssl_context
        if not public:
            headers[contract.TOKEN_HEADER] = token(namespace, name, service_account)
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return Answer(
                response.status, response.headers.get("Content-Type", ""), response.read()
            )
    except urllib.error.HTTPError as err:
        return Answer(err.code, err.headers.get("Content-Type", ""), err.read())
    except (urllib.error.URLError, OSError) as err:
        raise k8s.Unreachable(f"cannot reach endpoint {namespace}/{name} at {url}: {err}") from None


def logs(namespace: str, name: str, tail: int = 5000) -> dict[str, list[str]]:
    """The last ``tail`` lines of each serving Pod's log (of its container's run before
    the last restart too, when it restarted: ``<pod> (previous)``)."""
    out: dict[str, list[str]] = {}
    for pod in pods(namespace, name):
        pod_name = str(pod["metadata"]["name"])
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        serving = [c for c in statuses if c.get("name") in SERVING_CONTAINERS]
        container = serving[0]["name"] if serving else SERVING_CONTAINERS[0]
        reads = [(pod_name, False)]
        if serving and int(serving[0].get("restartCount") or 0) > 0:
            reads.insert(0, (f"{pod_name} (previous)", True))
        for label, previous in reads:
            try:
                lines = k8s.pod_log_lines(
                    namespace, pod_name, container=container, tail_lines=tail, previous=previous
                )
                out[label] = list(lines)
            except k8s.ApiError as err:
                out[label] = [f"(no log: {err.message})"]
    return out


def delete(namespace: str, name: str, *, wait: bool = True, timeout: float = 120) -> None:
    """Delete the endpoint (its Deployments, Service and Pods go with it); with ``wait``,
    return once it is gone."""
    if not k8s.delete(k8s.ONLINEENDPOINTS, namespace, name, propagation="Foreground"):
        raise EndpointNotFound(f"no OnlineEndpoint {name} in namespace {namespace}")
    deadline = time.monotonic() + timeout
    while wait and k8s.get_or_none(k8s.ONLINEENDPOINTS, namespace, name) is not None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"OnlineEndpoint {namespace}/{name} still there after {timeout}s")
        time.sleep(0.5)
