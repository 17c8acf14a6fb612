"""Progress lines: ``torchyard.progress`` writes them, the launcher reads them from every
rank as it tees their output, keeps them in logs/metrics.jsonl, the last metric values in
outputs/metrics.json, and says the node's progress on its log and in its termination
message."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from tests.unit.launcher.test_launcher import launch, termination
from torchyard import progress
from torchyard.launch import contract
from torchyard.launch.tracker import ProgressTracker


def test_report_prints_one_flushed_line_the_parser_reads_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    progress.report(120, total=3000, loss=0.41)
    progress.log("accuracy", 0.9)
    first, second = out.getvalue().splitlines()
    assert first == '@@torchyard {"step": 120, "total": 3000, "loss": 0.41}'
    assert progress.parse(first) == {"step": 120, "total": 3000, "loss": 0.41}
    assert progress.parse(second) == {"step": 120, "accuracy": 0.9}  # at the last step
    assert contract.parse_progress(first.encode()) == progress.parse(first)


@pytest.mark.parametrize(
    "text",
    [
        "loss 0.4",
        "@@torchyard not json",
        "@@torchyard [1, 2]",
        '@@torchyard {"loss": 1}',
        '@@torchyard {"step": -1}',
        '@@torchyard {"step": true}',
    ],
)
def test_lines_that_are_not_progress_are_ignored(text: str) -> None:
    assert progress.parse(text) is None
    assert contract.parse_progress(text.encode()) is None


def test_bad_arguments_say_what_is_wrong() -> None:
    with pytest.raises(TypeError, match="step must be a non-negative int"):
        progress.line(-1)
    with pytest.raises(TypeError, match="total must be a positive int"):
        progress.line(1, total=0)
    with pytest.raises(TypeError, match="loss must be a number"):
        progress.line(1, loss="high")
    assert progress.parse(progress.line(1, loss=float("nan"))) == {"step": 1, "loss": None}


def test_tracker_rates_from_the_second_report_and_names_the_lag(tmp_path: Path) -> None:
    now = [100.0]
    tracker = ProgressTracker(str(tmp_path), clock=lambda: now[0])
    tracker.record(0, {"step": 0, "total": 100, "loss": 2.0})  # warm-up: 30 s to step 0
    now[0] = 130.0
    tracker.record(0, {"step": 1, "loss": 1.5})
    tracker.record(1, {"step": 1, "loss": 9.0})
    now[0] = 140.0
    tracker.record(0, {"step": 11, "loss": 1.0})
    summary = tracker.summary()
    assert summary == {
        "step": 11,
        "minStep": 1,
        "total": 100,
        "stepsPerSecond": 1.0,  # (11 - 1) / (140 - 130): the warm-up is left out
        "time": 140.0,
        "metrics": {"loss": 1.0},  # rank 0's value wins over rank 1's
    }
    assert tracker.step_of(1) == 1 and tracker.step_of(7) is None
    tracker.close()
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["rank"], r["step"]) for r in records] == [(0, 0), (0, 1), (1, 1), (0, 11)]


def test_the_launcher_collects_every_ranks_progress(tmp_path: Path) -> None:
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "metrics.json").write_text('{"accuracy": 0.5}')
    script = (
        "import os, time\n"
        "from torchyard import progress\n"
        "rank = int(os.environ['RANK'])\n"
        "for step in range(1, 6 - 2 * rank):\n"
        "    progress.report(step, total=5, loss=1.0 / step + rank, accuracy=0.9)\n"
        "    time.sleep(0.3)\n"
        "print('@@torchyard {\"step\": 1, \"raw\": 7}' if rank else 'done', flush=True)\n"
    )
    done = launch(tmp_path, script, extra={"TORCHYARD_PROGRESS_INTERVAL": "1"})
    assert done.returncode == 0, done.stderr
    records = [
        json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().split("\n")[:-1]
    ]
    assert sorted((r["rank"], r["step"]) for r in records) == [
        (0, 1),
        (0, 2),
        (0, 3),
        (0, 4),
        (0, 5),
        (1, 1),
        (1, 1),
        (1, 2),
        (1, 3),
    ]
    # every record keeps the rank and when the launcher read it
    assert all(isinstance(r["time"], float) for r in records)
    info = termination(tmp_path)
    summary = info["progress"]
    assert isinstance(summary, dict)
    assert (summary["step"], summary["minStep"], summary["total"]) == (5, 3, 5)
    assert 0 < summary["stepsPerSecond"] < 10
    assert summary["metrics"]["loss"] == pytest.approx(0.2)
    # the last line on the log is the final summary, which the operator reads
    said = [x for x in done.stderr.splitlines() if x.startswith(contract.PROGRESS_LINE)]
    assert said and json.loads(said[-1][len(contract.PROGRESS_LINE) :]) == summary
    # the script's own outputs/metrics.json wins; the reported values fill it up
    assert json.loads((tmp_path / "outputs" / "metrics.json").read_text()) == {
        "accuracy": 0.5,
        "loss": pytest.approx(0.2),
        "raw": 7,
    }
    # the ranks' lines still reach the log unchanged
    assert '[rank 0] @@torchyard {"step": 5, "total": 5' in done.stdout


def test_a_failing_rank_reports_its_last_step(tmp_path: Path) -> None:
    script = (
        "import os\n"
        "from torchyard import progress\n"
        "progress.report(3)\n"
        "if os.environ['RANK'] == '1':\n"
        "    raise SystemExit(4)\n"
        "import time; time.sleep(30)\n"
    )
    done = launch(tmp_path, script)
    assert done.returncode == 4
    info = termination(tmp_path)
    assert info["rank"] == 1 and info["step"] == 3


def test_a_phase_goes_into_the_line_and_a_wrong_one_is_refused() -> None:
    assert progress.line(7, phase="saving") == '@@torchyard {"step": 7, "phase": "saving"}'
    with pytest.raises(ValueError, match="phase must be one of initializing, initialising"):
        progress.line(7, phase="lunch")


def test_phase_reports_the_last_step(capsys: pytest.CaptureFixture[str]) -> None:
    progress.report(12)
    progress.phase("evaluating")
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == '@@torchyard {"step": 12, "phase": "evaluating"}'


def test_under_launch_node_a_rank_says_who_it_is_and_the_tracker_keys_by_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TORCHYARD_LAUNCH", "node")
    monkeypatch.setenv("RANK", "5")
    progress.report(3, total=10)
    line = capsys.readouterr().out.splitlines()[-1]
    assert line == '@@torchyard {"step": 3, "total": 10, "rank": 5}'
    tracker = ProgressTracker(str(tmp_path), clock=lambda: 1.0)
    record = contract.parse_progress(line.encode())
    assert record is not None
    tracker.record(None, record)  # torchrun's output: one stream for all its ranks
    assert tracker.reported_ranks() == [5] and tracker.step_of(5) == 3
    assert "rank" not in tracker.metrics()
    tracker.close()


class CountingStream(io.StringIO):
    """A stdout that counts its flushes (each one is a write(2) on a real pipe)."""

    flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def test_a_report_that_says_nothing_new_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    out = CountingStream()
    monkeypatch.setattr(sys, "stdout", out)
    progress.report(7, total=10, loss=0.5)
    progress.report(7, total=10, loss=0.5)  # e.g. once per micro-batch of step 7
    progress.report(7, total=10, loss=0.25)
    progress.report(8, total=10, loss=0.25)
    assert out.getvalue().splitlines() == [
        '@@torchyard {"step": 7, "total": 10, "loss": 0.5}',
        '@@torchyard {"step": 7, "total": 10, "loss": 0.25}',
        '@@torchyard {"step": 8, "total": 10, "loss": 0.25}',
    ]
    assert out.flushes == 3
    # Another stream (stdout replaced) gets its line all the same.
    other = CountingStream()
    monkeypatch.setattr(sys, "stdout", other)
    progress.report(8, total=10, loss=0.25)
    assert other.flushes == 1
