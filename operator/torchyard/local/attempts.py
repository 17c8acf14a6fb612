"""Whether a local run resumes from its checkpoints, and saying so first.

A TrainingRun with ``spec.checkpoints`` keeps its checkpoints in a folder of this machine
that outlives each ``torchyard run --local`` (``LocalRun.checkpoint_dir``). Beside it,
``<folder>.attempt.json`` says how the last attempt that used the folder went: written
``Running`` when it starts (so an attempt whose CLI was killed reads as unfinished), then
``Succeeded``, ``Failed`` or ``Interrupted``. :func:`decide` (pure) turns that and the
newest complete checkpoint into what the next attempt does:

- an attempt that did not finish (interrupted, failed, killed) is resumed from;
- after one that succeeded the run starts fresh: its checkpoints are set aside (moved to
  ``<folder>.previous``, which the next set-aside replaces) so that the ranks see none;
- ``fresh`` always starts over, ``resume`` resumes even after a success.

Called by ``local.runs.LocalRun``; tested in tests/unit/local/test_attempts.py and through
the CLI in tests/unit/cli/test_local_resume.py.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from torchyard import checkpoint

Resume = Literal["auto", "fresh", "resume"]
RESUME_MODES: tuple[Resume, ...] = ("auto", "fresh", "resume")
UNFINISHED = ("Running", "Failed", "Interrupted")


@dataclass(frozen=True)
class Attempt:
    """One attempt of a run that used the checkpoint folder."""

    run: str
    started: str  # RFC 3339, UTC
    outcome: str  # Running (not ended, or killed), Succeeded, Failed, Interrupted
    ended: str | None = None
    step: int | None = None  # the newest complete checkpoint when it ended


@dataclass(frozen=True)
class Decision:
    """What the next attempt does with the checkpoints: resume from ``step``, or set them
    aside (``set_aside``) and start at step 0; ``message`` says so."""

    resume: bool
    step: int | None
    set_aside: bool
    message: str


def marker(folder: Path) -> Path:
    return folder.with_name(folder.name + ".attempt.json")


def aside(folder: Path) -> Path:
    return folder.with_name(folder.name + ".previous")


def read(folder: Path) -> Attempt | None:
    """The last attempt recorded beside ``folder`` (None: none, or unreadable)."""
    try:
        raw = json.loads(marker(folder).read_text())
        return Attempt(**{k: raw[k] for k in raw if k in Attempt.__dataclass_fields__})
    except (OSError, ValueError, TypeError):
        return None


def write(folder: Path, attempt: Attempt) -> None:
    path = marker(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(asdict(attempt), indent=2))
    tmp.replace(path)


def newest_step(folder: Path, world_size: int) -> int | None:
    """The step of the newest complete checkpoint in ``folder`` (None: none), once every
    step all ``world_size`` ranks are done with is marked complete, as node 0's launcher
    does when it starts: its last pass may have come before a slower node's ranks were
    done (only called while no node of the run is running)."""
    if not folder.is_dir():
        return None
    checkpoint.NodeCheckpoints(str(folder), 0, world_size).finalize_all()
    found = checkpoint.latest(str(folder), verify=False)
    return checkpoint.step_of(Path(found).name) if found else None


def _when(attempt: Attempt | None) -> str:
    if attempt is None:
        return "an earlier attempt"
    return f"the attempt at {attempt.started}"


def decide(previous: Attempt | None, step: int | None, mode: Resume, folder: Path) -> Decision:
    """What the next attempt does (see the module docstring)."""
    where = f"checkpoints in {folder}"
    if step is None:
        note = " (--resume: nothing to resume from)" if mode == "resume" else ""
        return Decision(False, None, False, f"{where}: none yet, starting at step 0{note}")
    outcome = previous.outcome.lower() if previous is not None else "outcome unknown"
    if previous is not None and previous.outcome == "Running":
        outcome = "it did not end"
    said = f"step {step} of {_when(previous)} ({outcome})"
    if mode == "fresh":
        return Decision(
            False,
            step,
            True,
            f"--fresh: starting over at step 0; the {where} (up to step {step}) move to "
            f"{aside(folder)}",
        )
    finished = previous is not None and previous.outcome == "Succeeded"
    if finished and mode == "auto":
        return Decision(
            False,
            step,
            True,
            f"{_when(previous)} succeeded: starting fresh at step 0; its {where} (up to "
            f"step {step}) move to {aside(folder)} (--resume continues from them instead)",
        )
    return Decision(True, step, False, f"resuming from {said}; --fresh starts over ({where})")


def set_aside(folder: Path) -> Path:
    """Move the checkpoints out of the way (replacing an earlier set-aside)."""
    target = aside(folder)
    if target.exists():
        shutil.rmtree(target)
    folder.rename(target)
    return target


__all__ = [
    "RESUME_MODES",
    "Attempt",
    "Decision",
    "Resume",
    "decide",
    "newest_step",
    "read",
    "set_aside",
    "write",
]
