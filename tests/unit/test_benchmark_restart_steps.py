"""benchmarks/restart_steps.py: a gang restart's steps read from a watch on its Pods."""

from __future__ import annotations

from typing import Any

import pytest
from benchmarks import restart_steps

LABEL = "torchyard.dev/run"


def pod(
    uid: str, name: str, phase: str, *, deleting: bool = False, run: str = "r"
) -> dict[str, Any]:
    meta: dict[str, Any] = {"uid": uid, "name": name, "labels": {LABEL: run}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


def restarted_gang() -> restart_steps.PodLog:
    """Two Pods, ``a`` and ``b``, Running; ``b`` fails at 10.5; both go; ``a2`` and
    ``b2`` come under the same names and run."""
    log = restart_steps.PodLog(LABEL, "r")
    log.note("ADDED", pod("a", "r-0", "Running"), 1.0)
    log.note("ADDED", pod("b", "r-1", "Running"), 1.0)
    log.note("ADDED", pod("x", "other-0", "Running", run="other"), 1.0)  # another run's
    log.note("MODIFIED", pod("b", "r-1", "Failed"), 10.5)
    log.note("MODIFIED", pod("a", "r-0", "Running", deleting=True), 11.0)
    log.note("MODIFIED", pod("b", "r-1", "Failed", deleting=True), 11.1)
    log.note("DELETED", pod("a", "r-0", "Running", deleting=True), 11.4)
    log.note("DELETED", pod("b", "r-1", "Failed", deleting=True), 11.6)
    log.note("ADDED", pod("a2", "r-0", "Pending"), 12.0)
    log.note("ADDED", pod("b2", "r-1", "Pending"), 12.2)
    log.note("MODIFIED", pod("b2", "r-1", "Running"), 12.5)
    log.note("MODIFIED", pod("a2", "r-0", "Running"), 12.9)
    return log


def test_each_step_is_timed_from_the_failure_by_uid() -> None:
    log = restarted_gang()
    assert set(log.snapshot()) == {"a", "b", "a2", "b2"}
    got = restart_steps.steps(log.snapshot(), {"a", "b"}, "b", 2, started=10.0)
    assert got == pytest.approx(
        {
            "failed": 0.5,
            "deleting": 1.0,
            "old_gone": 1.6,
            "first_new": 2.0,
            "last_new": 2.2,
            "running": 2.9,
            "created": 2.0,
        }
    )


def test_a_pod_made_twice_is_counted_and_the_gang_runs_when_its_second_one_does() -> None:
    log = restarted_gang()
    # a stale delete of the old r-1 takes the new one (grace period 0: no deletion seen
    # before); r-1 is made a third time
    log.note("DELETED", pod("b2", "r-1", "Running"), 13.0)
    log.note("ADDED", pod("b3", "r-1", "Pending"), 13.2)
    log.note("MODIFIED", pod("b3", "r-1", "Running"), 13.8)
    got = restart_steps.steps(log.snapshot(), {"a", "b"}, "b", 2, started=10.0)
    assert got["created"] == 3.0
    assert got["last_new"] == pytest.approx(3.2)
    assert got["running"] == pytest.approx(3.8)


def test_a_restart_that_replaces_one_pod_runs_when_that_one_does() -> None:
    """A PyTorchJob replaces the failed Pod only: the kept one counts as Running."""
    log = restart_steps.PodLog(LABEL, "r")
    log.note("ADDED", pod("a", "r-0", "Running"), 1.0)
    log.note("ADDED", pod("b", "r-1", "Running"), 1.0)
    log.note("MODIFIED", pod("b", "r-1", "Failed"), 10.2)
    log.note("DELETED", pod("b", "r-1", "Failed"), 10.4)
    log.note("ADDED", pod("c", "r-1", "Pending"), 10.6)
    got = restart_steps.steps(log.snapshot(), {"a", "b"}, "b", 2, started=10.0)
    assert got["running"] is None  # not Running yet
    log.note("MODIFIED", pod("c", "r-1", "Running"), 11.0)
    got = restart_steps.steps(log.snapshot(), {"a", "b"}, "b", 2, started=10.0)
    assert got["deleting"] == pytest.approx(0.4) and got["old_gone"] == pytest.approx(0.4)
    assert got["running"] == pytest.approx(1.0) and got["created"] == 1.0


def test_the_report_prints_medians_and_the_steps_own_share() -> None:
    log = restarted_gang()
    rows = {"torchyard": [restart_steps.steps(log.snapshot(), {"a", "b"}, "b", 2, 10.0)]}
    lines: list[str] = []
    restart_steps.report(rows, 2, out=lines.append)
    assert "where a gang restart of N = 2 goes" in lines[0]
    assert lines[2].split() == [
        "torchyard", "0.50s", "1.00s", "1.60s", "2.00s", "2.20s", "2.90s", "2.00",
    ]  # fmt: skip
    assert lines[4].split() == ["torchyard", "0.50s", "0.60s", "0.40s", "0.20s", "0.70s"]
