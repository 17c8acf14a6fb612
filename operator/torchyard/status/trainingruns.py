"""TrainingRun status: phase, conditions, node counts and the failure, as pure functions.

``observe_failure`` reads one Pod (the launcher's JSON termination message, the Pod's
and the container's reasons); ``first_failure`` names the one that came first (by when the
failing rank exited) and ``settling`` how long the controller waits for the gang's other
Pods to report before deciding; ``lost_failure`` tells which node Pod a running gang lost;
``archive_failures`` which nodes succeeded without their archive (optional outputs);
``trainingrun_status`` folds the run, its Environment, its Pods, the failure the
controller decided on and the admission decision into the status the controller patches
when it changed; ``restarting_status`` is the status of a gang being restarted. Every
status carries the kstatus conditions too: ``Ready`` (True once the run succeeded, as
kstatus judges a Job), ``Reconciling`` (True until it finished) and ``Stalled`` (True
once it failed).
Tested as tables in ``tests/unit/status/``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypedDict

from torchyard.api import Phase, TrainingRun, wire
from torchyard.status.conditions import condition, merge, progress, timestamp

NODE_RANK_LABEL = wire.LABEL_NODE_RANK
TERMINAL = (Phase.SUCCEEDED.value, Phase.FAILED.value)
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
NOT_RESTARTED = STUCK_REASONS | {ARCHIVE_FAILED}
# Reasons of the launcher's termination message that say more than the kubelet's
# generic "Error" for the same exit (OOMKilled: the OOM killer ended one rank, not the
# container's main process, which a runtime need not report as OOMKilled).
LAUNCHER_REASONS = frozenset({ARCHIVE_FAILED, "LaunchError", "OOMKilled"})
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


@dataclass(frozen=True)
class Observed:
    """What the controller saw of a run's world this time."""

    environment: Mapping[str, Any] | None = None  # the Environment object, None if missing
    pods: Sequence[Mapping[str, Any]] = ()  # Pods of the current attempt
    queued_message: str | None = None  # why the gang is not admitted yet
    lost_pods: Sequence[str] = ()  # Pods of a running gang that vanished
    restarts: int = 0
    failed_attempts: int = 0
    deadline_exceeded: bool = False
    finalized: bool = True  # outputs archived and the model registered (or nothing to do)
    model: Mapping[str, Any] | None = None  # {name, version} of the registered model
    finalizing_message: str = ""
    # The failure the controller's failure policy decided on (a lost node Pod, or the
    # first failed Pod; see ``first_failure``), None when there is none: never recomputed.
    failure: Failure | None = None
    # (reason, message) when the node Pods cannot be created yet (a missing
    # ServiceAccount): the run is Pending with Admitted=False for that reason.
    pending: tuple[str, str] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


