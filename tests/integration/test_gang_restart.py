"""A 64-node gang restart on the real control plane, counted: one Pod of a Running run
on a pool of 64 one-GPU KWOK nodes fails, and the gang comes back Running with exactly
64 new Pods, each created once, each old Pod deleted once, and one restart counted.

What the operator sends is counted by a spy on ``torchyard.k8s.rest.call`` (the one
function every request of the in-process operator goes through; each call still goes to
the apiserver); what the apiserver holds is seen by a watch on the namespace's Pods, so
a Pod deleted and created again under the same name counts twice.

It needs the harness's patched KWOK (tests/cluster/patches.py): stock KWOK v0.8.0 deletes
a Pod that is being deleted by its name, late, and so took some of the new Pods here.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from tests.cluster.harness import Cluster, Pool, node_manifest
from tests.conftest import InProcessOperator
from tests.integration.helpers import (
    finish_pod,
    launcher_message,
    run_pods,
    wait_event,
    wait_for,
    wait_status,
)
from torchyard import k8s
from torchyard.k8s import rest

N = 64
ATTEMPT = "torchyard.dev/attempt"


@pytest.fixture
def pool_64() -> Iterator[Pool]:
    """64 one-GPU KWOK nodes of this test's own."""
    pool = Pool(f"g{time.monotonic_ns() % 10**8}", nodes=N, gpus=1, cpu="16", memory="64Gi")
    for i in range(N):
        k8s.create(node_manifest(pool, i))

    def ready() -> bool:
        nodes = k8s.list_(k8s.NODES, label_selector=f"torchyard.dev/pool={pool.name}")
        ready = sum(
            any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
            for n in nodes
            if n.get("status", {}).get("conditions")
        )
        return ready == N

    wait_for("64 KWOK nodes Ready", ready, timeout=180)
    yield pool
    for i in range(N):
        k8s.delete(k8s.NODES, None, f"{pool.name}-{i}")


@dataclass
class Requests:
    """The in-process operator's Pod writes in one namespace, by (verb, Pod name)."""

    namespace: str
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, verb: str) -> Counter[str]:
        with self.lock:
            return Counter({name: n for (v, name), n in self.counts.items() if v == verb})


@pytest.fixture
def pod_writes(env: str, monkeypatch: pytest.MonkeyPatch) -> Requests:
    """Count every DELETE, PATCH (server-side apply) and POST (create) of a Pod in ``env``."""
    seen = Requests(env)
    prefix = f"/api/v1/namespaces/{env}/pods/"
    real = rest.call

    def spy(method: str, path: str, **kw: Any) -> Any:
        if (
            method in ("DELETE", "PATCH")
            and path.startswith(prefix)
            and "/" not in path[len(prefix) :]
        ):
            with seen.lock:
                seen.counts[(method, path[len(prefix) :])] += 1
        elif method == "POST" and path == prefix.rstrip("/"):  # a create, named in its body
            with seen.lock:
                seen.counts[(method, kw["body"]["metadata"]["name"])] += 1
        return real(method, path, **kw)

    monkeypatch.setattr(rest, "call", spy)
    return seen


