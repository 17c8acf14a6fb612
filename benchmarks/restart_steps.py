"""Where a gang restart's time goes: its steps, from a watch on the run's Pods.

benchmarks/peers.py (``--breakdown``) opens a watch on the namespace's Pods for each gang
restart it measures and hands every event to a :class:`PodLog` (by uid, so a Pod made
again under its old name is another Pod); :func:`steps` is pure: from that log, the
uids of the Pods that were Running before, the victim's uid and the time the failure
was sent, the seconds to each step of :data:`STEPS`:

  the victim seen Failed; the first old Pod seen being deleted (the delete sent); the
  last old Pod that was deleted gone; the first and the last new Pod created; the last
  new Pod Running (the ``n``-th of the run's Pods Running, counting the old ones that
  were kept: a PyTorchJob replaces one Pod only);

and the Pods created after the failure (more than were replaced: a Pod was made twice).
:func:`report` prints the medians per contender. Times are this process's monotonic
clock at the watch event, a few milliseconds after the write, alike for every
contender. Tested in tests/unit/test_benchmark_restart_steps.py.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

STEPS: tuple[tuple[str, str], ...] = (
    ("failed", "victim Failed"),
    ("deleting", "first delete"),
    ("old_gone", "last old gone"),
    ("first_new", "first new Pod"),
    ("last_new", "last new Pod"),
    ("running", "all Running"),
)


@dataclass
class PodSeen:
    """One Pod (one uid) as the watch saw it, each time in ``time.monotonic()`` seconds."""

    name: str
    first: float
    failed: float | None = None
    deleting: float | None = None
    gone: float | None = None
    running: float | None = None


@dataclass
class PodLog:
    """Every Pod of one run (label ``label`` = ``run``) seen by the watch, by uid."""

    label: str
    run: str
    pods: dict[str, PodSeen] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, type_: str, obj: Mapping[str, Any], at: float | None = None) -> None:
        meta = obj.get("metadata") or {}
        if (meta.get("labels") or {}).get(self.label) != self.run:
            return
        at = time.monotonic() if at is None else at
        with self.lock:
            pod = self.pods.setdefault(str(meta["uid"]), PodSeen(str(meta.get("name")), at))
            phase = (obj.get("status") or {}).get("phase")
            if phase == "Failed" and pod.failed is None:
                pod.failed = at
            if phase == "Running" and pod.running is None:
                pod.running = at
            if meta.get("deletionTimestamp") and pod.deleting is None:
                pod.deleting = at
            if type_ == "DELETED" and pod.gone is None:
                pod.gone = at
                pod.deleting = pod.deleting or at  # deleted at once (grace period 0)

    def snapshot(self) -> dict[str, PodSeen]:
        with self.lock:
            return {uid: PodSeen(**vars(p)) for uid, p in self.pods.items()}


def steps(
    pods: Mapping[str, PodSeen], old: Iterable[str], victim: str, n: int, started: float
) -> dict[str, float | None]:
    """Seconds from ``started`` (the failure was sent) to each step of :data:`STEPS`,
    None for a step not seen, and ``created``: the Pods created after ``started``."""
    old = set(old)

    def since(at: float | None) -> float | None:
        return None if at is None else max(0.0, at - started)

    out: dict[str, float | None] = {key: None for key, _ in STEPS}
    out["failed"] = since(pods[victim].failed) if victim in pods else None
    deleted = [p for uid, p in pods.items() if uid in old and p.deleting is not None]
    if deleted:
        out["deleting"] = since(min(p.deleting for p in deleted if p.deleting is not None))
        gone = [p.gone for p in deleted if p.gone is not None]
        out["old_gone"] = since(max(gone)) if len(gone) == len(deleted) else None
    new = sorted(p.first for uid, p in pods.items() if uid not in old and p.first >= started)
    out["created"] = float(len(new))
    if new:
        out["first_new"] = since(new[0])
        out["last_new"] = since(new[-1])
    kept = [p for uid, p in pods.items() if uid in old and p.deleting is None]
    fresh = [p for uid, p in pods.items() if uid not in old and p.gone is None]
    runnings = sorted(p.running for p in fresh if p.running is not None)
    if len(kept) + len(runnings) >= n and len(runnings) >= n - len(kept) > 0:
        out["running"] = since(runnings[n - len(kept) - 1])
    return out


def report(
    rows: Mapping[str, list[dict[str, float | None]]],
    n: int,
    out: Callable[[str], None] = print,
) -> None:
    """Per contender, the median seconds from the failure to each step, then each
    step's own share (median over the rounds)."""
    out(f"\nwhere a gang restart of N = {n} goes (--breakdown): seconds from the failure, median")
    out("  contender    " + "  ".join(f"{label:>14s}" for _, label in STEPS) + "  Pods created")
    for name, samples in rows.items():
        cells = []
        for key, _ in [*STEPS, ("created", "")]:
            values = [v for s in samples if (v := s.get(key)) is not None]
            cells.append(f"{statistics.median(values):13.2f}s" if values else f"{'-':>14s}")
        cells[-1] = cells[-1].rstrip("s")
        out(f"  {name:11s}  " + "  ".join(cells))
    out("  contender    " + "  ".join(f"{a:>9s}->{b:<9s}" for (a, _), (b, _) in _pairs()))
    for name, samples in rows.items():
        cells = []
        for (a, _), (b, _) in _pairs():
            spans = [x for s in samples if (x := _span(s, a, b)) is not None]
            cells.append(f"{statistics.median(spans):18.2f}s" if spans else f"{'-':>19s}")
        out(f"  {name:11s}  " + "  ".join(cells))


def _pairs() -> list[tuple[tuple[str, str], tuple[str, str]]]:
    return list(itertools.pairwise(STEPS))


def _span(sample: Mapping[str, float | None], start: str, end: str) -> float | None:
    a, b = sample.get(start), sample.get(end)
    return None if a is None or b is None else b - a
