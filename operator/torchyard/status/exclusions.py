"""Bad nodes: which nodes a run leaves out from now on, and a node that went down under it.

A node goes into the run's ``status.excludedNodes`` ({node, reason, evidence, since}) when
a failure of the run points at the node rather than at the code:

- the failure class is a node fault (``classes.Rule.node_fault``: a GPU's Xid/ECC line);
- a ``policy.logRules`` line with ``action: excludeNode`` matched in the failed Pod's output;
- the node went NotReady, unreachable or unhealthy under a running gang
  (:func:`down_failure`: the attempt fails at once, not after the pod-eviction timeout);
- the taint manager evicted a node Pod (``DeletionByTaintManager``);
- the failing rank ran on the same node in two consecutive failures (:func:`repeated_on`,
  ``RepeatedFailure``): not when it is the same error at the same step (the code's, which
  stops the retries), a failure the code alone explains (a class that is not retryable:
  out of memory, a missing module) or a cascade (a collective timeout that no earlier failure
  explained names a symptom's node, not the root cause's).

:func:`of_failure` is the entry a decided failure adds (a restart's, and the one that
ends the run: a GpuXid with no retry left still names its node, for ``torchyard describe``
and whoever runs there next), :func:`merged` the list with it (a node is listed once, with
the first reason and time; at most ``MAX_EXCLUDED``), and :func:`unhealthy` what a Node
object says of itself. The next attempt's Pods get a node affinity ``NotIn`` these nodes
(``planning.exclusions``). Called by the controller's restart and its conclusion; pure;
tested in tests/unit/status/test_exclusions.py and tests/unit/controller/test_bad_nodes.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from torchyard.api import wire
from torchyard.launch import classes
from torchyard.status import failures
from torchyard.status.conditions import timestamp
from torchyard.status.failures import Failure

MAX_EXCLUDED = 64  # status.excludedNodes maxItems
NOT_READY = "NodeNotReady"
UNHEALTHY = "NodeUnhealthy"
TAINT_EVICTION = "DeletionByTaintManager"
LOG_RULE = "LogRule"
REPEATED = "RepeatedFailure"
# Failures that say nothing of the node they happened on: the scheduler took the Pod
# back, or it never started.
NOT_THE_NODE = frozenset({"Preempting", "Preempted"}) | failures.NOT_RESTARTED
NOT_READY_TAINTS = wire.NOT_READY_TAINTS
# Conditions that say a node is unhealthy when True (node-problem-detector's among them).
BAD_CONDITIONS = frozenset(
    {"NetworkUnavailable", "KernelDeadlock", "ReadonlyFilesystem", "GPUUnhealthy", "XidError"}
)


def unhealthy(node: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, evidence) when the Node says it cannot run Pods well, else None: its Ready
    condition is False or Unknown, it carries a not-ready/unreachable taint, or a
    condition of ``BAD_CONDITIONS`` is True."""
    for cond in node.get("status", {}).get("conditions", []) or []:
        kind, state = cond.get("type"), cond.get("status")
        if kind == "Ready" and state in ("False", "Unknown"):
            why = cond.get("reason") or ""
            return NOT_READY, f"condition Ready={state}" + (f" ({why})" if why else "")
        if kind in BAD_CONDITIONS and state == "True":
            return UNHEALTHY, f"condition {kind}=True" + (
                f" ({cond['reason']})" if cond.get("reason") else ""
            )
    for taint in node.get("spec", {}).get("taints", []) or []:
        if taint.get("key") in NOT_READY_TAINTS:
            return NOT_READY, f"taint {taint.get('key')}:{taint.get('effect')}"
    return None


def _rank(pod: Mapping[str, Any]) -> int:
    value = str(pod.get("metadata", {}).get("labels", {}).get(wire.LABEL_NODE_RANK, "0"))
    return int(value) if value.isdigit() else 0


