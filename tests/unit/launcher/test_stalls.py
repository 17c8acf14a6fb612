"""Stall detection in the launcher, over real rank processes: a rank that stops making
progress (sleeping, or blocked in a C call) past the stall timeout is named with its
file:line, every rank's stacks are written by faulthandler (no ptrace) to logs/stacks/,
and the node fails with reason Stalled."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.launcher.test_launcher import launch, termination
from torchyard import launcher

STUCK = {
    "sleeps": "time.sleep(3600)",
    "pauses": "while True: signal.pause()",  # blocked in a C call
}


def script(stuck: str) -> str:
    return (
        "import os, signal, time\n"
        "from torchyard import progress\n"
        "rank = int(os.environ['RANK'])\n"
        "for step in range(1, 100000):\n"
        "    progress.report(step)\n"
        "    if rank == 1 and step == 3:\n"
        f"        {stuck}\n"
        "    time.sleep(0.1)\n"
    )


@pytest.mark.parametrize("how", sorted(STUCK))
def test_a_stalled_rank_is_named_with_its_line_and_every_stack_is_kept(
    tmp_path: Path, how: str
) -> None:
    done = launch(tmp_path, script(STUCK[how]), extra={"TORCHYARD_STALL_TIMEOUT": "3"})
    assert done.returncode != 0, done.stderr
    info = termination(tmp_path)
    assert (info["reason"], info["rank"], info["step"]) == ("Stalled", 1, 3), info
    stall = info["stall"]
    assert isinstance(stall, dict)
    assert (Path(stall["file"]).name, stall["line"]) == ("child.py", 7), stall
    assert stall["seconds"] >= 3
    assert "stuck at" in str(info["message"]) and "child.py" in str(info["message"])
    stacks = sorted(os.listdir(tmp_path / "logs" / "stacks"))
    assert [name.split(".")[0] for name in stacks] == ["rank-0", "rank-1"], stacks
    # rank 0 was running on: its stack is in its own loop, not at rank 1's line
    text = (tmp_path / "logs" / "stacks" / stacks[0]).read_text()
    assert 'child.py", line' in text


def test_a_run_that_never_stalled_archives_no_stack_files(tmp_path: Path) -> None:
    done = launch(tmp_path, "from torchyard import progress\nprogress.report(1)\n")
    assert done.returncode == 0, done.stderr
    # every rank had its (empty) stack file open while it ran; none is left behind
    assert not (tmp_path / "logs" / "stacks").exists(), os.listdir(tmp_path / "logs")


def test_without_a_timed_step_there_is_no_adaptive_timeout() -> None:
    tracker = launcher.ProgressTracker("/nonexistent", clock=lambda: 0.0)
    assert tracker.stalled([0], 1000.0, None, 10) is None  # nothing reported


def test_the_adaptive_timeout_is_five_slowest_steps_over_a_floor(tmp_path: Path) -> None:
    now = [0.0]
    tracker = launcher.ProgressTracker(str(tmp_path), clock=lambda: now[0])
    for t, step in ((0.0, 0), (50.0, 1), (60.0, 2), (90.0, 3)):  # warm-up, then 10 s, 30 s
        now[0] = t
        tracker.record(0, {"step": step})
        tracker.record(1, {"step": step})
    now[0] = 95.0
    tracker.record(0, {"step": 4})
    assert tracker.slowest_step == 30.0
    assert tracker.stalled([0, 1], 90.0 + 149, None, 60) is None  # 5 x 30 s = 150 s
    assert tracker.stalled([0, 1], 90.0 + 151, None, 60) == (1, 151.0, 3, 150.0)
    assert tracker.stalled([0, 1], 90.0 + 61, None, 400) is None  # the floor
    assert tracker.stalled([0, 1], 90.0 + 6, 5.0, 400) == (1, 6.0, 3, 5.0)  # fixed


def test_the_top_of_a_faulthandler_dump_is_the_interrupted_threads_innermost_frame() -> None:
    dump = (
        "Thread 0x00007f01 (most recent call first):\n"
        '  File "/usr/lib/python3/threading.py", line 331 in wait\n'
        "\n"
        "Current thread 0x00007f02 (most recent call first):\n"
        '  File "/workspace/train.py", line 88 in train_step\n'
        '  File "/workspace/train.py", line 120 in <module>\n'
    )
    assert launcher.stack_top(dump) == ("/workspace/train.py", 88, "train_step")
    assert launcher.stack_top("nothing") is None
