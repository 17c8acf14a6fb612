"""Whether a local run resumes (``local.attempts``): a table of the last attempt's outcome,
the newest complete checkpoint and ``--fresh`` / ``--resume``, and the marker beside the
checkpoint folder. (Through the CLI: tests/unit/cli/test_local_resume.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from torchyard.local import attempts
from torchyard.local.attempts import Attempt

FOLDER = Path("/ckpt/default/ddp")
AT = "2026-03-01T12:00:00Z"

RESUMED = f"resuming from step 40 of the attempt at {AT} (interrupted); --fresh starts over"
FRESH = f"the attempt at {AT} succeeded: starting fresh at step 0"
# (last attempt's outcome or None, newest step, mode) -> (resume, set aside, said)
TABLE = [
    (None, None, "auto", False, False, "none yet, starting at step 0"),
    ("Succeeded", None, "auto", False, False, "none yet"),
    ("Interrupted", 40, "auto", True, False, RESUMED),
    ("Failed", 40, "auto", True, False, "(failed); --fresh starts over"),
    ("Running", 40, "auto", True, False, "(it did not end)"),  # the CLI was killed
    (None, 40, "auto", True, False, "step 40 of an earlier attempt (outcome unknown)"),
    ("Succeeded", 60, "auto", False, True, FRESH),
    ("Succeeded", 60, "resume", True, False, "resuming from step 60"),
    ("Interrupted", 40, "fresh", False, True, "--fresh: starting over at step 0"),
    (None, None, "resume", False, False, "(--resume: nothing to resume from)"),
]


@pytest.mark.parametrize(("outcome", "step", "mode", "resume", "aside", "said"), TABLE)
def test_what_the_next_attempt_does(
    outcome: str | None,
    step: int | None,
    mode: attempts.Resume,
    resume: bool,
    aside: bool,
    said: str,
) -> None:
    previous = Attempt("ddp", AT, outcome) if outcome else None
    decision = attempts.decide(previous, step, mode, FOLDER)
    assert (decision.resume, decision.set_aside) == (resume, aside)
    assert said in decision.message, decision.message
    assert str(FOLDER) in decision.message  # the checkpoints' folder is always named
    if aside:
        assert f"{FOLDER}.previous" in decision.message


def test_the_marker_sits_beside_the_folder_and_a_set_aside_replaces_the_last(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "default" / "ddp"
    assert attempts.read(folder) is None
    attempts.write(folder, Attempt("ddp", AT, "Running"))
    assert attempts.read(folder) == Attempt("ddp", AT, "Running")
    assert (tmp_path / "default" / "ddp.attempt.json").is_file()
    for generation in ("first", "second"):
        folder.mkdir()
        (folder / "step-1").mkdir()
        (folder / "step-1" / "w").write_text(generation)
        moved = attempts.set_aside(folder)
        assert not folder.exists()
        assert (moved / "step-1" / "w").read_text() == generation
    (tmp_path / "default" / "ddp.attempt.json").write_text("not json")
    assert attempts.read(folder) is None


def test_the_newest_step_counts_a_save_every_rank_finished_after_node_0_stopped(
    tmp_path: Path,
) -> None:
    """Node 0's launcher may end before a slower node's ranks said they were done with the
    last step; the step that decides is the one the next launcher will resume from."""
    from torchyard import checkpoint

    folder = tmp_path / "ckpt"
    for step in (5, 10):
        for rank in (0, 1):
            path = Path(checkpoint.save_dir(step, str(folder)))
            (path / f"rank-{rank}.bin").write_text(f"{step}/{rank}")
            checkpoint.done(step, str(folder), rank=rank)
        if step == 5:
            assert checkpoint.finalize(step, 2, str(folder))
    assert checkpoint.latest(str(folder)) == str(folder / "step-5")  # step 10: no manifest yet
    assert attempts.newest_step(folder, 2) == 10
    assert attempts.newest_step(tmp_path / "none", 2) is None
