"""Running a TrainingRun on this machine (``torchyard run FILE --local``), with exactly the
cluster's rank contract: the files a node gets, and the run itself.

:func:`collect_source` selects the files as ``torchyard submit`` snapshots a folder, less
the runs folder and the local registry when they lie inside it (else every run would copy
the ones before); secrets stay, since the copies stay on this machine. :func:`run` hands
them to ``torchyard.local``, which starts one launcher per node and archives outputs and
logs into the local registry. Called by ``torchyard.cli.local``; tested in
tests/unit/test_local_mode.py and tests/e2e/.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torchyard import api, local
from torchyard.local import LocalResult, default_registry, default_workroot, describe_failure
from torchyard.sdk import snapshots


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
) -> LocalResult:
    """Run ``trainingrun`` here until it ends (OSError or ValueError when it cannot
    start: a working folder that cannot be made, a register path outside node 0's)."""
    return local.run_local(
        trainingrun,
        source.root,
        source.files,
        registry=registry,
        workroot=workroot,
        environment=environment,
    )


__all__ = [
    "LocalResult",
    "Source",
    "collect_source",
    "default_registry",
    "default_workroot",
    "describe_failure",
    "run",
]
