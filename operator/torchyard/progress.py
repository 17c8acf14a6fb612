"""Progress from a training script: one line on standard output that torchyard reads.

Standard library only and Python >= 3.8, like the launcher: it is shipped into every node
Pod beside the launcher (``planning.pods.SHIPPED_MODULES``), so a script does
``from torchyard import progress`` in any image; the format (the prefix, the phases, the
reader) is the launcher's own, ``torchyard.launch.contract``. A rank calls::

    progress.report(120, total=3000, loss=0.41)

which prints (and flushes) one line::

    @@torchyard {"step": 120, "total": 3000, "loss": 0.41}

A rank that starts a long piece of work that is no training step says so with ``phase``
(``initializing``, ``saving``, ``evaluating``; ``training`` or a higher step ends it)::

    progress.report(step, phase="saving")   # or progress.phase("saving")

and the launcher gives it that phase's stall budget (``policy.stallBudgets``) instead of
the stall timeout. A script that cannot import torchyard prints the same line itself.
The launcher reads these lines from every rank's output as it tees them
(``launch.tracker.ProgressTracker``): it keeps them in ``logs/metrics.jsonl``, puts the last
metric values into ``outputs/metrics.json`` (which the ModelVersion records) and
publishes the node's progress for the operator (``status.progress``). :func:`log` is
Azure ML's ``run.log(name, value)``: a metric at the current step. :func:`parse` is the
format's reader, the one the launcher reads the lines with
(``launch.contract.parse_progress``). Tested in tests/unit/launcher/test_progress.py and
tests/unit/launcher/test_stalls.py.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

from torchyard.launch.contract import (
    PHASE_NAMES,
    PROGRESS_TEXT,
    RANK,
    TORCHYARD_LAUNCH,
    parse_progress,
)

PREFIX = PROGRESS_TEXT
# What a rank may say it is doing besides training (each has its stall budget)
PHASES = tuple(PHASE_NAMES)

_last_step = [0]  # the step of the last report, for log()
# (the stream, the line) last written: the same line again there says nothing new
_last_written: list[Any] = [None, ""]


def _number(name: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"progress: {name} must be a number, got {value!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf: reported as null
    return value


def line(step: int, total: int | None = None, phase: str | None = None, **metrics: Any) -> str:
    """The line :func:`report` prints (without the newline)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise TypeError(f"progress: step must be a non-negative int, got {step!r}")
    record: dict[str, Any] = {"step": step}
    if total is not None:
        if isinstance(total, bool) or not isinstance(total, int) or total < 1:
            raise TypeError(f"progress: total must be a positive int, got {total!r}")
        record["total"] = total
    if phase is not None:
        if phase not in PHASES:
            raise ValueError(f"progress: phase must be one of {', '.join(PHASES)}, got {phase!r}")
        record["phase"] = phase
    for name, value in metrics.items():
        record[name] = _number(name, value)
    return PREFIX + json.dumps(record)


def report(step: int, total: int | None = None, phase: str | None = None, **metrics: Any) -> None:
    """Say that this rank reached ``step`` (of ``total``), with metric values; ``phase``:
    what it does now besides training (``PHASES``), for its stall budget.

    Each new report is one write (the launcher needs every step as it comes: the stall
    timeout, and the step a failure happened at); a report identical to the one before
    says nothing new and writes nothing."""
    if os.environ.get(TORCHYARD_LAUNCH) == "node" and os.environ.get(RANK, "").isdigit():
        # torchrun's ranks share one output: the launcher tells them apart by this
        metrics = dict(metrics, rank=int(os.environ[RANK]))
    text = line(step, total, phase, **metrics)
    _last_step[0] = step
    out = sys.stdout
    if _last_written[0] is out and _last_written[1] == text:
        return
    _last_written[:] = [out, text]
    out.write(text + "\n")
    out.flush()


def phase(name: str) -> None:
    """Say that this rank now initializes, saves or evaluates (or trains again), at its
    last reported step: every rank that waits for it should say so too."""
    report(_last_step[0], phase=name)


def log(name: str, value: Any, step: int | None = None) -> None:
    """One metric value (Azure ML's ``run.log``), at ``step`` or the last reported step."""
    report(_last_step[0] if step is None else step, **{name: value})


def parse(text: str) -> dict[str, Any] | None:
    """The record of one output line, or None when it is not a valid progress line."""
    return parse_progress(text)
