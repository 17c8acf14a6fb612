"""The ETA of a steady run through ``torchyard run --local``: every progress summary the
launcher writes (``progress.jsonl``, what the run's progress line shows) gives the steps
left at the rate of the steps the launcher itself timed, as it kept them in the archived
``metrics.jsonl`` (each report with its time): the leading rank's steps from its second
report on, so that the warm-up before the first report is not counted. Checked against
those recorded times, not against the wall clock, so that a loaded machine cannot fail
it. The ETA's accuracy, with a synthetic clock: tests/unit/status/test_eta.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Local
from torchyard.status import steps

TOTAL = 60
HALF = TOTAL // 2
STEADY = f"""\
import os
import time
from torchyard import progress
time.sleep(2)  # a warm-up before the first report, which the rate leaves out
for step in range(1, {TOTAL} + 1):
    time.sleep(0.1)
    progress.report(step, total={TOTAL}, loss=1.0 / step)
    if step == {HALF}:  # until the launcher has said so (a summary mid-run, whatever the load)
        said = os.environ["TORCHYARD_PROGRESS_FILE"]
        while not os.path.exists(said) or '"step": {HALF},' not in open(said).read():
            time.sleep(0.1)
"""


def test_the_eta_is_the_steps_left_at_the_rate_the_launcher_timed_after_the_warm_up(
    local: Local, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHYARD_PROGRESS_INTERVAL", "1")  # a summary every second
    source = local.tmp / "src"
    source.mkdir()
    (source / "train.py").write_text(STEADY)
    run = {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "steady"},
        "spec": {
            "environment": "python",
            "source": {"configMap": "steady-src"},
            "command": ["python", "train.py"],
            "distribution": {"nodeCount": 1, "processCountPerNode": 1, "launch": "process"},
        },
    }
    path: Path = local.tmp / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    done = local.run(path, "--source", str(source))
    assert done.returncode == 0, done.stderr
    logs = local.registry / "default" / "runs" / "steady" / "logs" / "node-0"
    lines = (logs / "metrics.jsonl").read_text().splitlines()
    recorded = {r["step"]: r["time"] for r in map(json.loads, lines)}  # step -> when
    assert sorted(recorded) == list(range(1, TOTAL + 1))
    # local mode shows one progress line; the launcher's summaries behind it are in the
    # node's folder, one JSON a line (TORCHYARD_PROGRESS_FILE)
    (said,) = local.workdir.glob("*/node-0/progress.jsonl")
    summaries: list[dict[str, Any]] = [
        s for s in map(json.loads, said.read_text().splitlines()) if s and "stepsPerSecond" in s
    ]
    assert HALF in [s["step"] for s in summaries] and summaries[-1]["step"] == TOTAL, summaries
    first = recorded[2]  # the second report starts the clock: the warm-up is before it
    for summary in summaries:
        step = summary["step"]
        assert summary["time"] == recorded[step]  # when its last step was reported
        timed = (recorded[step] - first) / (step - 2)  # seconds a step, as recorded
        # the recorded times are rounded to 1 ms (and the rate to 6 decimals)
        slack = 0.001 / (step - 2) + 1e-6
        assert abs(1 / summary["stepsPerSecond"] - timed) <= slack, (summary, timed)
        eta = steps.eta_seconds(
            step, TOTAL, summary["stepsPerSecond"], summary["time"], summary["time"]
        )
        assert eta is not None
        assert abs(eta - (TOTAL - step) * timed) <= (TOTAL - step) * slack, (summary, eta)