class PodsSeen:
    """Every Pod the apiserver had in a namespace, by uid: (name, attempt label)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.pods: dict[str, tuple[str, str]] = {}
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True, name="pods-seen")

    def _run(self) -> None:
        # torchyard's own list-then-watch (raw JSON: no client models to build or refuse)
        version: str | None = None
        while not self.stopping.is_set():
            try:
                if version is None:
                    items, version = k8s.list_versioned(k8s.PODS, self.namespace)
                    self._note(items)
                stream = k8s.WatchStream(k8s.PODS, self.namespace, version, timeout_seconds=10)
                for events in stream:
                    self._note([pod for _, pod in events])
                    if self.stopping.is_set():
                        break
                version = stream.version
            except Exception:
                version = None  # expired: list again (a uid seen twice counts once)

    def _note(self, pods: list[dict[str, Any]]) -> None:
        with self.lock:
            for pod in pods:
                meta = pod.get("metadata") or {}
                labels = meta.get("labels") or {}
                self.pods[meta["uid"]] = (meta["name"], labels.get(ATTEMPT, ""))

    def of_attempt(self, attempt: str) -> dict[str, str]:
        """uid -> name of the Pods of ``attempt`` seen so far."""
        with self.lock:
            return {uid: name for uid, (name, a) in self.pods.items() if a == attempt}


@pytest.fixture
def pods_seen(env: str) -> Iterator[PodsSeen]:
    seen = PodsSeen(env)
    seen.thread.start()
    yield seen
    seen.stopping.set()
    seen.thread.join(15)


def all_running(ns: str, name: str, attempt: str) -> list[dict[str, Any]] | None:
    pods = [p for p in run_pods(ns, name) if not p["metadata"].get("deletionTimestamp")]
    ok = len(pods) == N and all(
        p["metadata"]["labels"].get(ATTEMPT) == attempt and p["status"].get("phase") == "Running"
        for p in pods
    )
    return pods if ok else None


def test_a_64_node_gang_restarts_once_with_one_write_per_pod(
    cluster: Cluster,
    env: str,
    pool_64: Pool,
    pod_writes: Requests,
    pods_seen: PodsSeen,
    operator: InProcessOperator,
) -> None:
    ns = env
    k8s.create(
        TrainingRunBuilder("gang", ns)
        .environment("pytorch")
        .nodes(N)
        .gpus(1)
        .pool(pool_64.name)
        .with_("spec.policy.backoffLimit", 3)
        .obj()
    )
    first = wait_for("64 Pods Running", lambda: all_running(ns, "gang", "0"), timeout=300)
    old = {p["metadata"]["uid"]: p["metadata"]["name"] for p in first}
    # one creation per Pod (the test's own watch may lag the list it polled)
    wait_for("the watch to see 64 Pods", lambda: len(pods_seen.of_attempt("0")) >= N, timeout=60)
    assert len(pods_seen.of_attempt("0")) == N
    before_deletes = pod_writes.of("DELETE")
    assert not before_deletes
    applied_before = pod_writes.of("PATCH") + pod_writes.of("POST")

    finish_pod(cluster, ns, "gang-63", 1, launcher_message(63, 63, "RuntimeError: boom"))
    again = wait_for(
        "64 Pods of attempt 1 Running", lambda: all_running(ns, "gang", "1"), timeout=300
    )
    assert not set(old) & {p["metadata"]["uid"] for p in again}
    assert {p["spec"]["nodeName"] for p in again} == {f"{pool_64.name}-{i}" for i in range(N)}

    # The attempt counter advanced exactly once, and one Restarting Event says so.
    status = wait_status(
        k8s.TRAININGRUNS,
        ns,
        "gang",
        lambda s: s.get("phase") == "Running" and s.get("nodes", {}).get("running") == N,
        timeout=120,
    )["status"]
    assert status["restarts"] == 1 and status["failedAttempts"] == 1
    events = wait_event(ns, "gang", "the Restarting Event", lambda e: e["reason"] == "Restarting")
    assert sum(e.get("count", 1) for e in events if e["reason"] == "Restarting") == 1

    # Let whatever the operator would still do happen, then count.
    wait_for(
        "the old Pods gone",
        lambda: not any(p["metadata"]["uid"] in old for p in run_pods(ns, "gang")),
        timeout=120,
    )
    # The operator has reconciled the run as it is now and nothing is due for it: any
    # further Pod write would need an event it has not had.
    operator.caught_up("TrainingRun", ns, "gang")
    created = pods_seen.of_attempt("1")
    assert len(created) == N, f"{len(created)} Pods of attempt 1 were created, not {N}"
    assert not pods_seen.of_attempt("2")
    deletes = pod_writes.of("DELETE")
    assert set(deletes) == set(old.values()), "every old Pod deleted by the operator"
    twice = {name: n for name, n in deletes.items() if n > 1}
    assert not twice, f"Pods deleted more than once: {twice}"
    # each new Pod written once: created (POST), or applied
    applies = pod_writes.of("PATCH") + pod_writes.of("POST") - applied_before
    assert set(applies) == set(old.values())
    again_applied = {name: n for name, n in applies.items() if n > 1}
    assert not again_applied, f"Pods written more than once after the failure: {again_applied}"
