"""Running a TrainingRun on this machine (``torchyard run FILE --local``), with exactly the
cluster's rank contract: the files a node gets, and the run itself.

:func:`collect_source` selects the files as ``torchyard submit`` snapshots a folder, less
the runs folder and the local registry when they lie inside it (else every run would copy
the ones before); secrets stay, since the copies stay on this machine. :func:`run` hands
them to ``torchyard.local``, which starts one launcher per node and archives outputs and
logs into the local registry; :func:`sweep` runs a Sweep's trials so (``local.sweeps``).
Called by ``torchyard.cli.local`` and ``torchyard.cli.sweeps``; tested in
tests/unit/local/test_mode.py and tests/e2e/.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typing_extensions import Unpack

from torchyard import api, local
from torchyard.local import LocalResult, default_registry, default_workroot, describe_failure
from torchyard.local.attempts import RESUME_MODES, Resume
from torchyard.sdk import snapshots
from torchyard.sweeps import trials
from torchyard.tuning.plans import Invalid
from torchyard.tuning.sweep_trials import shown as shown_parameters


@dataclass(frozen=True)
class Source:
    """The files every node gets: ``files`` (relative to ``root``), and what was left out."""

    root: Path
    files: list[str]
    ignore_file: str | None
    ignored: int
    left_out: list[str]

    def report(self) -> str:
        """One line: where the files come from, how many, what was left out and why."""
        return (
            f"source {self.root.resolve()}: {len(self.files)} files"
            + (f", {self.ignored} ignored by {self.ignore_file}" if self.ignore_file else "")
            + (f", left out {', '.join(self.left_out)}" if self.left_out else "")
        )


def collect_source(root: Path, registry: Path, workroot: Path) -> Source:
    """The files of ``root`` for every node (:class:`snapshots.SnapshotError` when the
    folder cannot be read or is too large)."""
    files, ignore_file, ignored = snapshots.collect(
        root, include_secrets=True, exclude=[workroot, registry]
    )
    left_out = [f"{rel}/" for rel in snapshots.excluded_inside(root, [workroot, registry])]
    return Source(root, list(files), ignore_file, ignored, left_out)


def run(
    trainingrun: api.TrainingRun,
    source: Source,
    *,
    registry: Path,
    workroot: Path,
    environment: api.Environment | None = None,
    resume: Resume = "auto",
) -> LocalResult:
    """Run ``trainingrun`` here until it ends (OSError or ValueError when it cannot
    start: a working folder that cannot be made, a register path outside node 0's).
    ``resume``, for a run with checkpoints: ``auto`` resumes an attempt that did not
    finish and starts fresh after one that succeeded; ``fresh`` always starts over;
    ``resume`` always resumes from the newest checkpoint (``local.attempts``)."""
    return local.run_local(
        trainingrun,
        source.root,
        source.files,
        registry=registry,
        workroot=workroot,
        environment=environment,
        resume=resume,
    )


def sweep(
    body: dict[str, Any], source: Source, **options: Unpack[local.SweepOptions]
) -> local.SweepResult:
    """Run the Sweep ``body`` here until it finished (``api.InvalidSpec`` or ``ValueError``
    naming the field when it cannot run); ``options`` as ``local.run_sweep`` takes them:
    ``parallel`` trials at a time, the local ``registry`` and ``workroot``, ``out``: where
    it says what it does (standard error), ``stop``: once set, it is canceled."""
    parsed = api.parse_sweep(body)
    try:
        return local.run_sweep(
            parsed, body["spec"]["parameters"], source.root, source.files, **options
        )
    except Invalid as err:
        raise ValueError(str(err)) from None


def sweep_rows(result: local.SweepResult) -> list[list[str]]:
    """The trials of a local sweep, best first (those without the metric after), as table
    rows with a header: trial, state, the metric's best, intervals, parameters."""
    metric = result.sweep.spec.objective.metric
    rows = [["TRIAL", "STATE", metric.upper(), "INTERVALS", "PARAMETERS"]]
    ranked = trials.ranked(result.book)
    order = ranked + [r for r in result.book.trials if r not in ranked]
    for r in order:
        shown = " ".join(f"{k}={v}" for k, v in sorted(shown_parameters(r.params()).items()))
        best = "-" if r.best is None else f"{r.best:.6g}"
        name = f"{result.sweep.name}-t{r.index}"
        rows.append([name, r.state.value, best, str(r.intervals), shown])
    return rows


__all__ = [
    "RESUME_MODES",
    "LocalResult",
    "Resume",
    "Source",
    "collect_source",
    "default_registry",
    "default_workroot",
    "describe_failure",
    "run",
    "sweep",
    "sweep_rows",
]
