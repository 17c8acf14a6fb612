"""The two errors of ``torchyard.k8s``, so that no caller needs the client library's:

- :class:`ApiError`: an error answer of the apiserver with its HTTP status (the controller
  maps it to Kopf's retry vocabulary; the SDK and the CLI to a message).
  :func:`from_exception` turns the client library's exception into one.
- :class:`Unreachable`: no answer at all: no kubeconfig (or no such context), a server
  that does not answer, a connection that breaks. :func:`unreachable` turns the client
  library's ``ConfigException`` and urllib3's errors into one; ``connections``, ``rest``
  and ``logs`` raise it, and the CLI prints its message as the one line a user reads.
"""

from __future__ import annotations

import json

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

# What to check when the API cannot be reached: the CLI's flags, which are the SDK's
# ``clusters.connect(kubeconfig, context)`` arguments too.
ADVICE = "check --kubeconfig and --context (or $KUBECONFIG), and that the cluster is up"
# In a Pod the client uses the Pod's ServiceAccount instead of a kubeconfig.
IN_CLUSTER_ADVICE = (
    "check that the Pod mounts its ServiceAccount token (automountServiceAccountToken) "
    "and that the apiserver is up"
)


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


class Unreachable(Exception):
    """The Kubernetes API could not be reached; the message says why and what to check."""


def unreachable(err: Exception, advice: str = ADVICE) -> Unreachable:
    """``err`` (a ``ConfigException``, an urllib3 error, an unreadable certificate) as
    :class:`Unreachable`: where the client tried, why it failed, and ``advice``."""
    if isinstance(err, urllib3.exceptions.MaxRetryError):
        pool = getattr(err, "pool", None)
        where = f" at {pool.scheme}://{pool.host}:{pool.port}" if pool is not None else ""
        reason = err.reason if err.reason is not None else err
        return Unreachable(f"cannot reach the Kubernetes API{where}: {reason}; {advice}")
    return Unreachable(f"cannot reach the Kubernetes API: {str(err).rstrip('.')}; {advice}")


def from_exception(exc: ApiException) -> ApiError:
    """The apiserver's own ``reason`` and ``message`` (from its Status body) when it sent one."""
    reason, message = str(exc.reason or ""), str(exc.body or "")
    try:
        body = json.loads(exc.body or "{}")
        reason = body.get("reason", reason)
        message = body.get("message", message)
    except (ValueError, AttributeError):
        pass
    return ApiError(int(exc.status or 0), reason, message)


def from_response(status: int, reason: str | None, raw: bytes) -> ApiError:
    """An error answer read off a raw response (the client raises only on some codes)."""
    body = raw.decode(errors="replace") if raw else ""
    return from_exception(ApiException(status=status, reason=reason, body=body))


__all__ = ["ApiError", "Unreachable"]
