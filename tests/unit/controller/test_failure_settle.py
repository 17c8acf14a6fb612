"""``trainingruns.reconcile`` when one node Pod failed and the other still runs: it holds
the decision (no status, no Pods deleted) for the settle time, then names the rank that
exited first, whichever Pod reported first. Against the in-memory fake of
``torchyard.k8s`` (the real-cluster version is tests/node/test_trainingruns.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.controller.world import T0, env, gpu_node, node_pod, reconcile, run, status, world
from torchyard.status.failures import FAILURE_SETTLE_SECONDS

RUNNING = {"phase": "Running", "startTime": "2026-01-01T11:59:00Z", "restarts": 0}
NODE = gpu_node("real-0")  # where both node Pods run


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
        node_name="real-0",
        exit_code=1,
        message=json.dumps(message),
        finished_at="2026-01-01T12:00:00Z",
    )


def test_the_run_waits_for_the_other_node_then_names_the_rank_that_exited_first() -> None:
    t = T0.timestamp()
    peer = failed(0, 1, "RuntimeError: Connection closed by peer", t + 0.005)
    fake = world(
        run(status=RUNNING), env(), NODE, peer, node_pod(1, phase="Running", node_name="real-0")
    )
    result = reconcile(fake, at=0.5)
    # the peer reported first, but node 1 still runs: nothing decided, nothing stopped
    assert result.requeue_after == pytest.approx(FAILURE_SETTLE_SECONDS - 0.5 + 0.005)
    assert fake.statuses == [] and fake.deleted == []

    # node 1 reports: its rank 3 exited before the peer lost it
    fake.put(failed(1, 3, "RuntimeError: rank 3 failed on purpose", t))
    reconcile(fake, at=1.0)
    assert len(fake.statuses) == 1
    failure = status(fake)["failure"]
    assert status(fake)["phase"] == "Failed"
    assert (failure["rank"], failure["node"]) == (3, 1)
    assert failure["message"].endswith("rank 3 failed on purpose")


def test_once_the_settle_time_is_over_the_first_failure_seen_decides() -> None:
    t = T0.timestamp()
    peer = failed(0, 1, "RuntimeError: Connection closed by peer", t)
    fake = world(
        run(status=RUNNING), env(), NODE, peer, node_pod(1, phase="Running", node_name="real-0")
    )
    reconcile(fake, at=FAILURE_SETTLE_SECONDS + 0.1)
    assert len(fake.statuses) == 1
    assert status(fake)["phase"] == "Failed" and status(fake)["failure"]["rank"] == 1
    assert [name for _, name in fake.deleted] == ["r-1"]  # the survivor is stopped
