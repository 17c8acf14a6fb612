"""Where a fan-out's time goes before and after the first Pod: a timeline from watches.

benchmarks/peers.py (``--breakdown``) keeps one :class:`Timeline` open on its namespace
for the whole run: watches on Pods, Services, ConfigMaps, Jobs and each contender's own
kind (TrainingRun, TrainJob, JobSet, PyTorchJob) note, in this process's monotonic
clock, when each object was first seen, when a custom object first had a ``status``,
and when each Pod was first seen ``Running``. Object ``creationTimestamp`` and
``managedFields`` times have a resolution of one second, too coarse for steps of tens of
milliseconds; watch events come a few milliseconds after the write, alike for every
contender, so the differences between steps are what they cost.

:func:`milestones` is pure: from what was seen of one run (its objects named after it,
its Pods by label) and the time the benchmark sent its create, the seconds to each step:
the run's object seen, its first child of any kind, its Service, its status written,
its first and last Pod created, its last Pod Running. :func:`report` prints the medians
per contender. :func:`pod_stages` times each Pod's own steps (created, its scheduling
gates lifted, bound to a node, Running) and :func:`report_pods` prints their medians and
95th percentiles over all Pods. Tested in tests/unit/test_benchmark_timeline.py.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The steps, in the order a run goes through them, with the words the report uses.
STEPS: tuple[tuple[str, str], ...] = (
    ("seen", "run object seen"),
    ("child", "first child object"),
    ("service", "Service created"),
    ("status", "status written"),
    ("first_pod", "first Pod created"),
    ("last_pod", "last Pod created"),
    ("running", "last Pod Running"),
)


@dataclass
class PodSeen:
    """One Pod as the watch saw it: the runs its labels name, and when it was first seen
    (created), without scheduling gates (ungated: at once for a Pod created without),
    bound to a node (scheduled) and Running; None for a step not seen yet."""

    runs: frozenset[str]
    created: float
    ungated: float | None = None
    scheduled: float | None = None
    running: float | None = None


@dataclass
class Seen:
    """What the watches saw, each time in ``time.monotonic()`` seconds."""

    # (kind, name) -> first seen; kind is the watched plural ("services", "jobsets", ...)
    objects: dict[tuple[str, str], float] = field(default_factory=dict)
    # (kind, name) of a custom object -> when it was first seen with a status
    statuses: dict[tuple[str, str], float] = field(default_factory=dict)
    pods: dict[str, PodSeen] = field(default_factory=dict)  # by name

    def note(self, kind: str, obj: Mapping[str, Any], at: float, labels: Sequence[str]) -> None:
        """Take one watch event's object into account (``labels``: the Pod labels whose
        value names the run)."""
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        key = (kind, name)
        self.objects.setdefault(key, at)
        if kind == "pods":
            self._pod(name, obj, at, labels)
        elif obj.get("status") and kind not in ("services", "configmaps", "jobs"):
            self.statuses.setdefault(key, at)

    def _pod(self, name: str, obj: Mapping[str, Any], at: float, labels: Sequence[str]) -> None:
        values = (obj.get("metadata") or {}).get("labels") or {}
        pod = self.pods.get(name)
        if pod is None:
            runs = frozenset(str(values[label]) for label in labels if label in values)
            pod = self.pods[name] = PodSeen(runs, at)
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        if pod.ungated is None and not spec.get("schedulingGates"):
            pod.ungated = at
        if pod.scheduled is None and spec.get("nodeName"):
            pod.scheduled = at
        if pod.running is None and status.get("phase") == "Running":
            pod.running = at


def _named_after(name: str, run: str) -> bool:
    return name == run or name.startswith(run + "-")


def milestones(
    seen: Seen, run: str, kind: str | None, n: int, started: float
) -> dict[str, float | None]:
    """Seconds from ``started`` (the create was sent) to each step of :data:`STEPS` for
    run ``run`` (its custom object of plural ``kind``, None for bare Pods) with ``n``
    Pods; None for a step not seen (a contender without a Service, say)."""
    out: dict[str, float | None] = {key: None for key, _ in STEPS}

    def since(at: float | None) -> float | None:
        return None if at is None else max(0.0, at - started)

    if kind is not None:
        out["seen"] = since(seen.objects.get((kind, run)))
        out["status"] = since(seen.statuses.get((kind, run)))
    children = [
        at
        for (k, name), at in seen.objects.items()
        if k != kind and at >= started and _named_after(name, run) and k != "pods"
    ]
    pods = [(p.created, p.running) for p in _pods_of(seen, run, started)]
    if pods:
        children.append(min(first for first, _ in pods))
    out["child"] = since(min(children)) if children else None
    services = [
        at
        for (k, name), at in seen.objects.items()
        if k == "services" and at >= started and _named_after(name, run)
    ]
    out["service"] = since(min(services)) if services else None
    if pods:
        firsts = sorted(first for first, _ in pods)
        out["first_pod"] = since(firsts[0])
        out["last_pod"] = since(firsts[min(n, len(firsts)) - 1])
        runnings = sorted(r for _, r in pods if r is not None)
        if len(runnings) >= n:
            out["running"] = since(runnings[n - 1])
    return out


def _pods_of(seen: Seen, run: str, started: float) -> list[PodSeen]:
    return [p for p in seen.pods.values() if run in p.runs and p.created >= started]


# A Pod's own steps, each from the one before: (key, words, from, to).
POD_STAGES: tuple[tuple[str, str, str, str], ...] = (
    ("gated", "created -> ungated", "created", "ungated"),
    ("scheduling", "ungated -> scheduled", "ungated", "scheduled"),
    ("starting", "scheduled -> Running", "scheduled", "running"),
    ("total", "created -> Running", "created", "running"),
)


def pod_stages(seen: Seen, run: str, started: float) -> dict[str, list[float]]:
    """Each :data:`POD_STAGES` step's seconds for every Pod of ``run`` created after
    ``started`` that went through it (a Pod not yet Running has no ``starting``)."""
    out: dict[str, list[float]] = {key: [] for key, *_ in POD_STAGES}
    for pod in _pods_of(seen, run, started):
        for key, _, begin, end in POD_STAGES:
            b, e = getattr(pod, begin), getattr(pod, end)
            if b is not None and e is not None:
                out[key].append(max(0.0, e - b))
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


Watcher = Callable[[Callable[[str, dict[str, Any]], None], threading.Event], None]


class Timeline:
    """Watches that feed one :class:`Seen`, each in a thread of its own, until
    :meth:`stop`. ``watchers`` maps a kind's plural to a function that streams its
    events (type, object) into the callback it is given until the event is set."""

    def __init__(self, watchers: Mapping[str, Watcher], labels: Sequence[str]) -> None:
        self.seen = Seen()
        self.labels = tuple(labels)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(kind, w), daemon=True, name=f"tl-{kind}")
            for kind, w in watchers.items()
        ]

    def _run(self, kind: str, watcher: Watcher) -> None:
        def event(type_: str, obj: dict[str, Any]) -> None:
            if type_ == "DELETED":
                return
            at = time.monotonic()
            with self.lock:
                self.seen.note(kind, obj, at, self.labels)

        while not self.stopping.is_set():
            try:
                watcher(event, self.stopping)
            except Exception:  # an expired or broken watch: open it again
                time.sleep(0.2)

    def start(self) -> Timeline:
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        self.stopping.set()

    def milestones(self, run: str, kind: str | None, n: int, started: float) -> dict[str, Any]:
        with self.lock:
            return milestones(self.seen, run, kind, n, started)

    def caught_up(self, run: str, n: int, started: float, timeout: float = 30) -> bool:
        """Wait until the watches have seen ``n`` Pods of ``run`` Running (a loaded
        machine's watch runs behind the benchmark's own reads); False after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                pods = _pods_of(self.seen, run, started)
                if sum(p.running is not None for p in pods) >= n:
                    return True
            time.sleep(0.1)
        return False

    def pod_stages(self, run: str, started: float) -> dict[str, list[float]]:
        with self.lock:
            return pod_stages(self.seen, run, started)


