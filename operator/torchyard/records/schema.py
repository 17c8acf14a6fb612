"""What a run record holds: the typed shape of ``record.json`` and of the short summary
beside it that listings read (``summary.json``).

A record is what is known of a TrainingRun, a Sweep or an Environment build when it ended
(or was deleted before it ended): its spec and final status as they were, the failure,
the node Pods' and attempts' timings, the tails of the node Pods' logs, its Events and the
model it made. Records are JSON on the registry's volume (``reader``); these TypedDicts
say their keys once, for the builder (``build``), the registry's routes, the CLI and the
web view. Pure; tested in tests/unit/records/.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict, cast

# The record format's own version: a reader refuses nothing, but knows what it reads.
FORMAT = 1
KINDS: dict[str, str] = {
    "TrainingRun": "trainingruns",
    "Sweep": "sweeps",
    "Environment": "environments",
}
Kind = Literal["TrainingRun", "Sweep", "Environment"]


class NodeTiming(TypedDict, total=False):
    """One node Pod of the last attempt, as it ended."""

    node: int  # node rank
    pod: str
    nodeName: str | None  # the Node it ran on
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    started: str | None  # the trainer container's start (RFC 3339)
    finished: str | None
    exitCode: int | None
    reason: str | None
    restarts: int


class AttemptTiming(TypedDict, total=False):
    """One attempt of the gang: from its start to the restart (or the end) that closed it."""

    attempt: int  # 0 for the first
    started: str | None
    ended: str | None
    outcome: str  # Restarted, Succeeded, Failed, Deleted, Running
    message: str


class EventRecord(TypedDict, total=False):
    type: str
    reason: str
    message: str
    time: str | None
    count: int


# ``status.failure``: which rank failed first, and why (its class, whether a retry may
# help, the advice, the traceback's tail in ``message``). ``class`` is a keyword, hence
# the functional form.
Failure = TypedDict(
    "Failure",
    {
        "rank": int | None,
        "node": int | None,
        "pod": str | None,
        "exitCode": int | None,
        "signal": int | None,
        "reason": str | None,
        "message": str | None,
        "class": str | None,
        "retryable": bool | None,
        "advice": str | None,
        "step": int | None,
        "nodeName": str | None,
    },
    total=False,
)


class ModelRef(TypedDict):
    name: str
    version: int


class Summary(TypedDict, total=False):
    """What a listing shows of a record (``summary.json``): small, read in bulk."""

    format: int
    kind: Kind
    namespace: str
    name: str
    uid: str
    phase: str
    deleted: bool  # deleted before it ended: the record holds what was known then
    created: str | None  # metadata.creationTimestamp
    finished: str | None  # status.completionTime, else when it was deleted
    recorded: str  # when the record was written
    labels: dict[str, str]
    experiment: str | None  # the torchyard.dev/experiment label
    sweep: str | None  # the torchyard.dev/sweep label (a trial's Sweep)
    failureClass: str | None
    failureReason: str | None
    model: ModelRef | None


class Record(Summary, total=False):
    """A whole record (``record.json``): the summary's keys and these."""

    spec: dict[str, Any]
    status: dict[str, Any]  # the final status, as it was
    annotations: dict[str, str]
    failure: Failure | None
    nodes: list[NodeTiming]
    attempts: list[AttemptTiming]
    excludedNodes: list[dict[str, Any]]
    checkpoints: dict[str, Any] | None  # spec.checkpoints and the slowest step/save
    metrics: dict[str, float]  # the last value of each metric (status.progress.metrics)
    progress: dict[str, Any] | None  # status.progress as it was last
    logTails: dict[str, list[str]]  # node rank -> the last lines of its trainer's log
    events: list[EventRecord]


SUMMARY_KEYS = frozenset(Summary.__annotations__)


def summary_of(record: Record) -> Summary:
    """The summary keys of ``record``."""
    return cast(Summary, {k: v for k, v in record.items() if k in SUMMARY_KEYS})
