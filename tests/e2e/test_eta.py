"""The ETA of a steady run through ``torchyard run --local``: every progress summary the
launcher writes (``progress.jsonl``, what the run's progress line shows) from 10 % to 80 %
of the run predicts the end within 10 % of the time that was really left (the end: the
last record in the archived ``metrics.jsonl``). The arithmetic with a synthetic clock:
tests/unit/status/test_eta.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import Local
from torchyard.status import steps

TOTAL = 120
STEADY = f"""\
import time
from torchyard import progress
time.sleep(2)  # a warm-up the ETA must not count
for step in range(1, {TOTAL} + 1):
    time.sleep(0.1)
    progress.report(step, total={TOTAL}, loss=1.0 / step)
"""


def test_the_eta_after_a_tenth_of_a_steady_run_is_within_ten_percent(
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
    records = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    end = max(r["time"] for r in records if r["step"] == TOTAL)
    # local mode shows one progress line; the launcher's summaries behind it are in the
    # node's folder, one JSON a line (TORCHYARD_PROGRESS_FILE)
    (said,) = local.workdir.glob("*/node-0/progress.jsonl")
    summaries = [
        s
        for s in (json.loads(line) for line in said.read_text().splitlines())
        # from 10 % of the run to 80 % (near the end a few ms of a loaded machine's
        # scheduling are a large part of what is left)
        if s is not None and TOTAL // 10 <= s["step"] <= TOTAL * 8 // 10 and "stepsPerSecond" in s
    ]
    assert len(summaries) >= 4, done.stderr
    errors = []
    for summary in summaries:
        eta = steps.eta_seconds(
            summary["step"], TOTAL, summary["stepsPerSecond"], summary["time"], summary["time"]
        )
        assert eta is not None
        errors.append(abs(eta - (end - summary["time"])) / (end - summary["time"]))
    assert max(errors) <= 0.10, errors
