"""``CheckpointAtRisk``: the grace period against the slowest step plus the slowest save
the ranks timed, as a table; the timings travel from the ranks (``torchyard.checkpoint``)
through the launchers' progress lines (``status.steps.run_progress``) into the status."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder, pod
from torchyard import api, checkpoint, status
from torchyard.status import checkpoint_risk, steps
from torchyard.status.trainingruns import Observed

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def run(grace: int = 30, checkpoints: bool = True) -> api.TrainingRun:
    builder = TrainingRunBuilder("r").with_("spec.policy.terminationGracePeriodSeconds", grace)
    if checkpoints:
        builder = builder.with_("spec.checkpoints", {"size": "1Gi"})
    return api.parse_trainingrun(builder.obj())


AT_RISK = ("True", "GracePeriodTooShort")
FINE = ("False", "GracePeriodSufficient")
CASES: list[tuple[str, api.TrainingRun, Any, tuple[str, str] | None]] = [
    ("no checkpoints: no condition", run(checkpoints=False), {"step": 50, "save": 50}, None),
    ("nothing timed yet: no condition", run(), None, None),
    ("step + save > grace: at risk", run(30), {"step": 12.5, "save": 20.0}, AT_RISK),
    ("a slow step alone > grace", run(30), {"step": 31.0}, AT_RISK),
    ("step + save <= grace: fine", run(30), {"step": 9.0, "save": 20.0}, FINE),
    ("nonsense values are ignored", run(30), {"step": "slow", "save": -1}, None),
]  # fmt: skip


@pytest.mark.parametrize(("case", "the_run", "timed", "expected"), CASES, ids=[c[0] for c in CASES])
def test_checkpoint_at_risk(
    case: str, the_run: api.TrainingRun, timed: Any, expected: tuple[str, str] | None
) -> None:
    progress = {"step": 10, "checkpointSeconds": timed} if timed is not None else {"step": 10}
    found = checkpoint_risk.condition(the_run, progress, 1)
    if expected is None:
        assert found is None
    else:
        assert found is not None and (found["status"], found["reason"]) == expected


def test_the_warning_says_what_to_set() -> None:
    found = checkpoint_risk.condition(
        run(30), {"checkpointSeconds": {"step": 12.5, "save": 20.0}}, 1
    )
    assert found is not None
    assert found["message"] == (
        "terminationGracePeriodSeconds (30s) is shorter than the slowest step (12.5s) plus the "
        "slowest save (20.0s) seen: a node Pod that is stopped may be killed before its "
        "just-in-time checkpoint is complete; set spec.policy.terminationGracePeriodSeconds "
        "to 45 or more (or save faster)"
    )


def test_the_nodes_timings_reach_status_progress_and_the_running_status() -> None:
    lines = [
        '[torchyard] progress {"step": 7, "checkpointSeconds": {"step": 4.0, "save": 30.0}}',
    ]
    other = ['[torchyard] progress {"step": 7, "checkpointSeconds": {"step": 6.0, "save": 2.0}}']
    nodes = [steps.summary_of_log(lines), steps.summary_of_log(other)]
    progress = steps.run_progress(nodes, T0)
    assert progress is not None
    assert progress["checkpointSeconds"] == {"step": 6.0, "save": 30.0}
    running = [pod("r", 0, phase="Running", node_name="n")]
    new = status.trainingrun_status(
        run(30),
        Observed(environment={"status": {"phase": "Ready"}}, pods=running, progress=progress),
        {},
        T0,
    )
    assert new["phase"] == "Running"
    found = {c["type"]: c for c in new["conditions"]}
    assert (found["CheckpointAtRisk"]["status"], found["CheckpointAtRisk"]["reason"]) == (
        "True",
        "GracePeriodTooShort",
    )
    # kstatus still reads the run's own progress, not the warning.
    assert found["Reconciling"]["reason"] == "AllNodesRunning"
    api.TrainingRunStatus.model_validate(new)  # the CRD's schema has the field


def test_ranks_time_their_steps_and_saves_and_the_launcher_reads_the_slowest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHYARD_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHYARD_CHECKPOINT_INTERVAL", "2")
    monkeypatch.setenv("RANK", "0")
    clock = [100.0]
    timer = checkpoint._Timer(clock=lambda: clock[0])
    monkeypatch.setattr(checkpoint, "_TIMER", timer)
    assert checkpoint.timings() is None
    assert not checkpoint.should_save(1)  # the first call only starts the clock
    clock[0] += 3.0  # step 2 took 3 s
    assert checkpoint.should_save(2)
    checkpoint.save_dir(2)
    clock[0] += 5.0  # saving step 2 took 5 s
    checkpoint.done(2)
    clock[0] += 2.0  # step 3 took 2 s: the save is not counted in it
    assert not checkpoint.should_save(3)
    assert checkpoint.timings() == {"step": 3.0, "save": 5.0}
    written = json.loads((tmp_path / ".torchyard" / "rank-0.timing").read_text())
    assert written == {"step": 3.0, "save": 5.0}
    node = checkpoint.NodeCheckpoints(str(tmp_path), 1, 1)
    assert node.timings() == {"step": 3.0, "save": 5.0}
    assert node.reported_step() == 3
