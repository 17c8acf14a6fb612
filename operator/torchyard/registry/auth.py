"""Who may use the registry service: the :class:`Authorizer` the service asks, its bounded
cache (:class:`CachingAuthorizer`), and :class:`ReviewAuthorizer`, the registry's policy
over the cluster's answers.

The policy is the registry's own, so it lives here beside the service: a token counts only
when it is bound to the registry's audience (``wire.REGISTRY_AUDIENCE``: node Pods'
projected tokens, the operator's, the TokenRequest tokens the CLI and SDK mint; a token for
the apiserver, such as a Pod's automounted one or a kubeconfig's, is refused, so the
registry can never replay one against the apiserver); reading and writing are ``get`` and
``create`` on ``modelversions`` in the namespace; a run's archive is written by the
ServiceAccount of its TrainingRun (``spec.serviceAccountName``, else ``default``); a run
record is written by whoever may ``create`` ``runrecords`` there (the operator). A caller
of an OnlineEndpoint that is not public (the serving Pod forwards its token) must hold a
token bound to that endpoint's own audience whose user may ``get`` the endpoint.

The questions themselves (TokenReview, SubjectAccessReview, reading the TrainingRun) are
Kubernetes calls, and ``registry`` lies below ``k8s`` in the layers (pyproject.toml's
import-linter contract): they come in as :class:`Reviews`, which the server entry
``torchyard.registry_server`` (``torchyard registry serve``) builds from ``torchyard.k8s``.
So the service and its policy are tested without a cluster (tests/unit/registry/
test_auth.py, test_service.py) and against the real apiserver
(tests/integration/test_registry_service.py).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from torchyard.api import wire

MAX_CACHED = 4096  # answers each cache of CachingAuthorizer holds at most
# A TrainingRun deleted and created again under its name may change uid and ServiceAccount:
# its identity is cached briefly, and "no such run" not at all.
RUN_TTL = 5.0
# What SubjectAccessReview is asked about: the registry's models are ModelVersions (a
# run record's write asks about ``runrecords`` instead, ``registry.records``).
RESOURCE = "modelversions"
# Who may call an OnlineEndpoint that is not public: get on it (``endpoint_allowed``).
ENDPOINTS = "onlineendpoints"


@dataclass(frozen=True)
class RunIdentity:
    """A TrainingRun as the registry sees it: its uid, and the ServiceAccount its node
    Pods run as (``spec.serviceAccountName``, else ``default``)."""

    uid: str
    service_account: str


class Authorizer(Protocol):
    """Who is this token, and may they do this in that namespace?"""

    def user(self, token: str) -> dict[str, Any] | None: ...

    def allowed(
        self, user: dict[str, Any], verb: str, namespace: str, resource: str = RESOURCE
    ) -> bool: ...

    def training_run(self, namespace: str, name: str) -> RunIdentity | None:
        """TrainingRun ``name`` in ``namespace``, or None when there is none."""
        ...

    def endpoint_user(self, token: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Who this token is, when it is bound to OnlineEndpoint ``namespace/name``'s own
        audience (``wire.endpoint_audience``), else None."""
        ...

    def endpoint_allowed(self, user: dict[str, Any], namespace: str, name: str) -> bool:
        """May the user ``get`` OnlineEndpoint ``namespace/name`` (so call it)?"""
        ...


K = TypeVar("K")
V = TypeVar("V")


