"""The failure policy: the deadline, and what a failed or lost node Pod means for the run.

Pure functions, called by ``trainingruns.reconcile`` between observing and applying.
:func:`decide` finds the failure (the first failed Pod of the current attempt, else a
node Pod that a running gang lost), holds one that may be a symptom of another rank's
failure while the gang's other Pods may still report that one (``failures.settling``),
and says whether the gang
restarts or the run fails with it: platform failures (a lost node, an eviction) are
restarted within ``policy.platformRestartLimit``, failures of the user's code within
``policy.backoffLimit``, and a stuck Pod or a failed archive upload never (training
again would not help). A gang that Kueue stopped (``status.suspensions.kueue_stopped``, its
plain Pod groups) or whose Workload Kueue evicted (preempted, deactivated, a node failure)
is restarted as a suspension, counted in neither limit: a platform event, never the
user's code; Kueue admits the new node Pods (or the Workload) when it has room again.
``policy.activeDeadlineSeconds`` counts from ``started``: the run's start moved on by the
time it was suspended (``status.deadlines.counted_from``).
The :class:`Verdict` carries the failure on to the status: it is not computed again.
Tested as tables in tests/unit/controller/test_failure_policy.py and through the
reconcile tables of tests/unit/controller/test_reconcile.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from torchyard import api
from torchyard.launch import classes, coordination
from torchyard.planning import names
from torchyard.status import exclusions, failures, suspensions
from torchyard.status.failures import Failure

RestartKind = Literal["platform", "user", "suspension"]


@dataclass(frozen=True)
class Attempts:
    """The run's restart bookkeeping, as its status keeps it."""

    restarts: int = 0  # gang restarts so far: the current attempt's number
    failed_attempts: int = 0  # of those, the ones the user's code caused (backoffLimit)
    # ``classes.signature`` of the failure that restarted the gang last (status.lastFailure)
    last_signature: str | None = None
    # of the restarts, the suspensions (spec.suspend, Kueue): counted in no limit
    suspensions: int = 0
    # of the failed attempts, those the launchers restarted in place (no gang restart)
    in_place: int = 0

    @classmethod
    def of(cls, previous: Mapping[str, Any]) -> Attempts:
        last = previous.get("lastFailure")
        return cls(
            int(previous.get("restarts") or 0),
            int(previous.get("failedAttempts") or 0),
            classes.signature(last) if isinstance(last, Mapping) else None,
            int(previous.get("suspensions") or 0),
            int(previous.get("inPlaceRestarts") or 0),
        )

    @property
    def platform_restarts(self) -> int:
        return self.restarts - (self.failed_attempts - self.in_place) - self.suspensions

    def suspended(self) -> Attempts:
        """After one more suspension: a new attempt, no limit used."""
        return replace(self, restarts=self.restarts + 1, suspensions=self.suspensions + 1)

    def in_place_seen(self, said: Sequence[Mapping[str, Any]]) -> Attempts:
        """With the newest of what the launchers said of their in-place restarts
        (``launch.coordination.REPORTED``: counts that only grow, and the signature of the
        failure restarted last, for "the same error at the same step")."""
        newest = failures.newest_in_place(said)
        if newest is None or int(newest.get("inPlace") or 0) <= self.in_place:
            return self
        return replace(
            self,
            failed_attempts=max(self.failed_attempts, int(newest.get("failedAttempts") or 0)),
            in_place=int(newest.get("inPlace") or 0),
            last_signature=str(newest.get("signature") or "") or self.last_signature,
        )

    def budget(self, run: api.TrainingRun) -> coordination.Budget | None:
        """What a new gang's launchers may restart in place (None: nothing left)."""
        limit = run.spec.policy.backoff_limit
        if self.failed_attempts >= limit:
            return None
        return coordination.Budget(limit, self.failed_attempts, self.in_place, self.last_signature)


@dataclass(frozen=True)
class Restart:
    """Restart the whole gang: the counts after this restart, and what the Event says."""

    kind: RestartKind
    attempts: Attempts
    message: str
    failure: Failure | None = None  # what restarted it (status.lastFailure)


@dataclass(frozen=True)
class Verdict:
    """What the failure policy decided for this reconcile."""

    failure: Failure | None = None  # the failure that ends the run
    restart: Restart | None = None  # restart the gang instead of failing
    settle_seconds: float | None = None  # decide nothing yet: look again after this long
    deadline_exceeded: bool = False
    deadline_seconds_left: float | None = None  # look again then


def deadline_left(run: api.TrainingRun, started: datetime | None, now: datetime) -> float | None:
    """Seconds left before ``activeDeadlineSeconds`` (0 or less: exceeded), None if none."""
    deadline = run.spec.policy.active_deadline_seconds
    if not deadline or started is None:
        return None
    return (started + timedelta(seconds=deadline) - now).total_seconds()


