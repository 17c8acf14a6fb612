"""The ETA's accuracy, with a synthetic clock: a steady run (steps that vary around their
mean, after a long first step) reported through the launcher's ``ProgressTracker`` and
merged by ``status.steps``: from 10 % of the run on, the ETA is within 10 % of the time
that is really left. Through the real launcher (the rate it timed, the ETA from it):
tests/e2e/test_eta.py."""

from __future__ import annotations

import random
from datetime import datetime, timezone
from pathlib import Path

import pytest

from torchyard.launch.tracker import ProgressTracker
from torchyard.status import steps


@pytest.mark.parametrize("jitter", [0.0, 0.2, 0.5])
def test_after_a_tenth_of_a_steady_run_the_eta_is_within_ten_percent(
    tmp_path: Path, jitter: float
) -> None:
    total, mean, warm_up = 1000, 0.5, 40.0
    rng = random.Random(7)
    times = [1_800_000_000.0]
    for step in range(1, total + 1):
        times.append(
            times[-1] + (warm_up if step == 1 else mean * (1 + rng.uniform(-1, 1) * jitter))
        )
    clock = [times[0]]
    tracker = ProgressTracker(str(tmp_path), clock=lambda: clock[0])
    worst = 0.0
    for step in range(total):
        clock[0] = times[step]
        tracker.record(0, {"step": step, "total": total})
        if step < total // 10 or step % 50:
            continue
        # What the operator computes between two reports (its poll comes at any time).
        summary = tracker.summary()
        assert summary is not None
        now = times[step] + 0.25
        eta = steps.eta_seconds(
            summary["step"], summary["total"], summary["stepsPerSecond"], summary["time"], now
        )
        assert eta is not None
        left = times[-1] - now
        worst = max(worst, abs(eta - left) / left)
        shown = steps.run_progress([summary], datetime.fromtimestamp(now, timezone.utc))
        assert shown is not None and shown["eta"] == steps.duration(eta)
    tracker.close()
    assert worst <= 0.10, worst
