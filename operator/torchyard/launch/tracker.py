"""What the ranks of a node said of their progress (their ``@@torchyard`` lines,
``torchyard.progress``): :class:`ProgressTracker` keeps every record in
``logs/metrics.jsonl`` and makes the node's summary (the ``[torchyard] progress`` line the
operator reads into ``status.progress``) and the stall timeouts' clock;
:func:`merge_metrics` puts the last metric values into ``outputs/metrics.json``.

Standard library only, Python >= 3.8; shipped with the launcher. Tested in
tests/unit/launcher/test_progress.py and tests/unit/launcher/test_stalls.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from torchyard.launch.contract import PHASE_NAMES, STALL_BUDGETS

PROGRESS_METRICS_MAX = 32  # metric names kept for the summary (all go to metrics.jsonl)


class ProgressTracker:
    """What the ranks of this node said of their progress (``@@torchyard`` lines).

    Every record goes to ``logs/metrics.jsonl`` with its rank and time; :meth:`summary`
    is the node's progress: the leading and the slowest rank's step, the total, steps per
    second (of the leading rank, from its second report on: the first one includes the
    warm-up), when progress was last made, and the last metric values (rank 0's win).
    Thread-safe: the ranks' output threads call :meth:`record`.
    """

    def __init__(self, log_dir: str, clock: Callable[[], float] = time.time) -> None:
        self.path = os.path.join(log_dir, "metrics.jsonl")
        self.clock = clock
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        # rank -> [first point after warm-up (t, step) or None, last (t, step)]
        self._ranks: dict[int | None, list[tuple[float, int] | None]] = {}
        self._metrics: dict[int | None, dict[str, Any]] = {}
        self.total: int | None = None
        self.last_time: float | None = None
        self.slowest_step = 0.0  # seconds, of the slowest step after the warm-up
        self.version = 0  # bumped by every record: has anything changed?
        # rank -> (phase, since when) while it says it is not training (PHASE_NAMES)
        self._phases: dict[int | None, tuple[str, float]] = {}

    def record(self, rank: int | None, record: Mapping[str, Any]) -> None:
        now = self.clock()
        step = int(record["step"])
        said_rank = record.get("rank")
        if rank is None and isinstance(said_rank, int) and not isinstance(said_rank, bool):
            rank = said_rank  # launch: node: the rank says who it is (``progress.report``)
        with self._lock:
            if self._file is None:
                self._file = open(self.path, "a")  # noqa: SIM115
            self._file.write(json.dumps(dict(record, rank=rank, time=round(now, 3))) + "\n")
            self._file.flush()
            points = self._ranks.setdefault(rank, [None, None])
            last = points[1]
            in_phase = rank in self._phases
            if last is not None and step > last[1]:
                if points[0] is None:
                    points[0] = (now, step)  # the first step after the warm-up one
                elif not in_phase:  # the slowest step since the warm-up (a save or an
                    # evaluation in between is no step): the adaptive stall timeout
                    self.slowest_step = max(self.slowest_step, (now - last[0]) / (step - last[1]))
                self.last_time = now
            elif last is None:
                self.last_time = now
            said = record.get("phase")
            phase = PHASE_NAMES.get(said.lower(), "") if isinstance(said, str) else ""
            if phase is None or (not phase and last is not None and step > last[1]):
                self._phases.pop(rank, None)  # training (again)
                if in_phase and last is not None and step <= last[1]:
                    points[1] = (now, last[1])  # the phase ended: the step clock restarts
            elif phase and self._phases.get(rank, ("",))[0] != phase:
                self._phases[rank] = (phase, now)
            if last is None or step > last[1]:
                points[1] = (now, step)  # when this rank last made progress
            if isinstance(record.get("total"), int) and not isinstance(record["total"], bool):
                self.total = int(record["total"])
            metrics = self._metrics.setdefault(rank, {})
            for name, value in record.items():
                if name not in ("step", "total", "phase", "rank") and (
                    name in metrics or len(metrics) < PROGRESS_METRICS_MAX
                ):
                    metrics[name] = value
            self.version += 1

    def stalled(
        self,
        ranks: Sequence[int | None],
        now: float,
        fixed: float | None,
        floor: float,
        budgets: Mapping[str, float] | None = None,
    ) -> tuple[int | None, float, int, float] | None:
        """(rank, seconds without progress, its last step, the timeout) of the rank of
        ``ranks`` that made no progress for longest of those past their stall timeout:
        ``fixed``, else max(``floor``, 5 x the slowest step) once a step after the warm-up
        was timed (before that, and for ranks that never reported, there is no timeout).
        While a rank says it is initializing, saving or evaluating (:meth:`phase_of`), its
        timeout is that phase's budget (``budgets``, else ``STALL_BUDGETS``), counted from
        when it said so; the node's other ranks (which may wait for it in a collective)
        get the largest budget of the phases under way, counted from the earliest."""
        budget = dict(STALL_BUDGETS, **(budgets or {}))
        with self._lock:
            timeout = fixed if fixed is not None else None
            if timeout is None and self.slowest_step > 0:
                timeout = max(floor, 5 * self.slowest_step)
            phases = {r: p for r, p in self._phases.items() if r in ranks}
            shared = (
                (max(budget[p] for p, _ in phases.values()), min(t for _, t in phases.values()))
                if phases
                else None
            )
            # (seconds idle, in a phase itself, minus its last step, rank, its limit): the
            # rank idle longest, the one that said the phase before those waiting for it
            idle: list[tuple[float, bool, int, int | None, float]] = []
            for rank in ranks:
                last = self._ranks.get(rank, [None, None])[1]
                if last is None:
                    continue
                limit, since = timeout, last[0]
                if rank in phases:
                    limit, since = budget[phases[rank][0]], max(last[0], phases[rank][1])
                elif shared is not None:
                    limit = max(shared[0], timeout or 0.0)
                    since = max(last[0], shared[1])
                if limit is not None and now - since > limit:
                    idle.append((now - since, rank in phases, -last[1], rank, limit))
        if not idle:
            return None
        seconds, _, minus_step, rank, limit = max(idle, key=lambda item: item[:3])
        return rank, seconds, -minus_step, limit

    def idle_seconds(self, rank: int | None, now: float) -> float | None:
        """Seconds since ``rank`` last made progress, None if it never reported."""
        with self._lock:
            last = self._ranks.get(rank, [None, None])[1]
            return now - last[0] if last is not None else None

    def idle_ranks(
        self, ranks: Sequence[int | None], now: float, seconds: float
    ) -> list[int | None]:
        """Those of ``ranks`` that made no progress for ``seconds`` or longer, in order."""
        return [
            r
            for r in ranks
            for idle in [self.idle_seconds(r, now)]
            if idle is not None and idle >= seconds
        ]

    def phase_of(self, rank: int | None) -> str | None:
        """What ``rank`` said it is doing besides training, None while it trains."""
        with self._lock:
            held = self._phases.get(rank)
            return held[0] if held is not None else None

    def reported_ranks(self) -> list[int]:
        """The ranks that said who they are (all of them with ``launch: process``)."""
        with self._lock:
            return sorted(r for r in self._ranks if r is not None)

    def step_of(self, rank: int | None) -> int | None:
        """The last step ``rank`` reported, None if it reported none."""
        with self._lock:
            last = self._ranks.get(rank, [None, None])[1]
            return last[1] if last is not None else None

    def metrics(self) -> dict[str, Any]:
        """The last value of every metric, rank 0's (the lowest rank's) winning."""
        with self._lock:
            merged: dict[str, Any] = {}
            for rank in sorted(self._metrics, key=lambda r: -1 if r is None else r, reverse=True):
                merged.update(self._metrics[rank])
            return merged

    def summary(self) -> dict[str, Any] | None:
        """This node's progress (see the class docstring), None before any report."""
        with self._lock:
            lasts = {r: p[1] for r, p in self._ranks.items() if p[1] is not None}
            if not lasts:
                return None
            lead = max(lasts, key=lambda r: (lasts[r][1], -(r or 0)))
            lead_last = lasts[lead]
            first = self._ranks[lead][0]
            steps = [p[1] for p in lasts.values() if p is not None]
        summary: dict[str, Any] = {"step": max(steps), "minStep": min(steps)}
        if self.total is not None:
            summary["total"] = self.total
        if first is not None and lead_last is not None and lead_last[0] > first[0]:
            rate = (lead_last[1] - first[1]) / (lead_last[0] - first[0])
            summary["stepsPerSecond"] = round(rate, 6)
        if self.last_time is not None:
            summary["time"] = round(self.last_time, 3)
        metrics = self.metrics()
        if metrics:
            summary["metrics"] = metrics
        return summary

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def merge_metrics(outputs: str, metrics: Mapping[str, Any]) -> None:
    """Put the last metric values into ``outputs/metrics.json`` (what the ModelVersion
    records); a value the script wrote there itself wins."""
    numbers = {
        k: v
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "rank"
    }
    if not numbers:
        return
    path = os.path.join(outputs, "metrics.json")
    mine: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        with open(path) as f:
            loaded = json.load(f)
        if isinstance(loaded, dict):
            mine = loaded
    with contextlib.suppress(OSError), open(path, "w") as f:
        json.dump(dict(numbers, **mine), f, sort_keys=True)
