"""torchyard.checkpoint, the launcher's side and what the ranks tell it: which rank wrote
what, the periodic and the just-in-time save, the step and save timings, and
``NodeCheckpoints`` (progress, the target saved, what goes into the termination
message, the quarantine after attempts without progress), in this process. The
completeness contract: tests/unit/test_checkpoint.py; the real launcher with ranks that
use it: tests/unit/launcher/test_checkpoint_launcher.py."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.unit.checkpoint.test_checkpoint import complete, save
from torchyard import checkpoint


@pytest.fixture(autouse=True)
def no_rank_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", checkpoint.DIR_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    for name in (checkpoint.INTERVAL_VARIABLE, checkpoint.RESUME_STEP_VARIABLE):
        monkeypatch.delenv(name, raising=False)


# Which rank a file is from


@pytest.mark.parametrize(
    ("variables", "rank"),
    [
        ({}, 0),  # one process, no launcher variables
        ({"RANK": "3"}, 3),
        ({"OMPI_COMM_WORLD_RANK": "5"}, 5),  # under mpirun (distribution.type: mpi)
        ({"RANK": "2", "OMPI_COMM_WORLD_RANK": "7"}, 2),  # torchyard's RANK wins
        ({"RANK": "", "OMPI_COMM_WORLD_RANK": "6"}, 6),  # an empty RANK is no rank
    ],
)
def test_a_rank_is_named_by_rank_else_by_openmpi_else_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], rank: int
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    d = str(tmp_path)
    checkpoint.save_dir(1, d)
    assert checkpoint.done(1, d) == str(tmp_path / "step-1" / f"rank-{rank}.done")
    checkpoint.report(4, d)
    assert checkpoint.reported(d) == {rank: 4}


def test_done_says_so_with_an_empty_marker_once_the_files_are_there(tmp_path: Path) -> None:
    d = str(tmp_path)
    with pytest.raises(checkpoint.CheckpointError) as raised:
        checkpoint.done(3, d, rank=1)
    assert str(raised.value) == (
        f"{tmp_path / 'step-3'} does not exist: write the files into save_dir(3)"
    )
    Path(checkpoint.save_dir(3, d), "model.pt").write_bytes(b"m")
    marker = Path(checkpoint.done(3, d, rank=1))
    assert marker == tmp_path / "step-3" / "rank-1.done" and marker.read_bytes() == b""


@pytest.mark.parametrize(
    ("value", "step"), [(None, None), ("", None), ("latest", None), ("40", 40)]
)
def test_the_resumed_step_is_the_launchers_number_or_none(
    monkeypatch: pytest.MonkeyPatch, value: str | None, step: int | None
) -> None:
    if value is not None:
        monkeypatch.setenv(checkpoint.RESUME_STEP_VARIABLE, value)
    assert checkpoint.resume_step() == step


def test_a_rank_report_that_cannot_be_read_hides_no_other_ranks(tmp_path: Path) -> None:
    d = str(tmp_path)
    for rank in range(10):
        checkpoint.report(100 + rank, d, rank=rank)
    state = tmp_path / checkpoint.STATE_DIR
    for rank in range(10, 20):  # half-written, garbage, or not a file at all
        bad = state / f"rank-{rank}.step"
        if rank % 2:
            bad.write_text("" if rank % 4 == 1 else "twelve")
        else:
            bad.mkdir()
    (state / "rank-x.step").write_text("1")
    (state / "rank-0.step.123.tmp").write_text("1")  # another rank's report being written
    assert checkpoint.reported(d) == {rank: 100 + rank for rank in range(10)}


# When a rank saves: every N steps, and at the just-in-time target


@pytest.mark.parametrize(
    ("interval", "saved"),
    [
        ("1", [1, 2, 3, 4, 5, 6]),
        ("3", [3, 6]),
        ("0", []),  # no periodic saves
        ("", []),
        ("often", []),
        ("-2", []),
    ],
)
def test_periodic_saves_come_every_interval_steps_never_at_step_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interval: str, saved: list[int]
) -> None:
    monkeypatch.setenv(checkpoint.INTERVAL_VARIABLE, interval)
    assert [s for s in range(7) if checkpoint.should_save(s, str(tmp_path))] == saved


def test_should_save_reports_the_step_it_was_called_with(tmp_path: Path) -> None:
    d = str(tmp_path)
    checkpoint.should_save(17, d)
    assert checkpoint.reported(d) == {0: 17}
    assert checkpoint.request_save(d) == 18


def test_a_target_missed_moves_to_one_after_the_highest_step_reported(tmp_path: Path) -> None:
    d = str(tmp_path)
    checkpoint.report(10, d, rank=0)
    checkpoint.report(10, d, rank=1)
    assert checkpoint.request_save(d) == 11
    checkpoint.report(14, d, rank=0)  # went past 11 without saving it
    checkpoint.report(11, d, rank=1)
    assert checkpoint.request_save(d) == 15
    assert checkpoint.save_target(d) == 15


def test_the_just_in_time_path_judges_a_saved_target_by_size_not_by_hashing(
    tmp_path: Path,
) -> None:
    """A SIGTERM leaves seconds; hashing a large checkpoint takes minutes: the target and
    ``saved`` count a checkpoint complete by its files' sizes (resuming hashes them)."""
    d = str(tmp_path)
    checkpoint.report(4, d, rank=0)
    launcher = checkpoint.NodeCheckpoints(d, 0, 1)
    assert launcher.request() == 5
    path = complete(tmp_path, 5, world=1)
    (path / "shard-0.pt").write_bytes(b"WEIGHTS\x00")  # same size, other bytes
    checkpoint.report(6, d, rank=0)
    assert checkpoint.request_save(d) == 5
    assert launcher.saved()


