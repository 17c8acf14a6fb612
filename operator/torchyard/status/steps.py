"""``status.progress`` as pure functions of what the node Pods' launchers said.

Each node's launcher prints its node's progress as one ``[torchyard] progress {...}`` line
on its log (``launch.tracker.ProgressTracker.summary``: ``step`` of its leading rank,
``minStep`` of its slowest, ``total``, ``stepsPerSecond``, ``time`` of the last progress,
``metrics``) and puts the last one into its termination message. :func:`summary_of_log`
finds the latest such line in a log tail; :func:`run_progress` merges the nodes' into
the run's ``status.progress`` (step, total, stepsPerSecond, eta, lastProgressTime,
slowestRankLag, metrics); :func:`eta_seconds` and :func:`duration` are its arithmetic.
The controller (``controller.progress``) reads the logs; local mode and ``torchyard
wait`` show the same fields. Tested as tables in tests/unit/status/test_steps.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from torchyard.api import wire
from torchyard.launch.contract import PROGRESS_LINE  # the launcher writes it

NODE_RANK_LABEL = wire.LABEL_NODE_RANK


def summary_of_log(lines: Iterable[str]) -> dict[str, Any] | None:
    """The last launcher progress summary in a node Pod's log lines, None if there is none."""
    found: dict[str, Any] | None = None
    for line in lines:
        at = line.find(PROGRESS_LINE)
        if at < 0:
            continue
        try:
            data = json.loads(line[at + len(PROGRESS_LINE) :])
        except ValueError:
            continue
        if isinstance(data, dict) and _int(data.get("step")) is not None:
            found = data
    return found


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def eta_seconds(
    step: int, total: int | None, rate: float | None, last: float | None, now: float
) -> float | None:
    """Seconds until ``total`` at ``rate`` steps per second, counted from the last progress
    (``last``, Unix time) and less the time since; None without a total or a rate."""
    if total is None or rate is None or rate <= 0:
        return None
    left = max(total - step, 0) / rate
    if last is not None:
        left -= max(now - last, 0.0)
    return max(left, 0.0)


def duration(seconds: float) -> str:
    """``3h05m``, ``4m10s``, ``35s``: a short duration for status and columns."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def _time(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_progress(nodes: Sequence[Mapping[str, Any] | None], now: datetime) -> dict[str, Any] | None:
    """The run's ``status.progress`` from its nodes' summaries (index: node rank; None
    where a node said nothing), None when none did. The run is as far as its leading rank
    and as fast as the node that leads; the lag is the leader's step less the slowest
    rank's; the metrics are node 0's (else the first node's that has some)."""
    said = [(i, n) for i, n in enumerate(nodes) if n and _int(n.get("step")) is not None]
    if not said:
        return None
    steps = [int(n["step"]) for _, n in said]
    slowest = min(_int(n.get("minStep")) or int(n["step"]) for _, n in said)
    _, lead = max(said, key=lambda item: (int(item[1]["step"]), -item[0]))
    step = max(steps)
    totals = [t for t in (_int(n.get("total")) for _, n in said) if t is not None]
    total = max(totals) if totals else None
    rate = _number(lead.get("stepsPerSecond"))
    times = [t for t in (_number(n.get("time")) for _, n in said) if t is not None]
    last = max(times) if times else None
    progress: dict[str, Any] = {"step": step, "slowestRankLag": step - slowest}
    if total is not None:
        progress["total"] = total
        progress["percent"] = min(100, int(100 * step / total))
    if rate is not None:
        progress["stepsPerSecond"] = round(rate, 3)
    eta = eta_seconds(step, total, rate, last, now.timestamp())
    if eta is not None:
        progress["eta"] = duration(eta)
    if last is not None:
        progress["lastProgressTime"] = _time(last)
    metrics = next((n["metrics"] for _, n in said if isinstance(n.get("metrics"), dict)), None)
    if metrics:
        progress["metrics"] = {k: _number(v) for k, v in metrics.items() if _number(v) is not None}
    timed = checkpoint_seconds(n.get("checkpointSeconds") for _, n in said)
    if timed:
        progress["checkpointSeconds"] = timed
    return progress


def checkpoint_seconds(nodes: Iterable[Any]) -> dict[str, float]:
    """The slowest step and save (``{"step", "save"}``, seconds) over the nodes' timings."""
    out: dict[str, float] = {}
    for timed in nodes:
        for key in ("step", "save"):
            value = _number(timed.get(key)) if isinstance(timed, Mapping) else None
            if value is not None:
                out[key] = max(out.get(key, 0.0), float(value))
    return out


def final_progress(pods: Sequence[Mapping[str, Any]], now: datetime) -> dict[str, Any] | None:
    """The run's progress from the summaries its node Pods' launchers left in their
    termination messages, once every one of them ended (None before, or when none
    reported); the ETA of a finished run is 0s."""
    if not pods:
        return None
    nodes: dict[int, Mapping[str, Any] | None] = {}
    for pod in pods:
        trainer: Mapping[str, Any] = next(
            (
                c
                for c in pod.get("status", {}).get("containerStatuses", []) or []
                if c.get("name") == "trainer"
            ),
            {},
        )
        ended = trainer.get("state", {}).get("terminated")
        if not ended:
            return None
        try:
            info = json.loads(ended.get("message") or "")
        except ValueError:
            info = {}
        rank = pod.get("metadata", {}).get("labels", {}).get(NODE_RANK_LABEL, "0")
        summary = info.get("progress") if isinstance(info, dict) else None
        nodes[int(rank) if str(rank).isdigit() else 0] = (
            summary if isinstance(summary, dict) else None
        )
    progress = run_progress([nodes.get(i) for i in range(max(nodes) + 1)], now)
    if progress is not None and "eta" in progress:
        progress["eta"] = duration(0)
    return progress
