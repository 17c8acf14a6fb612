"""``torchyard get runs``: a Queued run's place in its pool's queue."""

from __future__ import annotations

from typing import Any

from torchyard.cli import inspect


def run(name: str, status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": "2026-01-01T12:00:00Z"},
        "spec": {"distribution": {"nodeCount": 2}},
        "status": status,
    }


def test_the_queue_column_shows_position_and_pool_of_queued_runs_only() -> None:
    rows = inspect._run_rows(
        [
            run("waiting", {"phase": "Queued", "queue": {"pool": "a100", "position": 3}}),
            run("going", {"phase": "Running", "nodes": {"ready": "2/2"}}),
        ],
        wide=False,
    )
    assert rows[0][:4] == ["NAME", "PHASE", "QUEUE", "NODES"]
    assert rows[1][:3] == ["waiting", "Queued", "3 (a100)"]
    assert rows[2][:3] == ["going", "Running", "-"]