def test_without_hard_links_the_first_launcher_still_sets_the_target_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some SMB/FUSE volumes have no hard links: an exclusive create instead."""

    def no_links(src: str, dst: str) -> None:
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(os, "link", no_links)
    d = str(tmp_path)
    for rank in range(2):
        checkpoint.report(8, d, rank=rank)
    assert checkpoint.request_save(d) == 9
    checkpoint.report(9, d, rank=0)  # a rank reported the target: it may be saving it
    assert checkpoint.request_save(d) == 9  # the next launcher agrees
    target = tmp_path / checkpoint.STATE_DIR / checkpoint.SAVE_AT
    assert target.read_text() == "9"
    assert sorted(p.name for p in target.parent.iterdir()) == [
        "rank-0.step",
        "rank-1.step",
        checkpoint.SAVE_AT,
    ]  # no temporary file left behind


# How long a step and a save take, as the ranks time them (the operator's warning that
# terminationGracePeriodSeconds is shorter than a step plus a save)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Clock]:
    """The ranks' timer on a clock the test moves."""
    ticking = Clock()
    monkeypatch.setattr(checkpoint, "_TIMER", checkpoint._Timer(clock=ticking))
    monkeypatch.chdir(tmp_path)  # where a timing in the wrong place would land
    yield ticking


def rank_loop(clock: Clock, d: str, steps: dict[int, float], saves: dict[int, float]) -> None:
    """A rank's loop: step ``s`` ends ``steps[s]`` seconds after the one before it, and a
    save it was asked for takes ``saves[s]`` seconds."""
    for step, seconds in steps.items():
        clock.now += seconds
        if checkpoint.should_save(step, d):
            checkpoint.save_dir(step, d)
            clock.now += saves[step]
            checkpoint.done(step, d)


def test_the_slowest_step_and_save_are_timed_without_the_saves_in_the_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    d = str(tmp_path / "run")
    monkeypatch.setenv(checkpoint.INTERVAL_VARIABLE, "2")
    assert checkpoint.timings(d) is None
    rank_loop(clock, d, {1: 9.0, 2: 0.5, 3: 0.25, 4: 0.75, 5: 0.5}, {2: 4.0, 4: 2.5})
    # step 1 (the warm-up) has nothing before it to be timed against; steps 3 and 5 do
    # not include the saves before them
    assert checkpoint.timings(d) == {"step": 0.75, "save": 4.0}
    assert sorted(os.listdir(tmp_path)) == ["run"]  # nothing beside the folder


def test_steps_skipped_between_two_calls_share_the_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    """A script that asks every 10 steps: each step took a tenth of the time."""
    d = str(tmp_path)
    monkeypatch.setenv(checkpoint.INTERVAL_VARIABLE, "20")
    rank_loop(clock, d, {10: 3.0, 20: 6.0, 30: 4.0}, {20: 1.5})
    assert checkpoint.timings(d) == {"step": 0.6, "save": 1.5}


def test_a_step_asked_about_again_or_a_save_not_asked_for_is_not_timed(
    tmp_path: Path, clock: Clock
) -> None:
    d = str(tmp_path)
    checkpoint.save_dir(0, d)
    checkpoint.done(0, d)  # a save the script decided on its own, before any step
    checkpoint.should_save(1, d)
    clock.now += 2.0
    checkpoint.should_save(2, d)
    clock.now += 5.0
    checkpoint.should_save(2, d)  # the same step again: no step of 5 s
    clock.now += 1.0
    checkpoint.should_save(3, d)
    assert checkpoint.timings(d) == {"step": 2.0, "save": 0.0}


