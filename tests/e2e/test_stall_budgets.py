"""Stall budgets of the phases, through ``torchyard run --local`` as a user runs it: a
rank that says it is saving (``progress.report(step, phase="saving")``) may take longer
than the stall timeout, up to ``policy.stallBudgets.saving``; past that it is named, with
the phase, as any stalled rank. The tracker's arithmetic is tested in
tests/unit/launcher/test_stalls.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.e2e.conftest import Local

SCRIPT = """\
import os, sys, time
from torchyard import progress
rank = int(os.environ["RANK"])
save_seconds = float(sys.argv[1])
saver = int(sys.argv[2])  # -1: every rank saves
for step in range(1, 6):
    progress.report(step, total=8)
    time.sleep(0.2)
if saver in (-1, rank):
    progress.phase("saving")
    time.sleep(save_seconds)  # a checkpoint save that takes longer than the stall timeout
    for step in range(6, 9):
        progress.report(step, total=8)
        time.sleep(0.2)
else:
    for step in range(6, 30):
        progress.report(step, total=30)
        time.sleep(0.2)
    time.sleep(3600)  # waits for the saver in a collective
"""


def write(local: Local, save_seconds: float, saver: int, budgets: dict[str, Any]) -> Path:
    source = local.tmp / "src"
    source.mkdir(exist_ok=True)
    (source / "train.py").write_text(SCRIPT)
    run = {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "saves"},
        "spec": {
            "environment": "python",
            "source": {"configMap": "saves-src"},
            "command": ["python", "train.py", str(save_seconds), str(saver)],
            "distribution": {"nodeCount": 1, "processCountPerNode": 2, "launch": "process"},
            "policy": {"stallTimeoutSeconds": 5, "stallBudgets": budgets},
        },
    }
    path = local.tmp / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    return path


def test_a_save_longer_than_the_stall_timeout_within_its_budget_is_no_stall(
    local: Local,
) -> None:
    done = local.run(write(local, 12, -1, {"saving": 60}), "--source", str(local.tmp / "src"))
    assert done.returncode == 0, done.stderr
    assert "Stalled" not in done.stderr


def test_a_save_past_its_budget_is_a_stall_naming_the_rank_and_the_phase(local: Local) -> None:
    done = local.run(write(local, 3600, 1, {"saving": 6}), "--source", str(local.tmp / "src"))
    assert done.returncode != 0
    assert "rank 1 (node 0) failed (Stalled" in done.stderr, done.stderr
    assert "(last step 5; stall budget while saving 6s): stuck at " in done.stderr
    assert "train.py:11 in <module>" in done.stderr  # time.sleep(save_seconds)
    assert set(local.archived_logs("saves")) == {0, 1}
