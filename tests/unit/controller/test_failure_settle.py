"""``reconcile.trainingrun`` when one node Pod failed and the other still runs: it holds
the decision (no status, no Pods deleted) for the settle time, then names the rank that
exited first, whichever Pod reported first. Against an in-memory stand-in of the few
``torchyard.k8s`` calls this path makes (the real-cluster version is
tests/node/test_trainingruns.py)."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder, pod
from torchyard import k8s
from torchyard.controller import reconcile
from torchyard.status.trainingruns import FAILURE_SETTLE_SECONDS

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
UID = "uid-1"
ENV = {"metadata": {"name": "pytorch"}, "spec": {"image": "img"}, "status": {"phase": "Ready"}}


def node_pod(node: int, **state: Any) -> dict[str, Any]:
    p = pod("r", node, node_name="real-0", **state)
    p["metadata"].update(namespace="ns", ownerReferences=[{"uid": UID}])
    return p


def failed(node: int, rank: int, text: str, exited: float) -> dict[str, Any]:
    message = {
        "rank": rank,
        "nodeRank": node,
        "exitCode": 1,
        "reason": "Error",
        "message": f"Traceback (most recent call last):\n{text}",
        "exitedAt": exited,
    }
    return node_pod(
        node,
        phase="Failed",
        exit_code=1,
        message=json.dumps(message),
        finished_at="2026-01-01T12:00:00Z",
    )


class FakeK8s:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.statuses: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        monkeypatch.setattr(k8s, "list_", self.list_)
        monkeypatch.setattr(k8s, "get_or_none", lambda res, ns, name: ENV)
        monkeypatch.setattr(k8s, "apply_status", self.apply_status)
        monkeypatch.setattr(k8s, "record_event", lambda *a, **kw: None)
        monkeypatch.setattr(k8s, "delete", lambda res, ns, name, **kw: self.deleted.append(name))

    def list_(self, res: k8s.Resource, ns: str | None = None, **kw: Any) -> list[dict[str, Any]]:
        if res is k8s.PODS:
            return list(self.pods)
        return []

    def apply_status(self, manifest: dict[str, Any], **kw: Any) -> dict[str, Any]:
        self.statuses.append(manifest["status"])
        return manifest


def body() -> dict[str, Any]:
    run = TrainingRunBuilder("r", "ns").nodes(2).procs(2).pool("real").obj()
    run["metadata"].update(uid=UID, generation=1)
    run["status"] = {"phase": "Running", "startTime": "2026-01-01T11:59:00Z", "restarts": 0}
    return run


def reconcile_at(after: float) -> reconcile.Result:
    ctx = reconcile.Context(clock=lambda: T0 + timedelta(seconds=after))
    return reconcile.trainingrun(body(), logging.getLogger("test"), ctx)


def test_the_run_waits_for_the_other_node_then_names_the_rank_that_exited_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    t = T0.timestamp()
    peer = failed(0, 1, "RuntimeError: Connection closed by peer", t + 0.005)
    fake = FakeK8s(monkeypatch, [peer, node_pod(1, phase="Running")])
    result = reconcile_at(0.5)
    # the peer reported first, but node 1 still runs: nothing decided, nothing stopped
    assert result.requeue_after == pytest.approx(FAILURE_SETTLE_SECONDS - 0.5 + 0.005)
    assert fake.statuses == [] and fake.deleted == []

    # node 1 reports: its rank 3 exited before the peer lost it
    fake.pods = [peer, failed(1, 3, "RuntimeError: rank 3 failed on purpose", t)]
    reconcile_at(1.0)
    [status] = fake.statuses
    assert status["phase"] == "Failed"
    assert (status["failure"]["rank"], status["failure"]["node"]) == (3, 1)
    assert status["failure"]["message"].endswith("rank 3 failed on purpose")


def test_once_the_settle_time_is_over_the_first_failure_seen_decides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    t = T0.timestamp()
    peer = failed(0, 1, "RuntimeError: Connection closed by peer", t)
    fake = FakeK8s(monkeypatch, [peer, node_pod(1, phase="Running")])
    reconcile_at(FAILURE_SETTLE_SECONDS + 0.1)
    [status] = fake.statuses
    assert status["phase"] == "Failed" and status["failure"]["rank"] == 1
    assert fake.deleted == ["r-1"]  # the survivor is stopped