def test_the_just_in_time_save_is_timed_too(tmp_path: Path, clock: Clock) -> None:
    d = str(tmp_path)
    checkpoint.report(6, d, rank=1)
    assert checkpoint.request_save(d) == 7
    rank_loop(clock, d, {6: 1.0, 7: 1.0}, {7: 12.5})
    assert checkpoint.timings(d) == {"step": 1.0, "save": 12.5}


def test_timings_are_the_slowest_of_every_rank_rounded_to_milliseconds(tmp_path: Path) -> None:
    d = str(tmp_path)
    state = tmp_path / checkpoint.STATE_DIR
    assert checkpoint.timings(d) is None  # no folder yet
    state.mkdir()
    files = {
        "rank-0.timing": {"step": 1.23456, "save": 3},
        "rank-1.timing": {"step": 2.5, "save": 0.5},
        "rank-2.timing": {"step": True, "save": "99"},  # not numbers: left out
        "rank-3.timing": [9, 9],
        "rank-4.timing.77.tmp": {"step": 50},  # being written
        "other.timing": {"step": 60},
        "rank-5.step": {"step": 70},
    }
    for name, body in files.items():
        (state / name).write_text(json.dumps(body))
    (state / "rank-6.timing").write_text("{half")
    (state / "rank-7.timing").mkdir()
    assert checkpoint.timings(d) == {"step": 2.5, "save": 3.0}
    (state / "rank-8.timing").write_text(json.dumps({"save": 4.00049}))
    assert checkpoint.timings(d) == {"step": 2.5, "save": 4.0}
    launcher = checkpoint.NodeCheckpoints(d, 0, 2)
    assert launcher.timings() == {"step": 2.5, "save": 4.0}


def test_a_timing_that_cannot_be_written_does_not_stop_training(
    tmp_path: Path, clock: Clock
) -> None:
    d = str(tmp_path)
    checkpoint.should_save(1, d)
    # a folder where the timing's temporary file goes
    (tmp_path / checkpoint.STATE_DIR / f"rank-0.timing.{os.getpid()}.tmp").mkdir()
    clock.now += 1.0
    assert checkpoint.should_save(2, d) is False  # no error
    assert checkpoint.timings(d) is None


# The launcher's NodeCheckpoints


def test_the_highest_step_any_rank_reported(tmp_path: Path) -> None:
    d = str(tmp_path)
    launcher = checkpoint.NodeCheckpoints(d, 0, 3)
    assert launcher.reported_step() is None
    for rank, step in ((0, 12), (1, 15), (2, 9)):
        checkpoint.report(step, d, rank=rank)
    assert launcher.reported_step() == 15


def test_saved_waits_for_a_complete_checkpoint_at_or_after_the_target(tmp_path: Path) -> None:
    d = str(tmp_path)
    launcher = checkpoint.NodeCheckpoints(d, 0, 1)
    assert launcher.request() is None and launcher.target is None  # no rank reports steps
    assert launcher.saved()  # nothing to wait for
    complete(tmp_path, 3, world=1)
    checkpoint.report(5, d, rank=0)
    assert launcher.request() == 6 and launcher.target == 6
    assert not launcher.saved()  # step 3 is older than the target
    save(tmp_path, 6, 1)
    assert not launcher.saved()  # every rank done, COMPLETE.json not written yet
    assert checkpoint.finalize(6, 1, d)
    assert launcher.saved()
    complete(tmp_path, 8, world=1)
    assert launcher.saved()


def resumed(
    tmp_path: Path, step: int, world: int = 1, **options: int
) -> checkpoint.NodeCheckpoints:
    """Node 0's launcher of an attempt that resumes from a complete checkpoint ``step``."""
    complete(tmp_path, step, world=world)
    launcher = checkpoint.NodeCheckpoints(str(tmp_path), 0, world, **options)
    env = launcher.start()
    assert env[checkpoint.RESUME_STEP_VARIABLE] == str(step)
    return launcher


def test_a_fresh_run_has_always_progressed(tmp_path: Path) -> None:
    launcher = checkpoint.NodeCheckpoints(str(tmp_path), 0, 1)
    launcher.start()
    assert launcher.progressed()
    assert launcher.stop(rank_failed=True) == {}
    assert checkpoint.quarantined(str(tmp_path)) == []


