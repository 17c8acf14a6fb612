"""Stall detection in the launcher, over real rank processes: a rank that stops making
progress (sleeping, or blocked in a C call) past the stall timeout is named with its
file:line, every rank's stacks are written by faulthandler (no ptrace) to logs/stacks/,
and the node fails with reason Stalled."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults import stalling
from tests.unit.launcher.test_launcher import launch, termination
from torchyard.launch import stalls
from torchyard.launch.tracker import ProgressTracker

STUCK = {
    "sleeps": "time.sleep(3600)",
    "pauses": "while True: signal.pause()",  # blocked in a C call
}


def script(stuck: str) -> str:
    return stalling(stuck, 0.1)


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
    # The stalled ranks' places, for the operator's choice across nodes; the message is
    # the termination message's own, not repeated in the stall record.
    [suspect] = stall["suspects"]
    assert (suspect["rank"], suspect["step"], suspect["inCollective"]) == (1, 3, False)
    assert (Path(suspect["file"]).name, suspect["line"]) == ("child.py", 7), suspect
    assert "message" not in stall
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
    tracker = ProgressTracker("/nonexistent", clock=lambda: 0.0)
    assert tracker.stalled([0], 1000.0, None, 10) is None  # nothing reported


def test_the_adaptive_timeout_is_five_slowest_steps_over_a_floor(tmp_path: Path) -> None:
    now = [0.0]
    tracker = ProgressTracker(str(tmp_path), clock=lambda: now[0])
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
    assert stalls.stack_top(dump) == ("/workspace/train.py", 88, "train_step")
    assert stalls.stack_top("nothing") is None


def tracked(tmp_path: Path) -> tuple[ProgressTracker, list[float]]:
    """Ranks 0 and 1 that made steps 0..3, one a second (a timed step: adaptive works)."""
    now = [0.0]
    tracker = ProgressTracker(str(tmp_path), clock=lambda: now[0])
    for step in range(4):
        now[0] = float(step)
        tracker.record(0, {"step": step})
        tracker.record(1, {"step": step})
    return tracker, now


def test_a_rank_that_says_it_saves_gets_the_saving_budget_from_when_it_said_so(
    tmp_path: Path,
) -> None:
    tracker, now = tracked(tmp_path)
    now[0] = 10.0
    tracker.record(1, {"step": 3, "phase": "saving"})
    assert tracker.phase_of(1) == "saving" and tracker.phase_of(0) is None
    budgets = {"saving": 30.0}
    # The stall timeout (5 s) alone would name rank 1 at 3 + 5 s; its budget counts from 10 s,
    # and its node's rank 0 (which waits for it) gets that budget too.
    assert tracker.stalled([0, 1], 39.0, 5.0, 300, budgets) is None
    assert tracker.stalled([0, 1], 41.0, 5.0, 300, budgets) == (1, 31.0, 3, 30.0)
    # The default budgets without policy.stallBudgets.
    assert tracker.stalled([0, 1], 10.0 + 1799, 5.0, 300) is None
    assert tracker.stalled([0, 1], 10.0 + 1801, 5.0, 300) == (1, 1801.0, 3, 1800.0)


def test_a_higher_step_or_training_ends_the_phase(tmp_path: Path) -> None:
    tracker, now = tracked(tmp_path)
    now[0] = 10.0
    tracker.record(0, {"step": 3, "phase": "evaluating"})
    tracker.record(1, {"step": 3, "phase": "initialising"})  # either spelling
    assert (tracker.phase_of(0), tracker.phase_of(1)) == ("evaluating", "initializing")
    now[0] = 11.0
    tracker.record(0, {"step": 4})
    tracker.record(1, {"step": 3, "phase": "training"})
    assert (tracker.phase_of(0), tracker.phase_of(1)) == (None, None)
    # Saying "training" restarts its step clock; the step that ended a phase is no step
    # of the adaptive timeout (it holds the evaluation).
    assert tracker.stalled([0, 1], 11.0 + 6, 5.0, 300) == (1, 6.0, 3, 5.0)
    assert tracker.slowest_step == 1.0
    assert "phase" not in tracker.metrics()  # a phase is no metric


def test_the_same_phase_said_again_keeps_its_start(tmp_path: Path) -> None:
    tracker, now = tracked(tmp_path)
    now[0] = 10.0
    tracker.record(1, {"step": 3, "phase": "saving"})
    now[0] = 20.0
    tracker.record(1, {"step": 3, "phase": "saving"})
    assert tracker.stalled([0, 1], 41.0, 5.0, 300, {"saving": 30.0}) == (1, 31.0, 3, 30.0)


def test_stall_budgets_from_the_environment_keep_only_known_phases() -> None:
    assert stalls.stall_budgets('{"saving": 600, "evaluating": 7200}') == {
        "saving": 600.0,
        "evaluating": 7200.0,
    }
    assert stalls.stall_budgets('{"lunch": 5, "saving": -1, "initializing": true}') == {}
    assert stalls.stall_budgets("") == stalls.stall_budgets("not json") == {}


def dump(*frames: tuple[str, int, str]) -> str:
    """A faulthandler dump of the interrupted thread, innermost frame first."""
    lines = ["Current thread 0x00007f (most recent call first):"]
    lines += [f'  File "{file}", line {line} in {function}' for file, line, function in frames]
    return "\n".join(lines) + "\n"


LIB = "/usr/lib/python3/dist-packages/torch/distributed"
IN_ALL_REDUCE = dump(
    (f"{LIB}/distributed_c10d.py", 2501, "all_reduce"),
    (f"{LIB}/c10d_logger.py", 81, "wrapper"),
    ("/workspace/train.py", 14, "<module>"),
)
IN_BARRIER = dump(
    (f"{LIB}/distributed_c10d.py", 4210, "barrier"),
    ("/workspace/train.py", 18, "<module>"),
)
SLEEPING = dump(("/workspace/train.py", 12, "<module>"))


def test_the_rank_the_others_wait_for_is_named_by_the_stacks() -> None:
    # Idle longest is rank 0 (in all_reduce), but rank 1 sleeps outside any collective.
    assert stalls.culprit({0: IN_ALL_REDUCE, 1: SLEEPING, 2: IN_ALL_REDUCE}, [0, 1, 2], 0) == 1
    # Rank 1 skipped an all_reduce and waits in the barrier after the loop: the odd one out.
    stacks = {0: IN_ALL_REDUCE, 1: IN_BARRIER, 2: IN_ALL_REDUCE}
    assert stalls.culprit(stacks, [0, 1, 2], 0) == 1
    # Two ranks in two collectives: no majority; the one idle longest stays named.
    assert stalls.culprit({0: IN_ALL_REDUCE, 1: IN_BARRIER}, [0, 1], 0) == 0
    # A rank still making progress (not a suspect) is no culprit.
    assert stalls.culprit({0: IN_ALL_REDUCE, 1: SLEEPING}, [0], 0) == 0
    assert stalls.culprit({}, [0, 1], 1) == 1
    assert stalls.user_frame(IN_ALL_REDUCE) == ("/workspace/train.py", 14, "<module>")
    assert stalls.in_collective(IN_BARRIER) and not stalls.in_collective(SLEEPING)


TORCH = "/venv/lib/python3.11/site-packages/torch"
IN_BACKWARD = dump(  # DDP: the gradient all-reduce waits in the autograd engine's hooks
    (f"{TORCH}/autograd/graph.py", 1113, "_engine_run_backward"),
    (f"{TORCH}/autograd/__init__.py", 395, "backward"),
    (f"{TORCH}/_tensor.py", 623, "backward"),
    ("/workspace/train.py", 29, "<module>"),
)
IN_OWN_BACKWARD_CODE = dump(  # a custom autograd Function's backward: the rank's own code
    ("/workspace/model.py", 40, "backward"),
    (f"{TORCH}/autograd/function.py", 307, "apply"),
    ("/workspace/train.py", 29, "<module>"),
)


def test_a_ddp_rank_waiting_in_backward_waits_for_the_others() -> None:
    assert stalls.waiting_in(IN_BACKWARD) == "backward"
    assert stalls.waiting_in(IN_ALL_REDUCE) == "all_reduce"
    assert stalls.waiting_in(IN_BARRIER) == "barrier"
    for elsewhere in (SLEEPING, IN_OWN_BACKWARD_CODE, "", "no frames here"):
        assert stalls.waiting_in(elsewhere) is None
    # Rank 1 is stuck in its own line (a C call holding the GIL, a sleep, a lock) while the
    # others wait in loss.backward(): named, whoever has been idle longest.
    for first in (0, 1, 2):
        stacks = {0: IN_BACKWARD, 1: SLEEPING, 2: IN_BACKWARD}
        assert stalls.culprit(stacks, [0, 1, 2], first) == 1
    said = stalls.suspects_of({0: IN_BACKWARD}, [0], lambda r: 31.0, lambda r: 9)
    assert said == [
        {
            "rank": 0,
            "idle": 31.0,
            "step": 9,
            "inCollective": True,
            "collective": "backward",
            "file": "/workspace/train.py",
            "line": 29,
            "function": "<module>",
        }
    ]


EXITS = (
    "import atexit, sys, time, types\n"
    "marks = open(sys.argv[1], 'a')\n"
    "time.sleep = lambda seconds: marks.write(f'settled {seconds}\\n') or marks.flush()\n"
    "atexit.register(lambda: marks.write('script atexit\\n') or marks.flush())\n"
    "if sys.argv[2] != 'no-torch-distributed':\n"
    "    dist = sys.modules['torch.distributed'] = types.ModuleType('torch.distributed')\n"
    "    dist.is_initialized = lambda: sys.argv[2] == 'group-not-destroyed'\n"
    "if sys.argv[2] == 'raised':\n"
    "    raise RuntimeError('Connection closed by peer')\n"
)
SETTLES = {
    "group-destroyed": True,  # the clean end: dist.destroy_process_group(), then exit
    "group-not-destroyed": False,  # work may still be queued: its workers must not go on
    "raised": False,  # the script failed
    "no-torch-distributed": False,
}


@pytest.mark.parametrize("end", sorted(SETTLES))
def test_a_rank_that_ended_torch_distributed_cleanly_lets_its_workers_finish_before_it_exits(
    tmp_path: Path, end: str
) -> None:
    """The hook every rank runs holds the interpreter of a rank that destroyed its process
    group and ended well, the GIL released, after the script's own atexit handlers: a gloo
    worker still dropping its last collective's references must not meet a finalizing
    interpreter (SIGABRT, "terminate called without an active exception", after a run
    that ended well). Nothing waits otherwise."""
    import shutil
    import subprocess
    import sys

    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": ""}
    _, hook = stalls.install_stack_hook(env, str(tmp_path / "logs"))
    marks = tmp_path / "marks.txt"
    rank = tmp_path / "rank.py"
    rank.write_text(EXITS)
    try:
        done = subprocess.run([sys.executable, str(rank), str(marks), end], env=env)
    finally:
        shutil.rmtree(hook)
    assert done.returncode == (1 if end == "raised" else 0)
    settled = ["settled 0.2"] if SETTLES[end] else []
    assert marks.read_text().splitlines() == ["script atexit", *settled]
