"""How torchyard reaches the apiserver: the configured client, the default namespace, and
a :class:`Connection` for code that streams through the service proxy without the client
library.

:func:`configure` makes a client of the official library (in-cluster in a Pod, else the
kubeconfig); :func:`load` keeps one as the shared default and :func:`reset` forgets it
(tests point it at another cluster); a kubeconfig that is not there surfaces as
:class:`~torchyard.k8s.errors.Unreachable`. The operator never uses the shared default:
it holds a client of its own (``clients.Client``). Used by the
other modules of ``torchyard.k8s``; the SDK and CLI call :func:`connection`,
:func:`proxy_url` and :func:`default_namespace` through the package.
"""

from __future__ import annotations

import os
import ssl
import threading
from dataclasses import dataclass

import yaml
from kubernetes import client, config

from torchyard.k8s import errors
from torchyard.k8s.resources import SERVICES

_lock = threading.Lock()
_client: client.ApiClient | None = None


def configure(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """A client of its own, shared with nothing: in-cluster when running in a Pod, else the
    kubeconfig (:class:`~torchyard.k8s.errors.Unreachable` when it is not there or has no
    such context). The operator runs on one (``k8s.Client``), never on :func:`load`'s."""
    cfg = client.Configuration()
    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException as err:
            raise errors.unreachable(err, errors.IN_CLUSTER_ADVICE) from None
    else:
        try:
            config.load_kube_config(
                config_file=kubeconfig or os.environ.get("KUBECONFIG"),
                context=context,
                client_configuration=cfg,
            )
        except config.ConfigException as err:
            raise errors.unreachable(err) from None
        except (TypeError, AttributeError, ValueError, yaml.YAMLError) as err:
            where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            why = " ".join(str(err).split())  # (the YAML parser's message spans lines)
            not_one = ValueError(f"{where} is not a kubeconfig: {why}")
            raise errors.unreachable(not_one) from None
    # The proxy the environment names, read now and kept: the client reads it again on every
    # request with a kubeconfig token (its refresh hook assigns the host, which walks
    # os.environ), and a walk that meets a variable another thread unsets raises KeyError.
    cfg.proxy = cfg.proxy
    # Fan-out of many Pods in parallel needs more than the default 4 connections.
    cfg.connection_pool_maxsize = 32
    return client.ApiClient(configuration=cfg)


def load(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """The shared default client of the CLI, the SDK and the registry service, configured
    once (see :func:`configure`); a ``kubeconfig`` or ``context`` replaces it."""
    global _client
    with _lock:
        if _client is not None and kubeconfig is None and context is None:
            return _client
        _client = configure(kubeconfig, context)
        return _client


def reset() -> None:
    """Forget the configured client (tests point it at another cluster)."""
    global _client
    with _lock:
        _client = None


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
        # The scheme is case-insensitive (RFC 9110), and the client's in-cluster loader
        # writes "bearer <token>": in a Pod that is the ServiceAccount's token.
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        return token.strip() or None


def connection(api: client.ApiClient | None = None) -> Connection:
    """The apiserver, TLS and credentials of ``api`` (default: :func:`load`'s client);
    :class:`Unreachable` when the kubeconfig's certificates cannot be read or its
    credential plugin fails."""
    cfg = (api or load()).configuration
    context = None
    try:
        if cfg.host.startswith("https"):
            context = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
            if not cfg.verify_ssl:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if cfg.cert_file:
                context.load_cert_chain(cfg.cert_file, cfg.key_file)
        if cfg.refresh_api_key_hook is not None:  # exec plugins and expiring tokens
            cfg.refresh_api_key_hook(cfg)
    except config.ConfigException as err:  # the credential plugin failed
        raise errors.unreachable(err) from None
    except OSError as err:  # a file that is not there or not PEM (ssl.SSLError is an OSError)
        files = ", ".join(f for f in (cfg.ssl_ca_cert, cfg.cert_file) if f)
        why = ValueError(f"cannot load the kubeconfig's certificates ({files}): {err}")
        raise errors.unreachable(why) from None
    token = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken") or ""
    headers = {"Authorization": token} if token else {}
    return Connection(cfg.host.rstrip("/"), context, headers)


def proxy_url(namespace: str, service: str, port: int, scheme: str = "") -> str:
    """The apiserver's proxy to a Service's port, over ``scheme`` (http when empty; with
    https the apiserver encrypts but does not verify the backend's certificate). RBAC:
    ``get``/``create`` on ``services/proxy``, resourceName ``[<scheme>:]<service>:<port>``."""
    ref = f"{scheme}:{service}:{port}" if scheme else f"{service}:{port}"
    return f"{SERVICES.path(namespace, ref)}/proxy"


__all__ = [
    "Connection",
    "configure",
    "connection",
    "default_namespace",
    "load",
    "proxy_url",
    "reset",
]