def _trainer(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for cs in pod.get("status", {}).get("containerStatuses", []) or []:
        if cs.get("name") == "trainer":
            return dict(cs)
    return {}


def _termination(message: str) -> dict[str, Any]:
    try:
        data = json.loads(message)
    except ValueError:
        return {"message": message.strip()} if message.strip() else {}
    return data if isinstance(data, dict) else {}


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
    failure: Failure = {
        **base,
        "rank": info.get("rank"),
        "exitCode": term.get("exitCode", info.get("exitCode")),
        "signal": term.get("signal", info.get("signal")),
        "reason": reason,
        "message": info.get("message") or status.get("message") or term.get("message") or "",
        "platform": reason in PLATFORM_REASONS or disrupted,
        "finishedAt": term.get("finishedAt") or "",
        "exitedAt": _exited_at(info, term),
    }
    if failure["node"] is None and info.get("nodeRank") is not None:
        failure["node"] = info["nodeRank"]
    return failure


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
        when = datetime.strptime(str(finished), "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return when.replace(tzinfo=timezone.utc).timestamp()


def first_failure(pods: Sequence[Mapping[str, Any]]) -> Failure | None:
    """The failure that came first: the earliest exit, node rank breaking ties.

    A rank that fails takes its peers on the other nodes down with it (gloo's or NCCL's
    "Connection closed by peer" a few milliseconds later), often within the second the
    kubelet's ``finishedAt`` counts in, and the culprit's Pod may end later still (its
    launcher stops its siblings first): the launcher's ``exitedAt`` tells them apart."""
    failures = [f for f in (observe_failure(p) for p in pods) if f is not None]
    if not failures:
        return None
    return min(failures, key=lambda f: (f.get("exitedAt") or math.inf, f["node"] or 0))


# How long after the first failure the controller waits for the gang's other Pods to
# report theirs before deciding which came first (the kubelet notices a container's end
# within about a second, then writes the Pod's status).
FAILURE_SETTLE_SECONDS = 3.0


def settling(
    failure: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: datetime
) -> float | None:
    """Seconds to wait before ``failure`` (``first_failure``'s) may decide the run, or
    None to decide now: while another Pod of the gang still runs (and may yet report an
    earlier failure: the culprit's peers often end first) and the failure is younger than
    FAILURE_SETTLE_SECONDS. A failure time more than that ahead of ``now`` (clocks far
    apart) or unknown is decided at once, so that no run waits for long."""
    exited = failure.get("exitedAt")
    if exited is None:
        return None
    others = [
        p
        for p in pods
        if p.get("metadata", {}).get("name") != failure.get("pod")
        and p.get("status", {}).get("phase") == "Running"
    ]
    if not others:
        return None
    left = float(exited) + FAILURE_SETTLE_SECONDS - now.timestamp()
    return left if 0 < left <= 2 * FAILURE_SETTLE_SECONDS else None


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


def _archive_condition(
    run: TrainingRun, pods: Sequence[Mapping[str, Any]], gen: int | None
) -> dict[str, Any] | None:
    failed = archive_failures(pods)
    if not failed:
        return None
    first = min(failed)
    message = f"node {first}: {failed[first]}"
    if len(failed) > 1:
        message = f"{len(failed)} node(s) did not archive everything; {message}"
    if 0 in failed and run.spec.outputs.register_ is not None:
        message = f"the model was not registered (node 0's outputs are missing); {message}"
    return condition("OutputsArchived", False, ARCHIVE_FAILED, message, observed_generation=gen)


def public_failure(failure: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``status.failure`` (drops the bookkeeping keys)."""
    keep = ("rank", "node", "pod", "exitCode", "signal", "reason", "message")
    return {k: failure[k] for k in keep if failure.get(k) not in (None, "")}


def _counts(total: int, pods: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    phases = [p.get("status", {}).get("phase") for p in pods]
    running = phases.count("Running")
    return {
        "total": total,
        "scheduled": sum(1 for p in pods if p.get("spec", {}).get("nodeName")),
        "running": running,
        "succeeded": phases.count("Succeeded"),
        "failed": phases.count("Failed"),
        "ready": f"{running}/{total}",
    }


def _env_phase(env: Mapping[str, Any] | None) -> tuple[str, str]:
    if env is None:
        return "NotFound", ""
    st = env.get("status", {}) or {}
    return str(st.get("phase") or "Pending"), str(st.get("message") or "")


KSTATUS_TYPES = ("Ready", "Reconciling", "Stalled")


def with_kstatus(
    status: dict[str, Any], previous: Mapping[str, Any] | None, now: datetime
) -> dict[str, Any]:
    """``status`` with Ready, Reconciling and Stalled added from its phase. Their reason
    and message are those of the last condition the phase computation wrote, which is
    the most advanced fact about the run (Admitted after EnvironmentReady, Running after
    Admitted, Failed after Running)."""
    phase = status.get("phase")
    gen = status.get("observedGeneration")
    own = [c for c in status.get("conditions", []) if c["type"] not in KSTATUS_TYPES]
    last = own[-1] if own else {"reason": str(phase), "message": ""}
    reason, message = str(last.get("reason") or phase), str(last.get("message") or "")
    succeeded = phase == Phase.SUCCEEDED.value
    desired = [
        *own,
        condition("Ready", succeeded, reason, message, observed_generation=gen),
        *progress(
            phase not in TERMINAL,
            phase == Phase.FAILED.value,
            reason,
            message,
            observed_generation=gen,
        ),
    ]
    return {**status, "conditions": merge((previous or {}).get("conditions"), desired, now)}


def trainingrun_status(
    run: TrainingRun,
    observed: Observed,
    previous: Mapping[str, Any] | None,
    now: datetime,
) -> dict[str, Any]:
    """The whole status of a valid run (see the module docstring)."""
    prev = dict(previous or {})
    if prev.get("phase") in TERMINAL:
        # A finished run stays finished (its Pods may be cleaned up afterwards).
        return {**prev, "observedGeneration": run.generation}
    return with_kstatus(_trainingrun_status(run, observed, prev, now), prev, now)


def restarting_status(
    previous: Mapping[str, Any],
    generation: int | None,
    restarts: int,
    failed_attempts: int,
    message: str,
    now: datetime,
) -> dict[str, Any]:
    """The status of a gang being restarted: back to Pending, Running=False/Restarting,
    no longer admitted (the next attempt's gang is admitted afresh)."""
    new = {
        **previous,
        "phase": Phase.PENDING.value,
        "restarts": restarts,
        "observedGeneration": generation,
    }
    if failed_attempts:
        new["failedAttempts"] = failed_attempts
    kept = [
        c
        for c in previous.get("conditions", [])
        if c["type"] not in ("Running", "Admitted", *KSTATUS_TYPES)
    ]
    restarting = condition("Running", False, "Restarting", message, observed_generation=generation)
    new["conditions"] = merge(previous.get("conditions"), [*kept, restarting], now)
    return with_kstatus(new, previous, now)


def _trainingrun_status(
    run: TrainingRun,
    observed: Observed,
    prev: Mapping[str, Any],
    now: datetime,
) -> dict[str, Any]:
    gen = run.generation
    total = run.spec.distribution.node_count
    pods = list(observed.pods)
    conds = [condition("Accepted", True, "Valid", "the spec is valid", observed_generation=gen)]
    status: dict[str, Any] = {
        "observedGeneration": gen,
        "worldSize": run.spec.distribution.world_size,
        "nodes": _counts(total, pods),
        "restarts": observed.restarts,
    }
    if observed.failed_attempts:
        status["failedAttempts"] = observed.failed_attempts
    for key in ("startTime",):
        if prev.get(key):
            status[key] = prev[key]

    def finish(phase: Phase, failure: Failure | None = None) -> dict[str, Any]:
        status["phase"] = phase.value
        status["completionTime"] = timestamp(now)
        status.setdefault("startTime", timestamp(now))
        if failure is not None:
            status["failure"] = public_failure(failure)
            msg = failure_message(failure)
            conds.append(
                condition("Running", False, str(failure["reason"]), msg, observed_generation=gen)
            )
            conds.append(
                condition("Failed", True, str(failure["reason"]), msg, observed_generation=gen)
            )
        else:
            conds.append(
                condition(
                    "Running", False, "Completed", "all nodes finished", observed_generation=gen
                )
            )
            conds.append(
                condition(
                    "Succeeded",
                    True,
                    "Completed",
                    f"all {total} node(s) succeeded",
                    observed_generation=gen,
                )
            )
        status["conditions"] = merge(prev.get("conditions"), conds, now)
        return status

    env_phase, env_message = _env_phase(observed.environment)
    if env_phase == "Failed":
        conds.append(
            condition(
                "EnvironmentReady", False, "EnvironmentFailed", env_message, observed_generation=gen
            )
        )
        return finish(
            Phase.FAILED,
            {
                "reason": "EnvironmentFailed",
                "message": f"Environment {run.spec.environment} failed: {env_message}",
            },
        )
    if env_phase != "Ready":
        reason = "EnvironmentNotFound" if env_phase == "NotFound" else "EnvironmentNotReady"
        message = (
            f"Environment {run.spec.environment} does not exist in namespace {run.namespace}"
            if env_phase == "NotFound"
            else f"Environment {run.spec.environment} is {env_phase}"
        )
        conds.append(condition("EnvironmentReady", False, reason, message, observed_generation=gen))
        status["phase"] = Phase.PREPARING.value
        status["conditions"] = merge(prev.get("conditions"), conds, now)
        return status
    conds.append(
        condition(
            "EnvironmentReady",
            True,
            "Ready",
            f"Environment {run.spec.environment} is Ready",
            observed_generation=gen,
        )
    )

    if observed.deadline_exceeded:
        return finish(
            Phase.FAILED,
            {
                "reason": "DeadlineExceeded",
                "message": f"the run exceeded activeDeadlineSeconds "
                f"({run.spec.policy.active_deadline_seconds}s)",
            },
        )
    if observed.failure is not None:
        return finish(Phase.FAILED, observed.failure)
    counts = status["nodes"]
    if total and counts["succeeded"] == total:
        archived = _archive_condition(run, pods, gen)
        if archived is not None:
            conds.append(archived)
        if not observed.finalized:
            status["phase"] = Phase.FINALIZING.value
            status.setdefault("startTime", timestamp(now))
            conds.append(
                condition(
                    "Succeeded",
                    False,
                    "Finalizing",
                    observed.finalizing_message or "archiving outputs and registering the model",
                    observed_generation=gen,
                )
            )
            status["conditions"] = merge(prev.get("conditions"), conds, now)
            return status
        if observed.model:
            status["model"] = dict(observed.model)
        return finish(Phase.SUCCEEDED)

    if observed.pending is not None:
        reason, message = observed.pending
        conds.append(condition("Admitted", False, reason, message, observed_generation=gen))
        status["phase"] = Phase.PENDING.value
        status["conditions"] = merge(prev.get("conditions"), conds, now)
        return status
    if observed.queued_message is not None or len(pods) < total:
        message = observed.queued_message or f"creating node Pods ({len(pods)}/{total})"
        conds.append(
            condition(
                "Admitted",
                False,
                "Queued" if observed.queued_message else "Creating",
                message,
                observed_generation=gen,
            )
        )
        status["phase"] = Phase.QUEUED.value if observed.queued_message else Phase.PENDING.value
        status["conditions"] = merge(prev.get("conditions"), conds, now)
        return status

    conds.append(
        condition(
            "Admitted",
            True,
            "GangAdmitted",
            f"all {total} node Pod(s) admitted together",
            observed_generation=gen,
        )
    )
    if counts["running"] + counts["succeeded"] == total:
        status["phase"] = Phase.RUNNING.value
        status.setdefault("startTime", timestamp(now))
        conds.append(
            condition(
                "Running",
                True,
                "AllNodesRunning",
                f"{counts['running']}/{total} node(s) running",
                observed_generation=gen,
            )
        )
    else:
        status["phase"] = Phase.QUEUED.value if counts["scheduled"] < total else Phase.RUNNING.value
        if status["phase"] == Phase.RUNNING.value:
            status.setdefault("startTime", timestamp(now))
        conds.append(
            condition(
                "Running",
                False,
                "Starting",
                f"{counts['scheduled']}/{total} scheduled, {counts['running']}/{total} running",
                observed_generation=gen,
            )
        )
    status["conditions"] = merge(prev.get("conditions"), conds, now)
    return status


def failure_message(failure: Mapping[str, Any], *, full: bool = False) -> str:
    """'rank 3 (node 1) failed (Error, exit code 1): ValueError: bad' (``full``: the whole
    traceback on the following lines). Used by the conditions, Events and local mode."""
    if failure.get("rank") is not None:
        who = f"rank {failure['rank']} (node {failure.get('node')})"
    elif failure.get("node") is not None:
        who = f"node {failure['node']}"
    else:
        who = "the run"
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


def invalid_trainingrun_status(
    generation: int | None, message: str, previous: Mapping[str, Any] | None, now: datetime
) -> dict[str, Any]:
    """A run the apiserver let through but torchyard cannot run: Failed, said once."""
    prev = previous or {}
    desired = [
        condition("Accepted", False, "InvalidSpec", message, observed_generation=generation),
        condition("Failed", True, "InvalidSpec", message, observed_generation=generation),
    ]
    status: dict[str, Any] = {
        "phase": Phase.FAILED.value,
        "conditions": merge(prev.get("conditions"), desired, now),
        "failure": {"reason": "InvalidSpec", "message": message},
    }
    if generation is not None:
        status["observedGeneration"] = generation
    return with_kstatus(status, prev, now)