@dataclass
class ExpiringCache(Generic[K, V]):
    """At most ``size`` answers, each for ``ttl`` seconds. Every entry lives as long, so
    the oldest entry is also the first to expire: a put drops expired entries and then
    the oldest ones until the cache fits. Safe to use from several threads."""

    ttl: float
    size: int = MAX_CACHED
    _items: OrderedDict[K, tuple[float, V]] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, key: K) -> tuple[V] | None:
        """``(answer,)`` while it is fresh (the answer may be None), else None."""
        with self._lock:
            hit = self._items.get(key)
            if hit is None or hit[0] <= time.monotonic():
                return None
            return (hit[1],)

    def put(self, key: K, value: V) -> None:
        with self._lock:
            now = time.monotonic()
            self._items.pop(key, None)
            self._items[key] = (now + self.ttl, value)
            while self._items and (
                len(self._items) > self.size or next(iter(self._items.values()))[0] <= now
            ):
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class CachingAuthorizer:
    """Caches answers for ``ttl`` seconds (keyed by the token's hash, never the token),
    TrainingRuns for at most :data:`RUN_TTL`; at most ``size`` answers of each kind."""

    inner: Authorizer
    ttl: float = 30.0
    size: int = MAX_CACHED
    _users: ExpiringCache[str, dict[str, Any] | None] = field(init=False)
    _decisions: ExpiringCache[tuple[str, str, str, str], bool] = field(init=False)
    _runs: ExpiringCache[tuple[str, str], RunIdentity] = field(init=False)

    def __post_init__(self) -> None:
        self._users = ExpiringCache(self.ttl, self.size)
        self._decisions = ExpiringCache(self.ttl, self.size)
        self._runs = ExpiringCache(min(self.ttl, RUN_TTL), self.size)

    def user(self, token: str) -> dict[str, Any] | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        return self._cached_user(key, lambda: self.inner.user(token))

    def _cached_user(
        self, key: str, ask: Callable[[], dict[str, Any] | None]
    ) -> dict[str, Any] | None:
        hit = self._users.get(key)
        if hit is not None:
            return hit[0]
        user = ask()
        self._users.put(key, user)
        return user

    def _decided(self, key: tuple[str, str, str, str], ask: Callable[[], bool]) -> bool:
        hit = self._decisions.get(key)
        if hit is not None:
            return hit[0]
        answer = ask()
        self._decisions.put(key, answer)
        return answer

    def allowed(
        self, user: dict[str, Any], verb: str, namespace: str, resource: str = RESOURCE
    ) -> bool:
        key = (str(user.get("uid") or user.get("username")), verb, namespace, resource)
        return self._decided(key, lambda: self.inner.allowed(user, verb, namespace, resource))

    def endpoint_user(self, token: str, namespace: str, name: str) -> dict[str, Any] | None:
        audience = wire.endpoint_audience(namespace, name)
        key = hashlib.sha256(f"{audience}\n{token}".encode()).hexdigest()
        return self._cached_user(key, lambda: self.inner.endpoint_user(token, namespace, name))

    def endpoint_allowed(self, user: dict[str, Any], namespace: str, name: str) -> bool:
        key = (
            str(user.get("uid") or user.get("username")),
            "get",
            namespace,
            f"{ENDPOINTS}/{name}",
        )
        return self._decided(key, lambda: self.inner.endpoint_allowed(user, namespace, name))

    def training_run(self, namespace: str, name: str) -> RunIdentity | None:
        hit = self._runs.get((namespace, name))
        if hit is not None:
            return hit[0]
        found = self.inner.training_run(namespace, name)
        if found is not None:
            self._runs.put((namespace, name), found)
        return found


@dataclass(frozen=True)
class Reviews:
    """The cluster's answers the registry's policy needs (``torchyard.registry_server``
    passes ``torchyard.k8s``'s; tests pass stand-ins)."""

    # TokenReview: the user of a token bound to one of the audiences, else None.
    review_token: Callable[[str, list[str]], dict[str, Any] | None]
    # SubjectAccessReview: may the user do the verb on the resource (group torchyard.dev)
    # in the namespace?  (user, verb, namespace, resource)
    allowed: Callable[[dict[str, Any], str, str, str], bool]
    # The TrainingRun (namespace, name), or None when there is none.
    training_run: Callable[[str, str], dict[str, Any] | None]
    # SubjectAccessReview of one object: (user, verb, namespace, resource, name); None:
    # nobody may (a registry wired without it serves no endpoint's callers).
    allowed_named: Callable[[dict[str, Any], str, str, str, str], bool] | None = None


@dataclass(frozen=True)
class ReviewAuthorizer:
    """The registry's policy (see the module's docstring) over ``reviews``."""

    reviews: Reviews

    def user(self, token: str) -> dict[str, Any] | None:
        return self.reviews.review_token(token, [wire.REGISTRY_AUDIENCE])

    def allowed(
        self, user: dict[str, Any], verb: str, namespace: str, resource: str = RESOURCE
    ) -> bool:
        return self.reviews.allowed(user, verb, namespace, resource)

    def training_run(self, namespace: str, name: str) -> RunIdentity | None:
        """The run's uid and its node Pods' ServiceAccount, or None when there is no such
        TrainingRun."""
        run = self.reviews.training_run(namespace, name)
        if run is None:
            return None
        account = (run.get("spec") or {}).get("serviceAccountName") or "default"
        return RunIdentity(str(run["metadata"].get("uid", "")), str(account))

    def endpoint_user(self, token: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.reviews.review_token(token, [wire.endpoint_audience(namespace, name)])

    def endpoint_allowed(self, user: dict[str, Any], namespace: str, name: str) -> bool:
        ask = self.reviews.allowed_named
        return ask is not None and ask(user, "get", namespace, ENDPOINTS, name)


__all__ = [
    "ENDPOINTS",
    "MAX_CACHED",
    "RUN_TTL",
    "Authorizer",
    "CachingAuthorizer",
    "ExpiringCache",
    "ReviewAuthorizer",
    "Reviews",
    "RunIdentity",
]
