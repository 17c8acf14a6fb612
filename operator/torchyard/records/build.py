"""Records as pure functions of the objects they describe.

:func:`trainingrun_record` takes a TrainingRun as the operator last saw it, its node Pods,
its Events and the tails of its node Pods' logs; :func:`sweep_record` and
:func:`environment_record` take a Sweep or an Environment and their Events;
:func:`as_object` reads a record back as the object it describes. No I/O, no
clock: the caller passes ``now`` (when the record is written) and says whether the object
was deleted before it ended. Every list and text is bounded (:data:`MAX_EVENTS`,
:data:`TAIL_LINES` ...), so a record stays small whatever the run printed.

Called by ``controller.recording`` and local mode (``local.runs``); tested in
tests/unit/records/test_build.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from torchyard.api import wire
from torchyard.records.schema import (
    FORMAT,
    AttemptTiming,
    EventRecord,
    Failure,
    Kind,
    ModelRef,
    NodeTiming,
    Record,
)

MAX_EVENTS = 100  # the last Events kept
MAX_MESSAGE = 2000  # characters of an Event's message or a log line kept
TAIL_LINES = 100  # lines of each node's log tail kept
MAX_TAIL_NODES = 16  # nodes whose log tail is kept (the failing one always among them)
TERMINAL = ("Succeeded", "Failed", "Ready")


def timestamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def cut(text: Any, limit: int = MAX_MESSAGE) -> str:
    value = str(text or "")
    return value if len(value) <= limit else value[:limit] + "..."


def _base(obj: Mapping[str, Any], kind: Kind, now: datetime, deleted: bool) -> Record:
    """The keys every record has, from the object's metadata, spec and status."""
    meta = obj.get("metadata") or {}
    st = dict(obj.get("status") or {})
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    finished = st.get("completionTime") or (timestamp(now) if deleted else None)
    return Record(
        format=FORMAT,
        kind=kind,
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        phase=str(st.get("phase") or "Pending"),
        deleted=deleted,
        created=meta.get("creationTimestamp"),
        finished=finished,
        recorded=now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),  # orders namesakes of one second
        labels=labels,
        experiment=labels.get(wire.LABEL_EXPERIMENT),
        sweep=labels.get(wire.LABEL_SWEEP),
        annotations={
            str(k): cut(v)
            for k, v in (meta.get("annotations") or {}).items()
            if k != "kubectl.kubernetes.io/last-applied-configuration"
        },
        spec=dict(obj.get("spec") or {}),
        status=st,
        events=[],
    )


