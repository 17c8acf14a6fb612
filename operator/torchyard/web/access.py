"""The web view in the cluster (``torchyard ui --in-cluster``, the Helm chart's ``ui``):
callers bring a Kubernetes token, and every read and every change is authorized for that
identity by SubjectAccessReview before the server's own ServiceAccount does it, as the
registry service does (``registry.auth``).

The token is pasted once on ``/login``, checked by TokenReview and kept in the caller's
browser only (an HttpOnly, SameSite=Strict cookie): the server stores no token; it
caches the reviews' answers for :data:`TTL` seconds, keyed by the token's hash.
:class:`AuthorizedSource` is the :class:`~torchyard.web.source.RunSource` a request
reads through: each method asks first whether the caller may ``get``/``list`` what it
returns (a token of namespace A reads nothing of namespace B), and refuses with 403
otherwise. Called by ``torchyard.web.app``; tested in tests/unit/web/test_access.py and
on the real control plane in tests/integration/web/test_in_cluster.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchyard import k8s
from torchyard.api import wire
from torchyard.records import Page, Query, Record
from torchyard.registry.auth import ExpiringCache
from torchyard.sdk import sweeps as sweep_sdk
from torchyard.web.queries import Refusal
from torchyard.web.source import Archive, Download, Obj, Queue, RunSource, Unavailable

COOKIE = "torchyard-ui-token"
TTL = 30.0
CACHED = 4096
MAX_TOKEN = 16 << 10
User = dict[str, Any]
# (user, verb, namespace, resource, group, subresource) -> allowed?
Allowed = Callable[[User, str, str, str, str, str], bool]


@dataclass
class Reviews:
    """TokenReview and SubjectAccessReview (``review`` and ``allowed``: torchyard.k8s's,
    or stand-ins in unit tests), their answers cached for ``ttl`` seconds."""

    review: Callable[[str], User | None]
    allowed: Allowed
    ttl: float = TTL
    _users: ExpiringCache[str, User | None] = field(init=False)
    _answers: ExpiringCache[tuple[str, ...], bool] = field(init=False)

    def __post_init__(self) -> None:
        self._users = ExpiringCache(self.ttl, CACHED)
        self._answers = ExpiringCache(self.ttl, CACHED)

    def user(self, token: str) -> User | None:
        if not token or len(token) > MAX_TOKEN:
            return None
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._users.get(key)
        if hit is None:
            hit = (self.review(token),)
            self._users.put(key, hit[0])
        return hit[0]

    def may(self, user: User, verb: str, ns: str, resource: str, group: str, sub: str) -> bool:
        who = str(user.get("uid") or user.get("username"))
        key = (who, verb, ns, resource, group, sub)
        hit = self._answers.get(key)
        if hit is None:
            hit = (self.allowed(user, verb, ns, resource, group, sub),)
            self._answers.put(key, hit[0])
        return hit[0]


def kubernetes_reviews(ttl: float = TTL) -> Reviews:
    """The apiserver's TokenReview (the apiserver's own audiences) and SubjectAccessReview."""
    return Reviews(
        lambda token: k8s.review_token(token, []),
        lambda user, verb, ns, resource, group, sub: k8s.allowed(
            user, verb, ns, resource, group, sub
        ),
        ttl,
    )


def home_namespace(user: User) -> str | None:
    """A ServiceAccount's own namespace (``system:serviceaccount:NS:NAME``), else None."""
    parts = str(user.get("username", "")).split(":")
    return parts[2] if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"] else None