@pytest.mark.parametrize("how", ["reported", "saved"])
def test_an_attempt_progressed_once_a_rank_went_past_the_step_it_resumed_from(
    tmp_path: Path, how: str
) -> None:
    launcher = resumed(tmp_path, 10)
    checkpoint.report(10, str(tmp_path), rank=0)  # the resumed step again: no progress
    assert not launcher.progressed()
    if how == "reported":
        checkpoint.report(11, str(tmp_path), rank=0)
    else:
        complete(tmp_path, 11, world=1)
    assert launcher.progressed()
    info = launcher.stop(rank_failed=True)
    assert "quarantined" not in info and checkpoint.latest(str(tmp_path)) is not None


def test_the_termination_message_says_where_it_resumed_and_the_newest_checkpoint(
    tmp_path: Path,
) -> None:
    launcher = resumed(tmp_path, 10, world=2)
    save(tmp_path, 20, 2)  # every rank done: the launcher's last pass finalizes it
    save(tmp_path, 30, 1)  # one of two ranks: not complete
    assert launcher.stop(rank_failed=False) == {"resumedFrom": 10, "checkpointStep": 20}
    assert checkpoint.complete_steps(str(tmp_path)) == [10, 20]


def test_the_newest_checkpoint_at_exit_is_judged_by_size_not_by_hashing(tmp_path: Path) -> None:
    """The Pod is ending: its message names the newest checkpoint complete by size."""
    launcher = resumed(tmp_path, 10)
    path = complete(tmp_path, 20, world=1)
    (path / "shard-0.pt").write_bytes(b"WEIGHTS\x00")  # same size, other bytes
    assert launcher.stop(rank_failed=False)["checkpointStep"] == 20


def test_a_failure_before_any_progress_quarantines_the_checkpoint_it_resumed_from(
    tmp_path: Path,
) -> None:
    complete(tmp_path, 5, world=1)
    launcher = resumed(tmp_path, 10)
    info = launcher.stop(rank_failed=True)
    assert info == {"resumedFrom": 10, "checkpointStep": 10, "quarantined": "quarantine-step-10"}
    assert checkpoint.latest(str(tmp_path)) == str(tmp_path / "step-5")


def test_a_run_that_stops_without_failing_quarantines_nothing(tmp_path: Path) -> None:
    launcher = resumed(tmp_path, 10)
    assert launcher.stop(rank_failed=False) == {"resumedFrom": 10, "checkpointStep": 10}
    assert checkpoint.quarantined(str(tmp_path)) == []


def test_a_checkpoint_another_node_quarantined_first_is_not_quarantined_twice(
    tmp_path: Path,
) -> None:
    launcher = resumed(tmp_path, 10)
    assert checkpoint.quarantine(10, str(tmp_path)) == str(tmp_path / "quarantine-step-10")
    info = launcher.stop(rank_failed=True)
    assert info == {"resumedFrom": 10}
    assert checkpoint.quarantined(str(tmp_path)) == ["quarantine-step-10"]


def test_the_third_attempt_without_progress_says_no_progress_and_why(tmp_path: Path) -> None:
    """Each attempt resumed from the newest checkpoint and failed before a step: after
    ``max_without_progress`` of them (3), restarting again would not help."""
    said = []
    for step in (30, 20, 10):
        launcher = resumed(tmp_path, step)  # three, unless told otherwise
        said.append(launcher.stop(rank_failed=True))
    assert [info.get("reason") for info in said] == [None, None, checkpoint.NO_PROGRESS_REASON]
    assert said[-1]["message"] == (
        "3 attempts failed before making progress from their checkpoint (quarantined: "
        "quarantine-step-10, quarantine-step-20, quarantine-step-30): fix the error in the "
        "logs, or delete the quarantine-step-* folders to try them again"
    )
    assert checkpoint.latest(str(tmp_path)) is None


def test_node_0_writes_complete_json_while_the_ranks_run(tmp_path: Path) -> None:
    d = str(tmp_path)
    launcher = checkpoint.NodeCheckpoints(d, 0, 2, poll_seconds=0.01)
    launcher.start()
    try:
        save(tmp_path, 5, 2)
        wait_for("step 5's COMPLETE.json", lambda: checkpoint.complete_steps(d) == [5])
    finally:
        launcher.stop(rank_failed=False)


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_other_nodes_finalize_nothing(tmp_path: Path) -> None:
    """Only node 0's launcher writes COMPLETE.json (one writer per folder)."""
    d = str(tmp_path)
    save(tmp_path, 5, 2)
    launcher = checkpoint.NodeCheckpoints(d, 1, 2)
    launcher.start()
    assert launcher.stop(rank_failed=False) == {}
    assert checkpoint.complete_steps(d) == []


