"""Who a caller is and what it may do, asked of the apiserver: TokenReview
(:func:`review_token`), SubjectAccessReview (:func:`allowed`), and short-lived
ServiceAccount tokens from the TokenRequest API (:func:`request_token`). The registry
service's authorizer reviews callers' tokens; the CLI and SDK mint registry tokens.
"""

from __future__ import annotations

from typing import Any

from torchyard.api import wire
from torchyard.k8s import rest
from torchyard.k8s.resources import SERVICEACCOUNTS


def review_token(token: str, audiences: list[str]) -> dict[str, Any] | None:
    """TokenReview: the user a bearer token belongs to, or None when it is not valid. With
    ``audiences``, the token must be bound to one of them: the answer's
    ``status.audiences`` (what the authenticator vouches for) must name one, as the API
    asks callers to check (an authenticator may ignore the requested audiences)."""
    review = rest.create(
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
    user: dict[str, Any],
    verb: str,
    namespace: str,
    resource: str,
    group: str = wire.GROUP,
    subresource: str = "",
    name: str = "",
) -> bool:
    """SubjectAccessReview: may ``user`` (from review_token) do ``verb`` on ``resource``
    (its ``subresource``, e.g. ``pods``' ``log``, when given; the object ``name`` when
    given, else any)?"""
    review = rest.create(
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
                    "subresource": subresource,
                    "name": name,
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
    result = rest.call("POST", path, body=body)
    return str(result["status"]["token"])


__all__ = ["allowed", "request_token", "review_token"]
