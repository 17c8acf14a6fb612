"""What a local run did: each node's exit (:class:`NodeResult`), the whole run
(:class:`LocalResult`), and which node's failure is the run's (:func:`first_failure`,
ordered by the launcher's ``exitedAt`` as the operator orders failed Pods). Pure; used by
``local.runs`` and the CLI; tested in tests/unit/local/test_mode.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from torchyard.registry import Version
from torchyard.status import failures, steps
from torchyard.status.failures import (
    PLATFORM_REASONS,
    Failure,
    Waited,
    classify_failure,
    decide,
    exits_of,
    failure_message,
    launcher_failure,
    waited_for_nodes,
)


@dataclass
class NodeResult:
    node: int
    exit_code: int
    seconds: float
    termination: dict[str, Any] = field(default_factory=dict)
    started_at: datetime | None = None  # when its launcher started
    finished_at: datetime | None = None  # when it was seen to end


@dataclass
class LocalResult:
    """What a local run did: exit code, failure, where its files went."""

    exit_code: int
    workdir: Path
    nodes: list[NodeResult]
    archive: Path | None = None
    model: Version | None = None
    failure: dict[str, Any] | None = None
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0

    @property
    def in_place(self) -> Mapping[str, Any] | None:
        """The last in-place restart the launchers said (``inPlace`` of their termination
        messages, the most counted), None when the ranks were never restarted."""
        said = [n.termination.get("inPlace") for n in self.nodes]
        return failures.newest_in_place([s for s in said if isinstance(s, Mapping)])

    @property
    def progress(self) -> dict[str, Any] | None:
        """How far the ranks got (``torchyard.progress`` reports), as ``status.progress``
        says it in a cluster, from the launchers' termination messages."""
        by_node = {n.node: n.termination.get("progress") for n in self.nodes}
        summaries = [by_node.get(i) for i in range(max(by_node, default=-1) + 1)]
        return steps.run_progress(
            [s if isinstance(s, dict) else None for s in summaries], datetime.now(timezone.utc)
        )


def first_failure(nodes: Sequence[NodeResult], procs: int | None = None) -> dict[str, Any] | None:
    """The failure the run failed of, with ``node`` and ``exitCode``, decided as the
    operator decides on a gang's node Pods (``failures.decide``; a collective timeout
    names the nodes it waited for: those local mode stopped, ``procs`` ranks each, as the
    operator names the node Pods still running, ``failures.waited_for_nodes``); None when
    every node succeeded."""
    failed = [n for n in nodes if n.exit_code != 0]
    if not failed:
        return None
    # Nodes stopped by us report 'Terminated': they only went down with the one that failed.
    stopped = [n for n in failed if n.termination.get("reason") == STOPPED]
    real = [n for n in failed if n not in stopped] or failed
    exits = [e for n in nodes for e in exits_of(n.termination, _node_of(n))]
    chosen = decide([node_failure(n) for n in real], exits)
    if chosen is None:
        return None
    running = [Waited(_node_of(n), None, procs) for n in stopped if n not in real]
    return dict(waited_for_nodes(chosen, running))


def settle_seconds(nodes: Sequence[NodeResult], running: bool, now: float) -> float | None:
    """Seconds to wait for the nodes still ``running`` before stopping them, or None to
    stop them now: ``failures.settle_seconds`` of the failure decided so far
    (:func:`first_failure` of the ``nodes`` that ended), as the operator asks
    ``failures.settling`` of ``failures.first_failure`` of the node Pods on each change."""
    chosen = first_failure(nodes)
    return None if chosen is None else failures.settle_seconds(chosen, running, now)


# What a node's launcher says when local mode stopped it (SIGTERM) while it still ran.
STOPPED = "Terminated"


def _node_of(node: NodeResult) -> int:
    said = node.termination.get("nodeRank")
    return said if isinstance(said, int) and not isinstance(said, bool) else node.node


def node_failure(node: NodeResult) -> Failure:
    """A failed node's termination message as a failure, read as a node Pod's is
    (``failures.launcher_failure``), classified unless local mode itself ended it."""
    info = node.termination
    reason = str(info.get("reason") or "Error")
    failure = launcher_failure(
        info,
        {
            "pod": None,
            "node": _node_of(node),
            "exitCode": info.get("exitCode", node.exit_code),
            "signal": info.get("signal"),
            "reason": reason,
            "platform": reason in PLATFORM_REASONS,
            "finishedAt": "",
        },
    )
    if reason not in LOCAL_FAULTS:  # the user's code, as for a node Pod
        classify_failure(failure, info)
    return failure


# Reasons that are local mode's own doing, not the script's: nothing to classify.
LOCAL_FAULTS = frozenset({"FinalizeFailed", STOPPED})


def describe_failure(failure: dict[str, Any]) -> str:
    """'rank 3 (node 1) failed (Error, exit code 1):' followed by the whole traceback, then
    the failure's class and advice when a rule of ``launch.classes`` knew it."""
    text = failure_message(failure, full=True)
    if failure.get("failureClass"):
        retry = "retryable" if failure.get("retryable") else "not retryable"
        text += f"\nclass: {failure['failureClass']} ({retry}): {failure.get('advice', '')}"
    return text


__all__ = ["LocalResult", "NodeResult", "describe_failure", "first_failure"]