class AuthorizedSource:
    """``inner`` (read with the server's own rights) for one caller: what the caller may
    not read is refused (403) before it is read."""

    def __init__(self, inner: RunSource, user: User, reviews: Reviews) -> None:
        self.inner = inner
        self.user = user
        self.reviews = reviews

    def need(
        self, verb: str, ns: str, resource: str, group: str = wire.GROUP, sub: str = ""
    ) -> None:
        if not self.reviews.may(self.user, verb, ns, resource, group, sub):
            what = f"{resource}/{sub}" if sub else resource
            where = f" in namespace {ns}" if ns else ""
            who = self.user.get("username", "this token")
            raise Refusal(f"{who} may not {verb} {what}{where}", 403)

    def runs(self, namespace: str) -> list[Obj]:
        self.need("list", namespace, "trainingruns")
        return self.inner.runs(namespace)

    def run(self, namespace: str, name: str) -> Obj | None:
        self.need("get", namespace, "trainingruns")
        return self.inner.run(namespace, name)

    def pods(self, namespace: str, name: str) -> list[Obj]:
        self.need("list", namespace, "pods", "")
        return self.inner.pods(namespace, name)

    def events(self, run: Obj) -> list[Obj]:
        self.need("list", run["metadata"]["namespace"], "events", "")
        return self.inner.events(run)

    def log_tail(self, namespace: str, pod: str, lines: int) -> list[str]:
        self.need("get", namespace, "pods", "", "log")
        return self.inner.log_tail(namespace, pod, lines)

    def archive(self, namespace: str, name: str, uid: str | None = None) -> Archive:
        if not self._may_read_registry(namespace):
            return Archive(note="the run's archive: not allowed (get modelversions)")
        return self.inner.archive(namespace, name, uid)

    def archived_file(
        self, namespace: str, name: str, path: str, uid: str | None = None
    ) -> Download:
        self.need("get", namespace, "modelversions")
        return self.inner.archived_file(namespace, name, path, uid)

    def _may_read_registry(self, namespace: str) -> bool:
        """The registry's rule for a run's archive and records: get on modelversions in
        their namespace."""
        return self.reviews.may(self.user, "get", namespace, "modelversions", wire.GROUP, "")

    def record_page(self, namespace: str, query: Query) -> Page:
        """(Beside a list the caller may read: without the right, a note, not a refusal.)"""
        if not self._may_read_registry(namespace):
            raise Unavailable(f"not allowed (get modelversions in {namespace})")
        return self.inner.record_page(namespace, query)

    def record(self, namespace: str, name: str, uid: str | None, kind: str) -> Record | None:
        self.need("get", namespace, "modelversions")
        return self.inner.record(namespace, name, uid, kind)

    def record_metrics(self, namespace: str, name: str, uid: str) -> list[str]:
        self.need("get", namespace, "modelversions")
        return self.inner.record_metrics(namespace, name, uid)

    def sweeps(self, namespace: str) -> list[Obj]:
        self.need("list", namespace, "sweeps")
        return self.inner.sweeps(namespace)

    def sweep(self, namespace: str, name: str) -> tuple[Obj, list[sweep_sdk.Trial]] | None:
        self.need("get", namespace, "sweeps")
        self.need("get", namespace, "configmaps", "")  # (its ledger of trials)
        return self.inner.sweep(namespace, name)

    def models(self, namespace: str) -> list[Obj]:
        self.need("list", namespace, "modelversions")
        return self.inner.models(namespace)

    def environments(self, namespace: str) -> list[Obj]:
        self.need("list", namespace, "environments")
        return self.inner.environments(namespace)

    def environment(self, namespace: str, name: str) -> Obj | None:
        self.need("get", namespace, "environments")
        return self.inner.environment(namespace, name)

    def endpoints(self, namespace: str) -> list[Obj]:
        self.need("list", namespace, "onlineendpoints")
        return self.inner.endpoints(namespace)

    def endpoint(self, namespace: str, name: str) -> tuple[Obj, list[Obj]] | None:
        self.need("get", namespace, "onlineendpoints")
        self.need("list", namespace, "pods", "")
        return self.inner.endpoint(namespace, name)

    def build_log(self, namespace: str, job: str, lines: int) -> list[str]:
        self.need("get", namespace, "pods", "", "log")
        return self.inner.build_log(namespace, job, lines)

    def queue(self, namespace: str) -> Queue:
        self.need("list", namespace, "trainingruns")
        queue = self.inner.queue(namespace)
        if not self.reviews.may(self.user, "list", "", "nodes", "", ""):
            return Queue([], queue.waiting, "pools: this token may not list nodes")
        return queue

    def act(self, namespace: str, kind: str, name: str, action: str) -> None:
        self.need("patch", namespace, "trainingruns" if kind == "runs" else "sweeps")
        self.inner.act(namespace, kind, name, action)