def test_finalizing_says_which_steps_it_completed_just_now(tmp_path: Path) -> None:
    d = str(tmp_path)
    launcher = checkpoint.NodeCheckpoints(d, 0, 2)
    complete(tmp_path, 1)
    save(tmp_path, 2, 2)
    save(tmp_path, 3, 1)  # one of two ranks
    dcp = Path(checkpoint.save_dir(4, d))  # a PyTorch DCP save whose ranks said done too
    (dcp / ".metadata").write_bytes(b"metadata")
    for rank in range(2):
        checkpoint.done(4, d, rank=rank)
    save(tmp_path, 5, 2)
    assert launcher.finalize_all() == [2, 5]
    assert launcher.finalize_all() == []
    assert not (dcp / checkpoint.COMPLETE).exists()
    assert checkpoint.complete_steps(d) == [1, 2, 4, 5]


def test_every_checkpoint_is_kept_unless_told_how_many(tmp_path: Path) -> None:
    d = str(tmp_path)
    for step in (1, 2, 3):
        save(tmp_path, step, 1)
    assert checkpoint.NodeCheckpoints(d, 0, 1).finalize_all() == [1, 2, 3]
    assert checkpoint.steps(d) == [1, 2, 3]


def test_the_newest_are_kept_once_a_new_checkpoint_is_complete_not_before(
    tmp_path: Path,
) -> None:
    """A launcher told to keep fewer than the folder holds deletes nothing until its
    attempt completes a checkpoint: an attempt that fails first still has them all."""
    d = str(tmp_path)
    for step in (1, 2, 3):
        complete(tmp_path, step, world=1)
    launcher = checkpoint.NodeCheckpoints(d, 0, 1, keep_newest=1)
    assert launcher.finalize_all() == []
    assert checkpoint.steps(d) == [1, 2, 3]
    save(tmp_path, 4, 1)
    assert launcher.finalize_all() == [4]
    assert checkpoint.steps(d) == [4]
    two = checkpoint.NodeCheckpoints(d, 0, 1, keep_newest=2)
    save(tmp_path, 5, 1)
    save(tmp_path, 6, 1)
    assert two.finalize_all() == [5, 6]
    assert checkpoint.steps(d) == [5, 6]


def test_a_fresh_attempt_drops_every_unfinished_save_and_only_the_link_to_one(
    tmp_path: Path,
) -> None:
    """No complete checkpoint: every save there is unfinished, step 0 too."""
    d = str(tmp_path)
    for step in (0, 1, 7):
        save(tmp_path, step, 1)
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    elsewhere.mkdir()
    (tmp_path / "step-9").symlink_to(elsewhere)
    launcher = checkpoint.NodeCheckpoints(d, 0, 2)
    assert launcher.drop_unfinished() == [0, 1, 7, 9]
    assert checkpoint.steps(d) == [] and elsewhere.is_dir()


def test_without_an_attempt_other_nodes_do_not_wait_for_node_0(tmp_path: Path) -> None:
    launcher = checkpoint.NodeCheckpoints(str(tmp_path), 1, 2, wait_seconds=0)
    assert launcher.start() == {checkpoint.DIR_VARIABLE: str(tmp_path)}


def test_a_node_that_node_0_never_prepared_for_says_what_to_check(tmp_path: Path) -> None:
    launcher = checkpoint.NodeCheckpoints(str(tmp_path), 1, 2, attempt="uid-7", wait_seconds=0)
    said = (
        f"node 0's launcher did not prepare the checkpoint folder {tmp_path} for attempt "
        "uid-7 within 0s: is node 0's Pod running, and does every node mount the same "
        "(ReadWriteMany) volume?"
    )
    with pytest.raises(checkpoint.CheckpointError) as raised:
        launcher.start()
    assert str(raised.value) == said


def test_a_checkpoint_folder_that_cannot_be_made_says_what_to_check(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    folder = tmp_path / "file" / "checkpoints"
    with pytest.raises(checkpoint.CheckpointError) as raised:
        checkpoint.NodeCheckpoints(str(folder), 0, 1).start()
    assert str(raised.value) == (
        f"cannot create the checkpoint folder {folder} (Not a directory): is "
        "spec.checkpoints' volume mounted and writable by the run's user?"
    )