def restart_kind(run: api.TrainingRun, failure: Failure, attempts: Attempts) -> RestartKind | None:
    """'platform' or 'user' when the gang should be restarted, None when the run fails."""
    if failure.get("platform"):
        limit = run.spec.policy.platform_restart_limit
        return "platform" if attempts.platform_restarts < limit else None
    if failure.get("reason") in failures.NOT_RESTARTED:
        return None
    if failure.get("retryable") is False or repeated(failure, attempts):
        return None  # running it again would fail the same way (``classes``)
    return "user" if attempts.failed_attempts < run.spec.policy.backoff_limit else None


def repeated(failure: Failure, attempts: Attempts) -> bool:
    """Whether ``failure`` is the error that restarted the gang last, at the same step."""
    return attempts.last_signature is not None and attempts.last_signature == (
        classes.signature(failure)
    )


def restart(
    run: api.TrainingRun, failure: Failure, kind: RestartKind, attempts: Attempts
) -> Restart:
    """The restart of the gang after ``failure``, counted by ``kind``."""
    after = Attempts(
        attempts.restarts + 1,
        attempts.failed_attempts + (1 if kind == "user" else 0),
        classes.signature(failure),
        attempts.suspensions,
        attempts.in_place,
    )
    if kind == "platform":
        counted = "a platform failure, not counted against backoffLimit"
    else:
        counted = f"{after.failed_attempts}/{run.spec.policy.backoff_limit} of backoffLimit used"
    why = failures.failure_message(failure)
    message = f"restarting the gang (restart {after.restarts}, {counted}): {why}"
    return Restart(kind, after, message, failure)


def final(run: api.TrainingRun, failure: Failure, attempts: Attempts) -> Failure:
    """The failure that ends the run: a platform one says that no restart was left, a
    repeated or not retryable one why it was not retried."""
    if not failure.get("platform"):
        if repeated(failure, attempts) and run.spec.policy.backoff_limit > 0:
            why = "the same error at the same step as the attempt before: not retried again"
            return {**failure, "advice": f"{why}; {failure.get('advice') or ''}".rstrip("; ")}
        return failure
    limit = run.spec.policy.platform_restart_limit
    left = (
        f"no platform restart left ({attempts.platform_restarts} of "
        f"policy.platformRestartLimit {limit} used)"
    )
    message = str(failure.get("message") or "").strip()
    return {**failure, "message": f"{message}; {left}" if message else left}


def _live(pod: Mapping[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")


def decide(
    run: api.TrainingRun,
    pods: Sequence[Mapping[str, Any]],
    attempts: Attempts,
    phase: str | None,
    started: datetime | None,
    now: datetime,
    nodes: Sequence[Mapping[str, Any]] = (),
    evicted: str | None = None,
) -> Verdict:
    """The deadline, then the failure of the current attempt's ``pods`` (see the module
    docstring); ``phase`` is the run's phase before this reconcile; ``nodes`` the Nodes
    as admission sees them: a running gang's Pod on one that went NotReady or unhealthy
    fails the attempt at once (``exclusions.down_failure``); ``evicted``: why Kueue
    evicted the run's Workload (``workloads``), None when it did not."""
    left = deadline_left(run, started, now)
    if left is not None and left <= 0:
        return Verdict(deadline_exceeded=True)
    stopped = suspensions.kueue_stopped(pods)
    if stopped is None and evicted is not None and any(_live(p) for p in pods):
        stopped = f"Kueue evicted the run's Workload ({evicted})"
    if stopped is not None:
        after = attempts.suspended()
        message = (
            f"restarting the gang as a suspension (restart {after.restarts}, counted in no "
            f"limit): {stopped}; Kueue admits the new node Pods when it has room again"
        )
        return Verdict(restart=Restart("suspension", after, message))
    failure = failures.first_failure(pods)
    lost = None
    if phase == api.Phase.RUNNING.value:
        pod_names = [names.pod(run.name, i) for i in range(run.spec.distribution.node_count)]
        lost = failures.lost_failure(pod_names, pods) or exclusions.down_failure(pods, nodes)
    if failure is not None and lost is not None and not failure.get("platform"):
        # A node Pod taken from the running gang (being deleted, evicted, gone with its
        # node) is what its siblings' collective errors report, and its just-in-time
        # checkpoint keeps it running a while: the disruption decides, not backoffLimit.
        failure = lost
    elif failure is not None:
        wait = failures.settling(failure, pods, now)
        if wait is not None:
            # Its peers on the other nodes may yet report an earlier exit: decide (and
            # stop them) once they did or the settle time is over.
            return Verdict(settle_seconds=wait)
    else:
        failure = lost
    if failure is None:
        return Verdict(deadline_seconds_left=left)
    kind = restart_kind(run, failure, attempts)
    if kind is not None:
        return Verdict(restart=restart(run, failure, kind, attempts))
    return Verdict(failure=final(run, failure, attempts), deadline_seconds_left=left)
