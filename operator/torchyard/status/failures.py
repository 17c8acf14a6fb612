"""TrainingRun failures as pure functions of the node Pods: which failed, why, and first.

``observe_failure`` reads one Pod (the launcher's JSON termination message, the Pod's
and the container's reasons); ``first_failure`` names the one that came first (by when the
failing rank exited; of stalls, the rank every node's stalled ranks wait for:
``culprits``; of a collective timeout nothing explains, the node Pods it waited for:
``waited_for``) and ``settling`` how long the controller waits for the gang's other
Pods to report before deciding; ``lost_failure`` tells which node Pod a running gang lost;
``archive_failures`` which nodes succeeded without their archive (optional outputs);
``public_failure`` and ``failure_message`` are what ``status.failure`` and Events show.
The controller's failure policy decides with these; ``status.trainingruns`` folds the
decided failure into the status; local mode names its failing rank with the same
``failure_message``. Tested as tables in ``tests/unit/status/``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, TypedDict, cast

from torchyard.api import wire
from torchyard.api.times import parse_time
from torchyard.launch import classes
from torchyard.launch.contract import (
    LOCAL_WORLD_SIZE,
    NO_PROGRESS_REASON,
    PROGRESS_LINE,
    STALLED_REASON,
)
from torchyard.status import culprits

NODE_RANK_LABEL = wire.LABEL_NODE_RANK
# Failures of the platform, not of the user's code: retried without using backoffLimit.
PLATFORM_REASONS = frozenset(
    {
        "Evicted",
        "NodeLost",
        "PodLost",
        "Preempting",
        "Preempted",
        "Shutdown",
        "NodeShutdown",
        "Terminated",
        "UnexpectedAdmissionError",
        "NodeAffinity",
        "OutOfcpu",
        "OutOfmemory",
    }
)
# Waiting reasons that never resolve by themselves with restartPolicy Never.
STUCK_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
# The launcher's outputs could not be archived: training again would not help.
ARCHIVE_FAILED = "ArchiveFailed"
# Attempts resumed from checkpoints kept failing before any progress
# (torchyard.checkpoint.NO_PROGRESS_REASON, said by the launcher): restarting again would not help.
NO_PROGRESS = NO_PROGRESS_REASON
NOT_RESTARTED = STUCK_REASONS | {ARCHIVE_FAILED, NO_PROGRESS}
# Reasons of the launcher's termination message that say more than the kubelet's
# generic "Error" for the same exit (OOMKilled: the OOM killer ended one rank, not the
# container's main process, which a runtime need not report as OOMKilled).
# Stalled: the launcher found a rank that made no progress past the stall timeout.
STALLED = STALLED_REASON
# The kubelet ended the Pod at its activeDeadlineSeconds: every node Pod of the gang has
# the same deadline and ends by it within moments, each with this reason.
DEADLINE_EXCEEDED = "DeadlineExceeded"
LAUNCHER_REASONS = frozenset({ARCHIVE_FAILED, "LaunchError", "OOMKilled", NO_PROGRESS, STALLED})
GENERIC = (None, "", "Error")
NODE_LOST = "NodeLost"


class Failure(TypedDict, total=False):
    """A failure, as the controller's failure policy decides on it: the fields of
    ``status.failure`` (see ``public_failure``) and bookkeeping keys that stay out of it:
    ``platform`` (the platform's fault, not the user's code), ``finishedAt`` (the
    kubelet's) and ``exitedAt`` (when the failing rank exited, Unix time)."""

    reason: str
    message: str
    pod: str | None
    node: int | None
    rank: int | None
    exitCode: int | None
    signal: Any
    platform: bool
    finishedAt: str
    exitedAt: float | None
    # status.failure.class, retryable, advice (``classes``); the failing rank's last
    # reported step (``torchyard.progress``), for "the same error at the same step"
    failureClass: str
    retryable: bool
    advice: str
    step: int
    # bad nodes (``status.exclusions``): the Node the failed Pod ran on, what the class
    # matched, and an exclusion the failure itself calls for ({reason, evidence})
    nodeName: str
    matched: str
    exclude: dict[str, str]
    # a Stalled failure: the launcher's stall record, with its stalled ranks' places
    # (``suspects``) that ``culprits.across_nodes`` compares across nodes
    stall: dict[str, Any]


def _trainer(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for cs in pod.get("status", {}).get("containerStatuses", []) or []:
        if cs.get("name") == "trainer":
            return dict(cs)
    return {}


def _termination(message: str) -> dict[str, Any]:
    """The launcher's termination message, or the log tail the kubelet put there instead
    (a launcher that was killed wrote none). The launcher's own ``[torchyard] progress``
    lines are left out of a log tail: they are the progress poll's, not the failure's."""
    try:
        data = json.loads(message)
    except ValueError:
        kept = [line for line in message.splitlines() if not line.startswith(PROGRESS_LINE)]
        text = "\n".join(kept).strip()
        return {"message": text} if text else {}
    return data if isinstance(data, dict) else {}


def in_place_said(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """What the ended node Pods' launchers said of the last in-place restart (their
    termination messages' ``inPlace``: ``launch.coordination.REPORTED``)."""
    found = []
    for pod in pods:
        ended = (_trainer(pod).get("state") or {}).get("terminated") or {}
        said = _termination(str(ended.get("message") or "")).get("inPlace") if ended else None
        if isinstance(said, Mapping):
            found.append(said)
    return found


def newest_in_place(said: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """Of what launchers said of their in-place restarts, the newest (the most counted)."""
    return max(said, key=lambda s: int(s.get("inPlace") or 0), default=None)


def observe_failure(pod: Mapping[str, Any]) -> Failure | None:
    """The failure of one Pod, or None while it has not failed."""
    status = pod.get("status", {})
    meta = pod.get("metadata", {})
    node = meta.get("labels", {}).get(NODE_RANK_LABEL)
    base: Failure = {
        "pod": meta.get("name"),
        "node": int(node) if node is not None else None,
    }
    trainer = _trainer(pod)
    waiting = trainer.get("state", {}).get("waiting") or {}
    if waiting.get("reason") in STUCK_REASONS:
        return {
            **base,
            "reason": waiting["reason"],
            "message": waiting.get("message", ""),
            "platform": False,
            "finishedAt": "",
        }
    if status.get("phase") != "Failed":
        return None
    term = trainer.get("state", {}).get("terminated") or {}
    info = _termination(term.get("message") or "")
    # The Pod's reason (Evicted, DeadlineExceeded, ...) first, then the container's
    # (OOMKilled, ...); the launcher's own reason where both only say "Error".
    specific = [r for r in (status.get("reason"), term.get("reason")) if r not in GENERIC]
    launcher = [info["reason"]] if info.get("reason") in LAUNCHER_REASONS else []
    fallback = [status.get("reason"), term.get("reason"), info.get("reason"), "Error"]
    reason = next(r for r in [*specific, *launcher, *fallback] if r)
    conditions = status.get("conditions", []) or []
    disrupted = any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in conditions
    )
    failure = launcher_failure(
        info,
        {
            **base,
            "exitCode": term.get("exitCode", info.get("exitCode")),
            "signal": term.get("signal", info.get("signal")),
            "reason": reason,
            "message": status.get("message") or "",
            "platform": reason in PLATFORM_REASONS or disrupted,
            "finishedAt": term.get("finishedAt") or "",
        },
    )
    if pod.get("spec", {}).get("nodeName") and failure["pod"] == meta.get("name"):
        failure["nodeName"] = str(pod["spec"]["nodeName"])
    if not failure["platform"]:
        classify_failure(failure, info)
    return failure


def launcher_failure(info: Mapping[str, Any], base: Failure) -> Failure:
    """A failed node's failure as its launcher's termination message ``info`` tells it,
    over ``base`` (what the node's Pod or local process says: pod, node, reason, exit
    code, signal, ``finishedAt``, platform; its message when the launcher has none): the
    failing rank and its message, when it exited (``exitedAt``; else base's
    ``finishedAt``), its last step, a stall's record (its suspects, for ``culprits``), the
    node from the launcher's ``nodeRank`` where base has none and, of MPI, the node of
    the rank mpirun named (``rankNode``; its Pod, ``<run>-<node>``, named after it). The
    one reading of a launcher's word for node Pods (``observe_failure``) and local mode's
    nodes (``torchyard.local.results.node_failure``); not classified here."""
    failure: Failure = {
        **base,
        "rank": info.get("rank"),
        "message": info.get("message") or base.get("message") or "",
        "exitedAt": _exited_at(info, {"finishedAt": base.get("finishedAt")}),
    }
    said = info.get("nodeRank")
    if failure.get("node") is None and isinstance(said, int) and not isinstance(said, bool):
        failure["node"] = said
    rank_node = info.get("rankNode")
    if isinstance(rank_node, int) and rank_node != failure.get("node"):
        # MPI: node 0's launcher reports the rank mpirun named, which ran on another node
        failure["node"] = rank_node
        if failure.get("pod"):
            failure["pod"] = f"{str(failure['pod']).rsplit('-', 1)[0]}-{rank_node}"
    if isinstance(info.get("step"), int):
        failure["step"] = info["step"]
    if failure.get("reason") == STALLED and isinstance(info.get("stall"), dict):
        failure["stall"] = info["stall"]
    return failure


def classify_failure(failure: Failure, info: Mapping[str, Any]) -> None:
    """Add the failure's class, whether retrying may help and what to do
    (``classes.classify``), and what the run's ``policy.logRules`` said of it. ``info`` is
    the launcher's termination message. Used for node Pods and for local runs alike."""
    found = classes.classify(classes.evidence_of(failure, info.get("evidence")))
    if found is not None:
        rule, matched = found
        failure["failureClass"] = rule.name
        failure["retryable"] = rule.retryable
        failure["advice"] = f"{rule.advice} (matched: {matched})"
        failure["matched"] = matched
    rule_hit = info.get("logRule")
    if isinstance(rule_hit, dict) and rule_hit.get("action") == "excludeNode":
        failure["exclude"] = {
            "reason": "LogRule",
            "evidence": f"policy.logRules[{rule_hit.get('index')}] matched "
            f"{str(rule_hit.get('line', ''))[:200]!r}",
        }
    if isinstance(rule_hit, dict) and rule_hit.get("action") == "cancelRetries":
        failure["retryable"] = False
        failure["advice"] = (
            f"policy.logRules[{rule_hit.get('index')}] ({rule_hit.get('pattern')!r}) matched "
            f"{str(rule_hit.get('line', ''))[:200]!r}: no retry. "
            + str(failure.get("advice") or "")
        ).strip()


def _exited_at(info: Mapping[str, Any], term: Mapping[str, Any]) -> float | None:
    """When the failure happened, as Unix time: the launcher's ``exitedAt`` (when the
    failing rank exited, to the microsecond; a finite number, as the launcher writes it),
    else the kubelet's ``finishedAt`` (to the second, and only once the whole container
    ended), else None."""
    exited = info.get("exitedAt")
    if isinstance(exited, (int, float)) and not isinstance(exited, bool) and math.isfinite(exited):
        return float(exited)
    finished = term.get("finishedAt")
    if not finished:
        return None
    try:
        when = parse_time(finished)
    except ValueError:
        return None
    return when.timestamp() if when is not None else None


class Exit(TypedDict):
    """A rank that exited with status 0 (the launcher's ``earlyExits``), and its node."""

    rank: int
    node: int | None
    exitedAt: float
    step: int | None


def exits_of(info: Mapping[str, Any], node: int | None) -> list[Exit]:
    """The ranks a launcher's termination message says exited with status 0."""
    found = info.get("earlyExits")
    exits: list[Exit] = []
    for item in found if isinstance(found, list) else []:
        if not isinstance(item, Mapping):
            continue
        rank, at, step = item.get("rank"), item.get("exitedAt"), item.get("step")
        if isinstance(rank, int) and isinstance(at, (int, float)) and math.isfinite(at):
            exits.append(
                {
                    "rank": rank,
                    "node": node,
                    "exitedAt": float(at),
                    "step": step if isinstance(step, int) else None,
                }
            )
    return exits


def _pod_exits(pod: Mapping[str, Any]) -> list[Exit]:
    term = _trainer(pod).get("state", {}).get("terminated") or {}
    if not term.get("message"):
        return []
    return exits_of(_termination(str(term["message"])), _rank_label(pod))


def _waits_for_peers(failure: Mapping[str, Any]) -> bool:
    """Whether ``failure`` may be what its rank saw of a peer that went away: a class that
    is a cascade or a symptom (a collective that lost its peer or timed out, a store that
    went away), or a stall of ranks waiting in a collective or nowhere known."""
    rule = classes.BY_NAME.get(str(failure.get("failureClass") or ""))
    if rule is not None and (rule.cascade or rule.symptom):
        return True
    stall = failure.get("stall")
    if failure.get("reason") != STALLED or not isinstance(stall, Mapping):
        return False
    found = stall.get("suspects")
    suspects = [s for s in found if isinstance(s, Mapping)] if isinstance(found, list) else []
    if stall.get("collective") or any(s.get("inCollective") for s in suspects):
        return True
    # None of them known to be stuck on its own, at a place in the script outside
    # torch.distributed: ranks whose dumps showed no frame, or that left none (seen in
    # local mode: a rank that lost its peer raised, and its interpreter hung as it
    # finalized, in "Garbage-collecting" with no frame, or was past faulthandler and
    # died of the stack signal) wait for the others as well.
    return not any(s.get("file") for s in suspects)


# A rank that exits with status 0 closes its connections while its interpreter winds
# down, before its process ends, and its launcher notes the end later still (a thread
# that waits for it; a loaded machine delays both): a peer can fail of losing it before
# its recorded exit (0.3 s seen on the real node at load 35). Less than
# FAILURE_SETTLE_SECONDS, after which local mode stops the other nodes (a rank may exit 0
# on that SIGTERM: stopped with the others, not their cause).
EARLY_EXIT_SLACK_SECONDS = 2.0


def early_exit(failure: Failure, exits: Sequence[Exit]) -> Failure:
    """``failure``, or the rank that exited with status 0 before it (or less than
    EARLY_EXIT_SLACK_SECONDS after it) when ``failure`` may be what the ranks saw of
    losing it (``_waits_for_peers``): a rank that leaves early while the others still
    train is the cause, class EarlyExit. The first such exit is named."""
    at = failure.get("exitedAt")
    if at is None or not _waits_for_peers(failure):
        return failure
    latest = at + EARLY_EXIT_SLACK_SECONDS
    before = [e for e in exits if e["exitedAt"] < latest and e["rank"] != failure.get("rank")]
    if not before:
        return failure
    first = min(before, key=lambda e: (e["exitedAt"], e["rank"]))
    step = f"at step {first['step']}" if first["step"] is not None else "before its first step"
    then = failure_message(failure).splitlines()[0]
    message = (
        f"rank {first['rank']} (node {first['node']}) exited with status 0 {step} while "
        f"the other ranks still trained; {then}"
    )
    pod = failure.get("pod")
    out: Failure = {
        "pod": f"{str(pod).rsplit('-', 1)[0]}-{first['node']}" if pod else None,
        "node": first["node"],
        "rank": first["rank"],
        "exitCode": 0,
        "reason": classes.EARLY_EXIT.name,
        "message": message,
        "platform": False,
        "finishedAt": failure.get("finishedAt", ""),
        "exitedAt": first["exitedAt"],
    }
    if first["step"] is not None:
        out["step"] = first["step"]
    classify_failure(out, {})
    return out


def decide(failures: Sequence[Failure], exits: Sequence[Exit] = ()) -> Failure | None:
    """Of a gang's failures (one per failed node) and the ranks that exited with status 0
    (``exits``), the one the run failed of: the earliest, node rank breaking ties; a
    failure that explains a cascade over the cascade (``classes.prefer``); of stalls, the
    rank every node's stalled ranks wait for (``culprits.across_nodes``); and a rank that
    left early before ranks that failed waiting for it (``early_exit``). The one decision
    of node Pods (``first_failure``) and local mode (``torchyard.local.results``)."""
    if not failures:
        return None
    ordered = sorted(failures, key=lambda f: (f.get("exitedAt") or math.inf, f.get("node") or 0))
    # A collective timeout is what the others see of the rank that hung or died: a
    # failure that explains it wins over it (``classes.prefer``).
    chosen = next(f for f in ordered if f is classes.prefer(ordered))
    if chosen.get("reason") == STALLED:
        # Each node's launcher named one of its own ranks: the stacks of every node's
        # stalled ranks tell which one the others wait for.
        across = culprits.across_nodes(ordered)
        chosen = cast(Failure, dict(across)) if across is not None else chosen
    return early_exit(chosen, exits)


def first_failure(pods: Sequence[Mapping[str, Any]]) -> Failure | None:
    """The failure that came first (``decide``) of the node Pods.

    A rank that fails takes its peers on the other nodes down with it (gloo's or NCCL's
    "Connection closed by peer" a few milliseconds later), often within the second the
    kubelet's ``finishedAt`` counts in, and the culprit's Pod may end later still (its
    launcher stops its siblings first): the launcher's ``exitedAt`` tells them apart."""
    failures = [f for f in (observe_failure(p) for p in pods) if f is not None]
    chosen = decide(failures, [e for p in pods for e in _pod_exits(p)])
    return on_its_node(waited_for(chosen, pods), pods) if chosen is not None else None


def _procs_per_node(pod: Mapping[str, Any]) -> int | None:
    """The node Pod's ranks per node (the launcher's ``LOCAL_WORLD_SIZE``), None unknown."""
    for container in pod.get("spec", {}).get("containers", []) or []:
        for var in container.get("env", []) or []:
            if var.get("name") == LOCAL_WORLD_SIZE and str(var.get("value", "")).isdigit():
                return int(var["value"])
    return None


class Waited(NamedTuple):
    """A node of the gang that still ran when a failure was decided: its node rank, its
    Pod (None in local mode) and its ranks per node (None: unknown)."""

    node: int | None
    pod: str | None
    procs: int | None

    def said(self) -> str:
        """'node 1 (Pod r-1, rank 1)': the node, its Pod and its ranks, where known."""
        inside = [f"Pod {self.pod}"] if self.pod else []
        if self.node is not None and self.procs:
            first, last = self.node * self.procs, self.node * self.procs + self.procs - 1
            inside.append(f"rank {first}" if self.procs == 1 else f"ranks {first}-{last}")
        return f"node {self.node}" + (f" ({', '.join(inside)})" if inside else "")


def waited_for(failure: Failure, pods: Sequence[Mapping[str, Any]]) -> Failure:
    """``waited_for_nodes`` with the gang's node Pods other than the failed one that
    were still Running when it was decided."""
    running = [
        Waited(_rank_label(p), p.get("metadata", {}).get("name"), _procs_per_node(p))
        for p in pods
        if p.get("metadata", {}).get("name") != failure.get("pod")
        and p.get("status", {}).get("phase") == "Running"
    ]
    return waited_for_nodes(failure, running)


def waited_for_nodes(failure: Failure, running: Sequence[Waited]) -> Failure:
    """A collective timeout that no earlier failure explains, with the nodes its
    collective waited for named first in its advice: ``running``, those of the gang still
    running when it was decided. A rank that hung, sleeps or skipped the collective stays
    alive, while the ranks waiting for it in the collective time out; ``settling`` gave
    the others time to report an earlier failure. Any other failure is returned as is.
    The one rule for node Pods (``waited_for``) and local mode
    (``torchyard.local.results.first_failure``: the nodes it stopped)."""
    if failure.get("failureClass") != classes.COLLECTIVE_TIMEOUT.name or not running:
        return failure
    ordered = sorted(running, key=lambda w: (w.node is None, w.node or 0))
    who = f"rank {failure.get('rank')} (node {failure.get('node')})"
    if failure.get("rank") is None:
        who = f"node {failure.get('node')}"
    them = ", ".join(w.said() for w in ordered)
    note = (
        f"{who} timed out in a collective while {them} still ran and had not failed: "
        f"{'its' if len(ordered) == 1 else 'their'} ranks never joined the collective "
        "(hung, much slower, or skipped it; see their logs and stacks)"
    )
    return {**failure, "advice": f"{note}. {failure.get('advice') or ''}".strip()}


def on_its_node(failure: Failure, pods: Sequence[Mapping[str, Any]]) -> Failure:
    """``failure`` with the Node of the Pod it names (``nodeName``), when another Pod
    reported it: an MPI rank's failure comes from node 0's launcher (``rankNode``), yet its
    node is the one that rank ran on, which exclusion must blame."""
    if failure.get("nodeName") or not failure.get("pod"):
        return failure
    for pod in pods:
        if pod.get("metadata", {}).get("name") == failure["pod"]:
            node_name = pod.get("spec", {}).get("nodeName")
            return {**failure, "nodeName": str(node_name)} if node_name else failure
    return failure


# How long after the first failure the controller waits for the gang's other Pods to
# report theirs before deciding which came first (the kubelet notices a container's end
# within about a second, then writes the Pod's status; on a loaded node the Pod of a rank
# that left with status 0 reported more than 3 s after its peers' lost connections, and
# the run was named after them). The wait ends as soon as every Pod has reported.
FAILURE_SETTLE_SECONDS = 10.0
# A stall: every node's launcher finds its ranks quiet on its own clock (checked once a
# second), collects their stacks and archives its logs before its Pod ends; the other
# nodes' reports say which rank the others wait for (``culprits``), so they get longer.
STALL_SETTLE_SECONDS = 20.0


def settling(
    failure: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: datetime
) -> float | None:
    """Seconds to wait before ``failure`` (``first_failure``'s) may decide the run, or
    None to decide now: while it may be what its rank saw of another rank's failure (a
    stall, or a class that is a symptom: a collective that timed out or lost its peer, a
    store that went away; the culprit's peers often report first; or a deadline every node
    Pod shares, which ends each by itself), another Pod of the
    gang still runs (and may yet report the earlier failure) and the failure is younger
    than FAILURE_SETTLE_SECONDS (a stall: STALL_SETTLE_SECONDS). A failure of its own
    kind (an exception, a crash, out of memory, an exit with nothing to say) is decided
    at once: the gang restarts without waiting. A failure time more than the window
    ahead of ``now`` (clocks far apart) or unknown is decided at once, so that no run
    waits for long."""
    others = any(
        p.get("metadata", {}).get("name") != failure.get("pod")
        and p.get("status", {}).get("phase") == "Running"
        for p in pods
    )
    return settle_seconds(failure, others, now.timestamp())


def settle_seconds(failure: Mapping[str, Any], others_running: bool, now: float) -> float | None:
    """``settling``'s rule, for a gang of which ``others_running`` says whether another
    node still runs (local mode asks it of its node processes); ``now`` in Unix time."""
    exited = failure.get("exitedAt")
    if exited is None or not others_running:
        return None
    rule = classes.BY_NAME.get(str(failure.get("failureClass") or ""))
    shared = failure.get("reason") in (STALLED, DEADLINE_EXCEEDED)
    if not shared and (rule is None or not (rule.cascade or rule.symptom)):
        return None
    window = STALL_SETTLE_SECONDS if failure.get("reason") == STALLED else FAILURE_SETTLE_SECONDS
    left = float(exited) + window - now
    return left if 0 < left <= 2 * window else None


def _rank_label(pod: Mapping[str, Any]) -> int | None:
    value = pod.get("metadata", {}).get("labels", {}).get(NODE_RANK_LABEL)
    return int(value) if value is not None and str(value).isdigit() else None


def lost_failure(pod_names: Sequence[str], pods: Sequence[Mapping[str, Any]]) -> Failure | None:
    """The NodeLost failure of a running gang that lost a node Pod, or None.

    ``pod_names[i]`` is the name of node ``i``'s Pod, ``pods`` the Pods of the current
    attempt. A Pod is lost when it is gone (its node was deleted and the Pod with it, or
    someone deleted it) or is being deleted before it finished (evicted from a node that
    stayed NotReady past its toleration, or deleted). The lowest node rank is named.
    """
    by_rank = {_rank_label(p): p for p in pods}
    for rank, name in enumerate(pod_names):
        pod = by_rank.get(rank)
        who = f"node Pod {name} (node rank {rank})"
        base: Failure = {"reason": NODE_LOST, "platform": True, "pod": name, "node": rank}
        if pod is None:
            return {
                **base,
                "message": f"{who} disappeared while the run was running: its node was "
                "deleted or lost, or the Pod was deleted (the run's Events name the node)",
            }
        if not pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue  # it finished before it went: its own exit decides
        node = pod.get("spec", {}).get("nodeName") or "(not scheduled)"
        disruption = next(
            (
                c
                for c in pod.get("status", {}).get("conditions", []) or []
                if c.get("type") == "DisruptionTarget" and c.get("status") == "True"
            ),
            None,
        )
        if disruption is not None and disruption.get("reason") == "DeletionByTaintManager":
            how = f"was evicted from node {node}, which is NotReady or unreachable"
            evicted: Failure = {**base, "message": f"{who} {how}", "nodeName": str(node)}
            evicted["exclude"] = {
                "reason": "DeletionByTaintManager",
                "evidence": str(disruption.get("message") or "DisruptionTarget")[:300],
            }
            return evicted
        elif disruption is not None:
            how = f"on node {node} is being deleted ({disruption.get('reason')})"
        else:
            how = f"on node {node} is being deleted"
        return {**base, "message": f"{who} {how}"}
    return None


def archive_failures(pods: Sequence[Mapping[str, Any]]) -> dict[int, str]:
    """Node rank -> what the launcher said, for the Pods that succeeded although their
    archive upload failed (``outputs.optional``: the launcher exits 0 all the same)."""
    failed: dict[int, str] = {}
    for pod in pods:
        if pod.get("status", {}).get("phase") != "Succeeded":
            continue
        term = _trainer(pod).get("state", {}).get("terminated") or {}
        info = _termination(term.get("message") or "")
        if info.get("reason") == ARCHIVE_FAILED:
            rank = _rank_label(pod)
            node = rank if rank is not None else info.get("nodeRank")
            failed[int(node or 0)] = str(info.get("message") or "the archive upload failed")
    return failed


def public_failure(failure: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``status.failure`` (drops the bookkeeping keys)."""
    keep = ("rank", "node", "pod", "exitCode", "signal", "reason", "message", "step", "nodeName")
    public = {k: failure[k] for k in keep if failure.get(k) not in (None, "")}
    if failure.get("failureClass"):
        public["class"] = failure["failureClass"]
    for key in ("retryable", "advice"):
        if failure.get(key) not in (None, ""):
            public[key] = failure[key]
    return public


def failure_message(failure: Mapping[str, Any], *, full: bool = False, pod: bool = False) -> str:
    """'rank 3 (node 1) failed (Error, exit code 1): ValueError: bad' (``full``: the whole
    traceback on the following lines; ``pod``: its Pod named too, 'rank 3 (node 1, Pod
    gpt-1)'). The one wording of a failure: the conditions, Events, local mode and the
    SDK's and CLI's (``sdk.runs.failure_text``)."""
    where = f", Pod {failure['pod']}" if pod and failure.get("pod") else ""
    if failure.get("rank") is not None:
        who = f"rank {failure['rank']} (node {failure.get('node')}{where})"
    elif failure.get("node") is not None:
        who = f"node {failure['node']}" + (f" ({where[2:]})" if where else "")
    else:
        who = "the run" + (f" ({where[2:]})" if where else "")
    how = []
    if failure.get("exitCode") is not None:
        how.append(f"exit code {failure['exitCode']}")
    if failure.get("signal"):
        how.append(f"signal {failure['signal']}")
    head = (
        f"{who} failed ({failure.get('reason') or 'Error'}{', ' + ', '.join(how) if how else ''})"
    )
    text = str(failure.get("message") or "").strip()
    if not text:
        return head
    return f"{head}:\n{text}" if full else f"{head}: {text.splitlines()[-1]}"
