"""Local mode's terminal: one progress line a person reads (step, percent, rate, ETA,
metrics) instead of the launchers' JSON, redrawn in place on a terminal below the nodes'
output, a plain line at most every PLAIN_EVERY_SECONDS elsewhere; the launchers'
summaries are read as they append them, whole lines only."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from torchyard.local import console


@pytest.mark.parametrize(
    ("progress", "line"),
    [
        (None, ""),
        ({"step": 7}, "step 7"),
        (
            {"step": 120, "total": 3000, "percent": 4, "stepsPerSecond": 2.5, "eta": "19m12s"},
            "step 120/3000 4% | 2.5 steps/s | ETA 19m12s",
        ),
        (
            {"step": 3, "total": 4, "percent": 75, "metrics": {"loss": 0.041666, "acc": 0.5}},
            "step 3/4 75% | acc=0.5 loss=0.04167",
        ),
    ],
)
def test_the_progress_line_says_step_percent_rate_eta_and_metrics(
    progress: dict[str, object] | None, line: str
) -> None:
    assert console.progress_line(progress) == line


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_on_a_terminal_the_line_is_redrawn_in_place_below_the_output() -> None:
    status, out = io.StringIO(), io.StringIO()
    shown = console.Console(status, tty=True, width=80)
    shown.show("step 1/4 25%")
    shown.write(out, b"[rank 0] hello\n")
    shown.show("step 2/4 50%")
    shown.join()
    assert out.getvalue() == "[rank 0] hello\n"
    assert status.getvalue() == (
        f"{console.CLEAR}[torchyard] step 1/4 25%"
        f"{console.CLEAR}[torchyard] step 1/4 25%"  # cleared for the output, drawn again
        f"{console.CLEAR}[torchyard] step 2/4 50%\n"
    )


def test_elsewhere_a_plain_line_at_most_every_few_seconds() -> None:
    status, clock = io.StringIO(), Clock()
    shown = console.Console(status, tty=False, clock=clock)
    for second in range(25):
        clock.now = float(second)
        shown.show(f"step {second}")
    assert status.getvalue().splitlines() == [
        "[torchyard] step 0",
        "[torchyard] step 10",
        "[torchyard] step 20",
    ]


def test_the_relay_passes_every_line_of_a_launcher_through(tmp_path: Path) -> None:
    read, write = os.pipe()
    out = io.StringIO()
    shown = console.Console(io.StringIO(), tty=False)
    shown.relay(os.fdopen(read, "rb"), out)
    with os.fdopen(write, "wb") as pipe:
        for i in range(1000):
            pipe.write(b"[rank 0] line %d\n" % i)
        pipe.write(b"no newline")
    shown.join()
    assert out.getvalue().splitlines() == [f"[rank 0] line {i}" for i in range(1000)] + [
        "no newline"
    ]


def test_the_run_progress_merges_the_nodes_latest_whole_summaries(tmp_path: Path) -> None:
    files = {n: tmp_path / f"node-{n}.jsonl" for n in (0, 1)}
    summary = {"step": 5, "minStep": 4, "total": 10, "stepsPerSecond": 1.0, "time": 100.0}
    files[0].write_text(json.dumps(dict(summary, step=3)) + "\n" + json.dumps(summary) + "\n")
    files[1].write_text(json.dumps(dict(summary, step=6)) + "\n" + '{"step": 9, "tot')  # writing
    read = console.Progress({n: str(p) for n, p in files.items()})
    read.read()
    run = read.run(now=104.0)
    assert run is not None
    assert (run["step"], run["percent"], run["slowestRankLag"], run["eta"]) == (6, 60, 2, "0s")
    with files[1].open("a") as f:
        f.write('al": 10, "time": 105.0}\n')
    read.read()
    assert read.latest[1]["step"] == 9
