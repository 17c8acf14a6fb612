"""``status.progress``: the launchers' summaries found in a log, merged over the nodes,
with the ETA arithmetic; and the final progress from the termination messages."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder, pod
from torchyard import api, status
from torchyard.status import steps
from torchyard.status.trainingruns import Observed

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
NOW = T0.timestamp()


def test_the_last_summary_in_a_log_is_found_among_the_ranks_lines() -> None:
    log = [
        '[rank 0] @@torchyard {"step": 3}',
        '[torchyard] progress {"step": 3, "minStep": 2, "time": 1.0}',
        "[rank 1] some output",
        "[torchyard] progress {broken",
        '[torchyard] progress {"step": 9, "minStep": 8, "time": 2.0}',
        "[rank 0] Epoch 3",
    ]
    assert steps.summary_of_log(log) == {"step": 9, "minStep": 8, "time": 2.0}
    assert steps.summary_of_log(["[rank 0] hello"]) is None


@pytest.mark.parametrize(
    ("step", "total", "rate", "last", "expected"),
    [
        (300, 3000, 10.0, NOW, 270.0),  # 2700 steps at 10/s
        (300, 3000, 10.0, NOW - 20, 250.0),  # 20 s have passed since that step
        (3000, 3000, 10.0, NOW, 0.0),
        (3500, 3000, 10.0, NOW - 99, 0.0),  # never negative
        (300, None, 10.0, NOW, None),  # no total: no ETA
        (300, 3000, None, NOW, None),  # no speed yet
        (300, 3000, 0.0, NOW, None),
    ],
)
def test_eta(
    step: int, total: int | None, rate: float | None, last: float, expected: float | None
) -> None:
    assert steps.eta_seconds(step, total, rate, last, NOW) == expected


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (35.4, "35s"), (250, "4m10s"), (11100, "3h05m")]
)
def test_durations_read_short(seconds: float, text: str) -> None:
    assert steps.duration(seconds) == text


def test_nodes_merge_into_the_runs_progress() -> None:
    node0 = {
        "step": 300,
        "minStep": 297,
        "total": 3000,
        "stepsPerSecond": 10.0,
        "time": NOW - 5,
        "metrics": {"loss": 0.41, "lr": 0.1},
    }
    node1 = {"step": 310, "minStep": 290, "total": 3000, "stepsPerSecond": 12.0, "time": NOW - 1}
    assert steps.run_progress([node0, node1, None], T0) == {
        "step": 310,
        "total": 3000,
        "percent": 10,
        "stepsPerSecond": 12.0,  # the leading node's speed
        "eta": "3m43s",  # 2690 / 12 - 1 = 223.2 s
        "lastProgressTime": "2026-01-01T11:59:59Z",  # NOW - 1
        "slowestRankLag": 20,  # 310 - 290
        "metrics": {"loss": 0.41, "lr": 0.1},  # node 0's
    }
    assert steps.run_progress([None, {}], T0) is None


def finished(node: int, summary: dict[str, Any] | None) -> dict[str, Any]:
    message = {"nodeRank": node, "exitCode": 0, "reason": "Completed"}
    if summary is not None:
        message["progress"] = summary
    return pod("r", node, phase="Succeeded", exit_code=0, message=json.dumps(message))


def test_a_finished_run_keeps_the_progress_of_its_termination_messages() -> None:
    summary = {"step": 50, "minStep": 50, "total": 50, "stepsPerSecond": 5.0, "time": NOW}
    done = steps.final_progress([finished(0, summary), finished(1, None)], T0)
    assert done is not None
    assert (done["step"], done["percent"], done["eta"]) == (50, 100, "0s")
    # while a node still runs, the logs (not the termination messages) say it
    assert steps.final_progress([finished(0, summary), pod("r", 1, phase="Running")], T0) is None


def test_the_status_shows_the_read_progress_and_keeps_the_last_one() -> None:
    run = api.parse_trainingrun(TrainingRunBuilder("r").nodes(2).procs(2).obj())
    env = {"status": {"phase": "Ready", "image": "img"}}
    running = [pod("r", i, phase="Running", node_name="n") for i in range(2)]
    read = {"step": 7, "slowestRankLag": 0}
    first = status.trainingrun_status(
        run, Observed(environment=env, pods=running, progress=read), None, T0
    )
    assert first["progress"] == read
    # a reconcile that did not read the logs keeps what the last one read
    again = status.trainingrun_status(run, Observed(environment=env, pods=running), first, T0)
    assert again["progress"] == read
    # a run without any progress has none
    assert "progress" not in status.trainingrun_status(
        run, Observed(environment=env, pods=running), None, T0
    )
