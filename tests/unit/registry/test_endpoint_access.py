"""The registry's answer to a serving Pod (``GET /v1/namespaces/{ns}/endpoints/{name}/access``,
torchyard.registry.endpoints), served for real on loopback with a stand-in Authorizer;
ReviewAuthorizer's questions (the endpoint's own audience, get on that one endpoint) with
stand-in reviews; the cache that keeps both. The same runs against the real apiserver in
tests/integration/test_endpoints.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.unit.registry.test_service import A, B, Served, StandIn
from torchyard.api import wire
from torchyard.registry import auth
from torchyard.registry.service import Limits


@dataclass
class Callers(StandIn):
    """alice's token is bound to endpoint a/birds; bob's too, but bob may not get it;
    carol's is a registry token (another audience)."""

    asked: list[tuple[str, ...]] = field(default_factory=list)

    def endpoint_user(self, token: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.asked.append(("user", token, namespace, name))
        bound = {"alice": (A, "birds"), "bob": (A, "birds")}
        return {"username": token} if bound.get(token) == (namespace, name) else None

    def endpoint_allowed(self, user: dict[str, Any], namespace: str, name: str) -> bool:
        self.asked.append(("allowed", user["username"], namespace, name))
        return user["username"] == "alice"


@pytest.fixture
def callers() -> Callers:
    return Callers()


@pytest.fixture
def served(tmp_path: Path, callers: Callers) -> Iterator[Served]:
    svc = Served(tmp_path / "registry", callers, Limits())
    yield svc
    svc.stop()


def ask(svc: Served, token: str, ns: str = A, name: str = "birds") -> tuple[int, Any]:
    code, raw = svc.call("GET", f"/v1/namespaces/{ns}/endpoints/{name}/access", token)
    return code, json.loads(raw) if raw.startswith(b"{") else raw.decode()


def test_the_answers(served: Served) -> None:
    assert ask(served, "alice") == (200, {"user": "alice"})
    code, said = ask(served, "bob")
    assert code == 403 and "may not get onlineendpoints/birds" in said["error"]
    code, said = ask(served, "carol")
    assert code == 401 and wire.endpoint_audience(A, "birds") in said["error"]
    assert ask(served, "alice", B)[0] == 401  # bound to a/birds, not to b/birds
    assert ask(served, "alice", A, "other")[0] == 401
    assert ask(served, "")[0] == 401


@pytest.mark.parametrize("name", ["..", "%2e%2e", "Birds", "a" * 300])
def test_a_hostile_name_is_refused_before_anyone_is_asked(
    served: Served, callers: Callers, name: str
) -> None:
    assert ask(served, "alice", A, name)[0] in (400, 404)
    assert callers.asked == []


def test_review_authorizer_asks_the_endpoints_audience_and_that_one_endpoint() -> None:
    asked: list[Any] = []

    def review(token: str, audiences: list[str]) -> dict[str, Any] | None:
        asked.append(("review", audiences))
        return {"username": "alice", "uid": "u"}

    def named(user: dict[str, Any], verb: str, ns: str, resource: str, name: str) -> bool:
        asked.append(("sar", verb, ns, resource, name))
        return True

    reviews = auth.Reviews(review, lambda *a: False, lambda *a: None, named)
    cached = auth.CachingAuthorizer(auth.ReviewAuthorizer(reviews))
    user = cached.endpoint_user("t", A, "birds")
    assert user is not None and cached.endpoint_allowed(user, A, "birds")
    assert cached.endpoint_user("t", A, "birds") == user  # kept
    assert cached.endpoint_allowed(user, A, "birds")
    assert asked == [
        ("review", ["torchyard.dev/endpoints/team-a/birds"]),
        ("sar", "get", A, "onlineendpoints", "birds"),
    ]
    # the same token for another endpoint is another question
    cached.endpoint_user("t", A, "other")
    assert asked[-1] == ("review", ["torchyard.dev/endpoints/team-a/other"])
    # a registry wired without named reviews lets nobody call
    bare = auth.ReviewAuthorizer(auth.Reviews(review, lambda *a: True, lambda *a: None))
    assert not bare.endpoint_allowed({"username": "alice"}, A, "birds")