def report(
    rows: Mapping[tuple[str, int], list[dict[str, float | None]]],
    names: Iterable[str],
    sizes: Iterable[int],
    out: Callable[[str], None] = print,
) -> None:
    """Per size and contender, the median seconds from create to each step, and the
    steps' own share: before the first Pod, creating the Pods, and until all Running."""
    names, sizes = list(names), list(sizes)
    out("\nwhere the time goes (--breakdown): seconds from create, median over the rounds")
    out("   N  contender    " + "  ".join(f"{label:>18s}" for _, label in STEPS))
    for n in sizes:
        for name in names:
            samples = rows.get((name, n), [])
            cells = []
            for key, _ in STEPS:
                values = [s[key] for s in samples if s.get(key) is not None]
                cells.append(f"{statistics.median(values):17.2f}s" if values else f"{'-':>18s}")
            out(f"{n:4d}  {name:11s}  " + "  ".join(cells))
    out(
        "   N  contender      before the first Pod   creating the Pods   until all Running"
        "   (median, then each round in order)"
    )
    for n in sizes:
        for name in names:
            samples = rows.get((name, n), [])
            spans = [
                _part(samples, None, "first_pod"),
                _part(samples, "first_pod", "last_pod"),
                _part(samples, "last_pod", "running"),
            ]
            cells = [f"{statistics.median(v):19.2f}s" if v else f"{'-':>20s}" for v in spans]
            rounds = " | ".join(" ".join(f"{x:.2f}" for x in v) for v in spans)
            out(f"{n:4d}  {name:11s}  " + "  ".join(cells) + f"   ({rounds})")


def _part(samples: list[dict[str, float | None]], start: str | None, end: str) -> list[float]:
    """Each round's seconds from step ``start`` (None: the create) to step ``end``."""
    values = []
    for s in samples:
        b = 0.0 if start is None else s.get(start)
        e = s.get(end)
        if b is not None and e is not None:
            values.append(e - b)
    return values


def report_pods(
    rows: Mapping[tuple[str, int], Mapping[str, Sequence[float]]],
    names: Iterable[str],
    sizes: Iterable[int],
    out: Callable[[str], None] = print,
) -> None:
    """Per size and contender, each Pod's own steps (:data:`POD_STAGES`): the median and
    the 95th percentile over every Pod of every round, in seconds."""
    names, sizes = list(names), list(sizes)
    out("\nper Pod (--breakdown): seconds of each step, median / 95th percentile over all Pods")
    out("   N  contender    " + "  ".join(f"{words:>22s}" for _, words, _, _ in POD_STAGES))
    for n in sizes:
        for name in names:
            stages = rows.get((name, n))
            if not stages:
                continue
            cells = [_median_p95(stages.get(key) or []) for key, *_ in POD_STAGES]
            out(f"{n:4d}  {name:11s}  " + "  ".join(cells))


def _median_p95(values: Sequence[float]) -> str:
    if not values:
        return "-".rjust(22)
    return f"{statistics.median(values):10.2f} / {percentile(values, 0.95):5.2f}s"
