"""Live ``status.progress``: the node Pods' logs, read at most every 10 s while they run.

The operator cannot read a launcher's memory, and node Pods may not write to the API (their
ServiceAccount is the user's). So each launcher prints its node's progress as one
``[torchyard] progress {...}`` line on its log when progress was made, at most every
``TORCHYARD_PROGRESS_INTERVAL`` seconds (5), and the operator, which may read Pod logs,
reads the tail of each running node Pod's log (``pods/log``, through the apiserver and
the kubelet: no route to the Pod network needed, and no port the Pod must open) and keeps
the latest line (not of a Pod whose trainer started less than ``YOUNG_SECONDS`` ago: a
gang's fan-out reads no logs). :func:`poll` does that at most every ``POLL_SECONDS`` per
run, and only every ``QUIET_POLL_SECONDS`` once a run's logs held no progress
``QUIET_AFTER`` times in a row (a script that never reports costs one log read a minute).
When the run finished, ``status.steps.final_progress`` takes the last summary from the
termination messages.

Called by ``trainingruns.reconcile`` for runs whose Pods run; the parsing and merging
are pure (``status.steps``). Tested in tests/unit/controller/test_progress.py and on
the real node in tests/node/test_progress.py.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from torchyard import k8s
from torchyard.controller.context import Context, parse_time
from torchyard.planning import names
from torchyard.status import steps as run_progress

POLL_SECONDS = 10.0
QUIET_POLL_SECONDS = 60.0
QUIET_AFTER = 3
# Lines of each node Pod's log read: the launcher's summary is among the last ones unless
# the ranks print more than this many lines between two summaries.
TAIL_LINES = 2000
# And at most this many bytes of them (the kubelet's limitBytes, counted from the first of
# those lines): a rank's lines are at most 64 KiB (the launcher shows longer ones in
# pieces), so without it one poll of a chatty node could read 128 MiB. When the tail is
# bigger, its start is read, which may hold an older summary, or none.
LIMIT_BYTES = 4 << 20
TRAINER = "trainer"
# A kubelet that does not answer (a node gone quiet) holds a work queue worker this long
# at most, then counts as a read without progress.
READ_TIMEOUT_SECONDS = 5.0
# A Pod whose trainer started less than this long ago is not read: its launcher and script
# are still starting (a progress line comes at most every TORCHYARD_PROGRESS_INTERVAL,
# 5 s). A gang's fan-out would otherwise read the log of every Pod that has just started,
# through the apiserver, while the apiserver is busiest creating and binding the rest.
YOUNG_SECONDS = 5.0


@dataclass
class _Polls:
    last: datetime
    empty: int = 0  # polls in a row that found no progress


_LOCK = threading.Lock()  # the work queue's workers poll different runs at once


@dataclass(frozen=True)
class Polled:
    """What :func:`poll` found (None: it did not look, or nothing), and when to look again."""

    progress: dict[str, Any] | None
    again_seconds: float
    # the launchers' word on their in-place restarts (``inPlace`` of their summaries)
    in_place: tuple[Mapping[str, Any], ...] = ()


def _running(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [p for p in pods if p.get("status", {}).get("phase") == "Running"]


def _started(pod: Mapping[str, Any]) -> datetime | None:
    """When the trainer container started running (None: not said)."""
    for container in pod.get("status", {}).get("containerStatuses") or []:
        if container.get("name") == TRAINER:
            started = ((container.get("state") or {}).get("running") or {}).get("startedAt")
            try:
                return parse_time(str(started)) if started else None
            except ValueError:
                return None
    return None


def _young_for(pod: Mapping[str, Any], now: datetime) -> float:
    """Seconds until ``pod`` has run YOUNG_SECONDS (0: it has, or its start is not said)."""
    started = _started(pod)
    if started is None:
        return 0.0
    return max(0.0, YOUNG_SECONDS - (now - started).total_seconds())


def _node_rank(pod: Mapping[str, Any]) -> int:
    value = str(pod.get("metadata", {}).get("labels", {}).get(names.LABEL_NODE_RANK, "0"))
    return int(value) if value.isdigit() else 0


def poll(
    ctx: Context, namespace: str, uid: str, pods: Sequence[Mapping[str, Any]], now: datetime
) -> Polled | None:
    """Read the running node Pods' progress if this run is due (None: no Pod runs).
    Pods whose trainer started less than YOUNG_SECONDS ago are not read yet."""
    running = _running(pods)
    if not running:
        with _LOCK:
            ctx.progress_polls.pop(uid, None)
        return None
    young = [_young_for(p, now) for p in running]
    if all(y > 0 for y in young):  # none can have said anything yet: not a poll
        return Polled(None, min(young))
    running = [p for p, y in zip(running, young, strict=True) if y == 0]
    with _LOCK:
        polls: _Polls | None = ctx.progress_polls.get(uid)
        every = (
            QUIET_POLL_SECONDS if polls is not None and polls.empty >= QUIET_AFTER else POLL_SECONDS
        )
        if polls is not None:
            waited = (now - polls.last).total_seconds()
            if waited < every:
                return Polled(None, every - waited)
    nodes: dict[int, dict[str, Any] | None] = {}
    for pod in running:
        try:
            lines = ctx.k8s.pod_log_lines(
                namespace,
                pod["metadata"]["name"],
                container=TRAINER,
                tail_lines=TAIL_LINES,
                limit_bytes=LIMIT_BYTES,
                timeout=READ_TIMEOUT_SECONDS,
            )
            nodes[_node_rank(pod)] = run_progress.summary_of_log(lines)
        except k8s.ApiError:
            continue  # no log (yet): next time
        except k8s.Unreachable:
            # A kubelet that does not answer held this worker READ_TIMEOUT_SECONDS; the
            # others of a large gang would too, one after another (minutes for hundreds of
            # nodes): this poll ends here with what it has, and the next one tries again.
            break
    progress = (
        run_progress.run_progress([nodes.get(i) for i in range(max(nodes) + 1)], now)
        if nodes
        else None
    )
    with _LOCK:
        polls = ctx.progress_polls.setdefault(uid, _Polls(now))
        polls.last = now
        polls.empty = 0 if progress is not None else polls.empty + 1
        every = QUIET_POLL_SECONDS if polls.empty >= QUIET_AFTER else POLL_SECONDS
    said = [n["inPlace"] for n in nodes.values() if n and isinstance(n.get("inPlace"), Mapping)]
    return Polled(progress, every, tuple(said))