def down_failure(
    pods: Sequence[Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]]
) -> Failure | None:
    """The platform failure of a gang whose unfinished node Pod is bound to a node that
    :func:`unhealthy` says is down (the lowest node rank is named), else None. Without
    it the gang would wait for the taint manager's eviction (5 minutes by default) while
    its other ranks block in a collective."""
    by_name = {n.get("metadata", {}).get("name"): n for n in nodes}
    for pod in sorted(pods, key=_rank):
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        node_name = pod.get("spec", {}).get("nodeName")
        node = by_name.get(node_name) if node_name else None
        found = unhealthy(node) if node is not None else None
        if found is None:
            continue
        reason, evidence = found
        name, rank = pod.get("metadata", {}).get("name"), _rank(pod)
        what = "NotReady" if reason == NOT_READY else "unhealthy"
        return {
            "reason": reason,
            "platform": True,
            "pod": name,
            "node": rank,
            "nodeName": str(node_name),
            "exclude": {"reason": reason, "evidence": evidence},
            "message": f"node Pod {name} (node rank {rank}) runs on node {node_name}, which is "
            f"{what} ({evidence}): the attempt is stopped now, not after the pod-eviction "
            "timeout, and the node is left out of the next ones",
        }
    return None


def _blames_node(failure: Mapping[str, Any]) -> bool:
    """Whether ``failure`` (a decided one, or ``status.lastFailure``) may say something of
    the node it happened on (see the module docstring)."""
    if failure.get("reason") in NOT_THE_NODE:
        return False
    rule = classes.BY_NAME.get(str(failure.get("failureClass") or failure.get("class") or ""))
    return rule is None or (rule.retryable and not rule.cascade)


def _evidence_line(failure: Mapping[str, Any]) -> str:
    """'PythonException at step 120: ValueError: bad' (one line of evidence)."""
    kind = failure.get("failureClass") or failure.get("class") or failure.get("reason")
    step = f" at step {failure['step']}" if failure.get("step") is not None else ""
    lines = str(failure.get("message") or "").strip().splitlines()
    return f"{kind}{step}" + (f": {lines[-1].strip()[:100]}" if lines else "")


def repeated_on(
    failure: Mapping[str, Any], last: Mapping[str, Any] | None
) -> dict[str, str] | None:
    """The ``RepeatedFailure`` exclusion ({reason, evidence}) when ``failure`` and ``last``
    (``status.lastFailure``: the failure of the attempt before) happened on the same node
    and both may blame it, unless they are the same error at the same step; else None."""
    node = failure.get("nodeName")
    if not node or not last or last.get("nodeName") != node:
        return None
    if not (_blames_node(failure) and _blames_node(last)):
        return None
    if classes.signature(failure) == classes.signature(last):
        return None  # deterministic: the code's error, which stops the retries
    return {
        "reason": REPEATED,
        "evidence": f"two consecutive failures on {node}: {_evidence_line(last)}; "
        f"then {_evidence_line(failure)}",
    }


def of_failure(
    failure: Mapping[str, Any] | None,
    now: datetime,
    last: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The ``status.excludedNodes`` entry ``failure`` calls for, None when it blames no
    node (or its node is not known); ``last`` is ``status.lastFailure``, the failure of
    the attempt before (:func:`repeated_on`)."""
    if not failure or not failure.get("nodeName"):
        return None
    entry: Mapping[str, Any] | None = failure.get("exclude")
    if entry is None:
        rule = classes.BY_NAME.get(str(failure.get("failureClass") or ""))
        if rule is not None and rule.node_fault:
            evidence = failure.get("matched") or failure.get("message") or ""
            entry = {"reason": rule.name, "evidence": str(evidence)}
    if entry is None:
        entry = repeated_on(failure, last)
    if entry is None:
        return None
    return {
        "node": str(failure["nodeName"]),
        "reason": str(entry.get("reason") or ""),
        "evidence": str(entry.get("evidence") or "")[:300],
        "since": timestamp(now),
    }


def merged(
    previous: Sequence[Mapping[str, Any]] | None, entry: Mapping[str, Any] | None
) -> list[dict[str, Any]] | None:
    """``previous`` with ``entry`` added unless its node is listed already (None: empty)."""
    out = [dict(e) for e in previous or []]
    if entry is not None and all(e.get("node") != entry.get("node") for e in out):
        out.append(dict(entry))
    return out[-MAX_EXCLUDED:] or None