def as_object(record: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The object of kind ``kind`` a record describes (metadata, spec and status as they
    were), for what shows that object: :func:`_base` read back."""
    return {
        "apiVersion": wire.API_VERSION,
        "kind": kind,
        "metadata": {
            "name": record.get("name"),
            "namespace": record.get("namespace"),
            "uid": record.get("uid"),
            "creationTimestamp": record.get("created"),
            "labels": record.get("labels") or {},
        },
        "spec": record.get("spec") or {},
        "status": record.get("status") or {},
    }


def events(items: Sequence[Mapping[str, Any]]) -> list[EventRecord]:
    """The last :data:`MAX_EVENTS` Events (oldest first), messages cut."""
    out: list[EventRecord] = []
    for e in items[-MAX_EVENTS:]:
        out.append(
            EventRecord(
                type=str(e.get("type") or ""),
                reason=str(e.get("reason") or ""),
                message=cut(e.get("message")),
                time=e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp"),
                count=int(e.get("count") or 1),
            )
        )
    return out


def _trainer(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        if c.get("name") == "trainer":
            return cast(Mapping[str, Any], c)
    return {}


def node_timings(pods: Sequence[Mapping[str, Any]]) -> list[NodeTiming]:
    """Each node Pod: where it ran, when its trainer started and ended, how it ended."""
    out: list[NodeTiming] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        rank = str((meta.get("labels") or {}).get(wire.LABEL_NODE_RANK, ""))
        trainer = _trainer(pod)
        state = trainer.get("state") or {}
        ended = state.get("terminated") or {}
        running = state.get("running") or {}
        out.append(
            NodeTiming(
                node=int(rank) if rank.isdigit() else len(out),
                pod=str(meta.get("name") or ""),
                nodeName=(pod.get("spec") or {}).get("nodeName"),
                phase=str((pod.get("status") or {}).get("phase") or "Unknown"),
                started=ended.get("startedAt") or running.get("startedAt"),
                finished=ended.get("finishedAt"),
                exitCode=ended.get("exitCode"),
                reason=ended.get("reason"),
                restarts=int(trainer.get("restartCount") or 0),
            )
        )
    return sorted(out, key=lambda n: n.get("node", 0))


def attempts(
    st: Mapping[str, Any], items: Sequence[Mapping[str, Any]], deleted: bool
) -> list[AttemptTiming]:
    """The gang's attempts: each ``Restarting`` Event closed one (its time and message);
    the last runs from the last restart to the end. Attempts whose Event expired (the
    apiserver keeps Events for an hour) are listed without times."""
    restarts = [e for e in events(items) if e.get("reason") == "Restarting"]
    count = max(int(st.get("restarts") or 0), len(restarts))
    restarts = [EventRecord()] * (count - len(restarts)) + restarts
    out: list[AttemptTiming] = []
    started = st.get("startTime")
    for i, event in enumerate(restarts):
        out.append(
            AttemptTiming(
                attempt=i,
                started=started,
                ended=event.get("time"),
                outcome="Restarted",
                message=str(event.get("message") or ""),
            )
        )
        started = event.get("time")
    phase = str(st.get("phase") or "Pending")
    outcome = "Deleted" if deleted and phase not in TERMINAL else phase
    failed = (st.get("failure") or {}).get("message") if phase == "Failed" else ""
    out.append(
        AttemptTiming(
            attempt=len(restarts),
            started=started,
            ended=st.get("completionTime"),
            outcome=outcome,
            message=cut(failed),
        )
    )
    return out


def log_tails(tails: Mapping[int, Sequence[str]], failing: int | None) -> dict[str, list[str]]:
    """The last :data:`TAIL_LINES` lines of at most :data:`MAX_TAIL_NODES` nodes (the
    failing node's always), lines cut; keyed by the node rank as a string (JSON)."""
    nodes = sorted(tails)[:MAX_TAIL_NODES]
    if failing is not None and failing in tails and failing not in nodes:
        nodes = [*nodes[:-1], failing]
    return {str(n): [cut(line) for line in list(tails[n])[-TAIL_LINES:]] for n in sorted(nodes)}


def trainingrun_record(
    run: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    run_events: Sequence[Mapping[str, Any]],
    tails: Mapping[int, Sequence[str]],
    now: datetime,
    *,
    deleted: bool = False,
) -> Record:
    """A TrainingRun's record: what its status says, and the last attempt's node Pods,
    Events and log tails (``tails``: node rank -> its trainer's last lines)."""
    record = _base(run, "TrainingRun", now, deleted)
    st = record["status"]
    failure = cast(Failure | None, st.get("failure"))
    progress = st.get("progress") if isinstance(st.get("progress"), dict) else None
    spec_checkpoints = record["spec"].get("checkpoints")
    seconds = (progress or {}).get("checkpointSeconds")
    model = st.get("model")
    more = Record(
        failure=failure,
        failureClass=(failure or {}).get("class"),
        failureReason=(failure or {}).get("reason"),
        model=cast(ModelRef, model) if isinstance(model, dict) else None,
        nodes=node_timings(pods),
        attempts=attempts(st, run_events, deleted),
        excludedNodes=list(st.get("excludedNodes") or []),
        checkpoints=(
            {"spec": spec_checkpoints, "seconds": seconds} if spec_checkpoints or seconds else None
        ),
        metrics=dict((progress or {}).get("metrics") or {}),
        progress=progress,
        logTails=log_tails(tails, (failure or {}).get("node")),
        events=events(run_events),
    )
    record.update(more)
    return record


def sweep_record(
    sweep: Mapping[str, Any],
    sweep_events: Sequence[Mapping[str, Any]],
    now: datetime,
    *,
    deleted: bool = False,
) -> Record:
    """A Sweep's record: its spec and final status (trials, the best one), its Events."""
    record = _base(sweep, "Sweep", now, deleted)
    record["events"] = events(sweep_events)
    return record


def environment_record(
    env: Mapping[str, Any],
    env_events: Sequence[Mapping[str, Any]],
    build_log: Sequence[str],
    now: datetime,
) -> Record:
    """An Environment build's record: its spec, its status (image digest, the build's
    outcome), its Events and the tail of the build's log (node ``"0"`` of ``logTails``)."""
    record = _base(env, "Environment", now, False)
    record["events"] = events(env_events)
    record["finished"] = record["finished"] or timestamp(now)
    if build_log:
        record["logTails"] = log_tails({0: build_log}, None)
    return record
