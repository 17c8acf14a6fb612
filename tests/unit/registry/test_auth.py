"""The registry's authorization policy (``registry.auth.ReviewAuthorizer``) over stand-in
reviews, and its wiring to ``torchyard.k8s`` (``registry_server.kubernetes_authorizer``):
which audience a token must carry, which resource SubjectAccessReview is asked about,
whose ServiceAccount writes a run's archive. The real apiserver answers the same in
tests/integration/test_registry_service.py."""

from __future__ import annotations

from typing import Any

import pytest

from torchyard import k8s, registry_server
from torchyard.api import wire
from torchyard.registry import auth, service

USER = {"username": "system:serviceaccount:team:trainer", "uid": "u1"}


class Asked:
    """Stand-in reviews that record what they were asked."""

    def __init__(self, runs: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.runs = runs
        self.tokens: list[tuple[str, list[str]]] = []
        self.access: list[tuple[str, str, str]] = []

    def review_token(self, token: str, audiences: list[str]) -> dict[str, Any] | None:
        self.tokens.append((token, audiences))
        return USER if token == "good" else None

    def allowed(self, user: dict[str, Any], verb: str, namespace: str, resource: str) -> bool:
        self.access.append((verb, namespace, resource))
        return namespace == "team"

    def training_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.runs.get((namespace, name))

    def reviews(self) -> auth.Reviews:
        return auth.Reviews(self.review_token, self.allowed, self.training_run)


def test_the_policy_asks_for_the_registry_audience_and_modelversions() -> None:
    asked = Asked({})
    authorizer = auth.ReviewAuthorizer(asked.reviews())
    assert authorizer.user("good") == USER
    assert authorizer.user("apiserver-token") is None
    assert asked.tokens == [
        ("good", [wire.REGISTRY_AUDIENCE]),
        ("apiserver-token", [wire.REGISTRY_AUDIENCE]),
    ]
    assert authorizer.allowed(USER, "create", "team") is True
    assert authorizer.allowed(USER, "get", "other") is False
    assert asked.access == [("create", "team", "modelversions"), ("get", "other", "modelversions")]


@pytest.mark.parametrize(
    "spec, account",
    [({"serviceAccountName": "trainer"}, "trainer"), ({}, "default"), (None, "default")],
    ids=["named", "unset", "no spec"],
)
def test_a_runs_archive_is_written_by_its_service_account(
    spec: dict[str, Any] | None, account: str
) -> None:
    run = {"metadata": {"name": "r", "uid": "uid-r"}, "spec": spec}
    authorizer = auth.ReviewAuthorizer(Asked({("team", "r"): run}).reviews())
    assert authorizer.training_run("team", "r") == auth.RunIdentity("uid-r", account)
    assert authorizer.training_run("team", "gone") is None


def test_the_service_takes_the_policy_through_its_cache() -> None:
    asked = Asked({})
    cached = service.CachingAuthorizer(auth.ReviewAuthorizer(asked.reviews()))
    assert cached.user("good") == cached.user("good") == USER
    assert len(asked.tokens) == 1  # the second answer came from the cache


def test_registry_serve_wires_the_policy_to_the_apiserver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, Any]] = []

    def review_token(token: str, audiences: list[str]) -> dict[str, Any] | None:
        calls.append(("TokenReview", audiences))
        return USER

    def allowed(user: dict[str, Any], verb: str, namespace: str, resource: str) -> bool:
        calls.append(("SubjectAccessReview", (verb, namespace, resource)))
        return True

    def get_or_none(res: k8s.Resource, namespace: str, name: str) -> dict[str, Any] | None:
        calls.append(("get", (res, namespace, name)))
        return {"metadata": {"uid": "u"}, "spec": {"serviceAccountName": "sa"}}

    monkeypatch.setattr(k8s, "review_token", review_token)
    monkeypatch.setattr(k8s, "allowed", allowed)
    monkeypatch.setattr(k8s, "get_or_none", get_or_none)
    authorizer = registry_server.kubernetes_authorizer()
    assert authorizer.user("t") == USER
    assert authorizer.allowed(USER, "get", "team") is True
    assert authorizer.training_run("team", "r") == auth.RunIdentity("u", "sa")
    assert calls == [
        ("TokenReview", [wire.REGISTRY_AUDIENCE]),
        ("SubjectAccessReview", ("get", "team", "modelversions")),
        ("get", (k8s.TRAININGRUNS, "team", "r")),
    ]
