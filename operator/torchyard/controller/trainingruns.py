"""The TrainingRun reconcile, as one story: observe, decide, apply, write once.

:func:`reconcile` reads top to bottom, as JobSet's ``Reconcile``:

1. **parse** the spec (one torchyard cannot run is Failed, said once, never retried);
2. **observe** the run's world into one :class:`Observed`: its status as it was, its
   Pods (of this attempt, and stale ones of earlier attempts) and its Environment; a Pod
   whose Node was deleted is released at once and counts as gone (``lost_nodes``);
3. a **finished** run has its record written (``recording``), stops its live Pods and
   waits for its TTL (``ttl_after_finished``); a **suspended** one (``spec.suspend``) stops
   its gang gracefully and waits (``suspension``);
4. **decide** with pure functions: the deadline and the failure policy
   (``failure_policy``: wait for the gang to settle, restart it, or fail);
5. **apply** children: delete stale Pods, else check that the objects the spec names
   exist (``references``: the run waits for a missing one), create the Service and node
   Pods and admit the gang (``admission``), the apiserver's refusals told apart
   (``refusals``: the run waits, or fails as InvalidSpec at once); register the model
   once every node succeeded (``finalize``);
6. **write** the status and its Events once, at the end, only when they changed
   (``context.write``), from ``status.trainingrun_status`` fed with what was observed
   and decided: the failure decided in step 4 travels with it, never computed again. A
   change of the Pod counts alone is written at most once a second
   (``context.batched``).

Called by ``handlers`` (work queue workers); tested as tables against an in-memory
fake of ``torchyard.k8s`` in tests/unit/controller/test_reconcile.py, and against a
real control plane in tests/integration/test_trainingruns.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from torchyard import api, k8s, status
from torchyard.controller import (
    admission,
    context,
    failure_policy,
    finalize,
    inputs,
    lost_nodes,
    mpi_keys,
    multikueue,
    progress,
    recording,
    references,
    refusals,
    suspension,
    telemetry,
    tracking,
    workloads,
)
from torchyard.controller import ttl_after_finished as ttl
from torchyard.controller.context import Context, Event, Log, Outcome, Result
from torchyard.planning import checkpoints, names, pods
from torchyard.planning import workloads as run_workloads
from torchyard.status import deadlines, exclusions, failures
from torchyard.status import tracking as tracking_status
from torchyard.status import trainingruns as run_status

# How soon a run whose old attempt's Pods are still going is looked at again.
STALE_RETRY_SECONDS = 1.0
# How soon a gang being restarted is looked at again (its new Pods are created then).
RESTART_RETRY_SECONDS = 0.5
# The status fields whose change alone is written at most once a second
# (``context.batched``): the Pod counts, which change on every Pod event of a gang coming up.
BATCHED_FIELDS = frozenset({"nodes"})
# How soon a run whose inputs are being fetched is looked at again (the fetch Jobs'
# events wake it sooner).
INPUTS_RETRY_SECONDS = 30.0
# How soon a run whose model could not be registered yet tries again.
REGISTER_RETRY_SECONDS = 5.0


@dataclass(frozen=True)
class Observed:
    """What one reconcile saw of a run's world, read once at its start."""

    previous: Mapping[str, Any]  # the run's status as it was
    attempts: failure_policy.Attempts
    started: datetime | None  # status.startTime
    completed: datetime | None  # status.completionTime
    children: list[dict[str, Any]]  # this run's Pods, every attempt
    current: list[dict[str, Any]]  # those of the current attempt
    stale: list[dict[str, Any]]  # those of earlier attempts, still there
    environment: Mapping[str, Any] | None = None  # None: missing (or not looked at)
    # status.tracking as ``tracking.start`` just found it before the Pods (None: not asked)
    tracking: Mapping[str, Any] | None = None
    # how the run goes to Kueue (``workloads.mode``: "workload", "podGroups"; None: it
    # does not), and its Workload (None: none yet, or not through one)
    kueue: str | None = None
    workload: Mapping[str, Any] | None = None

    @property
    def phase(self) -> str | None:
        return self.previous.get("phase")

    @property
    def finished(self) -> bool:
        return self.phase in run_status.TERMINAL

    @property
    def environment_ready(self) -> bool:
        return bool((self.environment or {}).get("status", {}).get("phase") == "Ready")

    def without(self, gone: Sequence[Mapping[str, Any]]) -> Observed:
        """What was observed, less the Pods ``gone`` (released: as if already deleted)."""
        if not gone:
            return self
        names_ = {p["metadata"]["name"] for p in gone}

        def keep(pods_: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [p for p in pods_ if p["metadata"]["name"] not in names_]

        return replace(
            self,
            children=keep(self.children),
            current=keep(self.current),
            stale=keep(self.stale),
        )


def reconcile(body: Mapping[str, Any], logger: Log, ctx: Context) -> Result:
    """Reconcile one TrainingRun (see the module docstring)."""
    outcome, result = _reconcile(body, logger, ctx)
    if outcome is None:
        return result
    wait = context.batched(ctx, body, outcome, BATCHED_FIELDS)
    if wait is None:
        context.write(ctx, body, outcome)
    elif result.requeue_after is None or wait < result.requeue_after:
        result.requeue_after = wait
    return result


def _reconcile(body: Mapping[str, Any], logger: Log, ctx: Context) -> tuple[Outcome | None, Result]:
    """The story's steps: what to write at the end (None: nothing), and what to queue."""
    meta = body["metadata"]
    previous = dict(body.get("status") or {})
    now = ctx.clock()
    try:
        run = _parse(body, ctx)
    except api.InvalidSpec as err:
        logger.warning("TrainingRun %s is invalid: %s", meta["name"], err)
        return _invalid(meta.get("generation"), str(err), previous, now), Result()
    if meta.get("deletionTimestamp"):
        return None, Result()  # being deleted: owner references take the children away
    if run.spec.managed_by:  # MultiKueue runs it on a worker cluster
        return multikueue.manage(ctx, run, previous, logger, now)
    ctx = tracking.scoped(ctx, run.namespace, logger)  # the namespace's tracking server

    seen = observe(ctx, run, previous)
    seen = seen.without(lost_nodes.release(ctx, body, seen.children))
    if seen.finished:
        return _finished(ctx, body, run, seen, logger, now)
    if suspension.to_suspend(run, seen.phase):
        return suspension.suspend(ctx, run, seen, logger, now)

    verdict = failure_policy.decide(
        run,
        seen.current,
        seen.attempts,
        seen.phase,
        deadlines.counted_from(seen.previous, now),  # suspensions left out
        now,
        ctx.cache.nodes(),
        evicted=_evicted(seen),
    )
    if verdict.settle_seconds is not None:
        logger.debug(
            "TrainingRun %s/%s: a node failed; deciding in %.1fs",
            run.namespace,
            run.name,
            verdict.settle_seconds,
        )
        return None, Result(requeue_after=verdict.settle_seconds)
    if verdict.restart is not None:
        return _restart(ctx, run, seen, verdict.restart, logger, now)

    result = Result(requeue_after=verdict.deadline_seconds_left)
    applied = prepared = tracked = None
    if seen.environment_ready and verdict.failure is None and not verdict.deadline_exceeded:
        run = inputs.pin_models(ctx, run, seen.previous)  # model:// with no version: the latest
        if not seen.current:  # before a gang's Pods: its inputs must be in the cache
            prepared = inputs.prepare(ctx, run, seen.previous, logger, now)
        else:  # the gang has its Pods: its inputs were ready
            prepared = inputs.ready_from_status(seen.previous)
        if prepared is None or prepared.ready:
            if not seen.current and not seen.stale:  # its MLflow run, before its Pods
                tracked = tracking.start(ctx, run, seen.previous, _image(seen), now, logger)
                seen = replace(seen, tracking=tracked)
            applied = _apply_children(ctx, run, seen, result, logger, now)
        elif not prepared.failure:
            result.requeue_after = _sooner(result.requeue_after, INPUTS_RETRY_SECONDS)
        if applied is not None and applied.refused:
            logger.warning("TrainingRun %s/%s: %s", run.namespace, run.name, applied.refused)
            # Pods the apiserver took before it refused the rest would wait for nothing.
            left = observe(ctx, run, previous).children
            context.delete_pods(ctx, run.namespace, [p for p in left if context.live(p)])
            return _invalid(run.generation, applied.refused, previous, now), Result()
    observed = replace(_status_inputs(seen, verdict, applied), inputs=prepared)
    if verdict.failure is None and not verdict.deadline_exceeded:
        observed = _read_progress(ctx, run, observed, result, now)
    if finalize.needs_registering(run, seen.current):
        registration = finalize.register(run, seen.environment, ctx, logger)
        observed = replace(
            observed,
            finalized=registration.done,
            model=registration.model,
            finalizing_message=registration.waiting,
        )
        if not registration.done:
            result.requeue_after = REGISTER_RETRY_SECONDS
    outcome = _conclude(ctx, run, seen, observed, result, logger, now)
    return _tracked(ctx, run, seen.previous, outcome, tracked, result, logger), result


def _tracked(
    ctx: Context,
    run: api.TrainingRun,
    previous: Mapping[str, Any],
    outcome: Outcome,
    started: Mapping[str, Any] | None,
    result: Result,
    logger: Log,
) -> Outcome:
    """The outcome with the run's MLflow run mirrored (``tracking``): ``status.tracking``,
    its condition and Events, and a look again when a call to the server failed."""
    mirrored = tracking.mirror(ctx, run, previous, outcome.status, started, outcome.at, logger)
    if mirrored.state is None:
        return outcome
    outcome.status = tracking_status.with_tracking(
        outcome.status, mirrored.state, ctx.settings.tracking.uri, outcome.at
    )
    outcome.events.extend(mirrored.events)
    if mirrored.retry is not None:
        result.requeue_after = _sooner(result.requeue_after, mirrored.retry)
    return outcome


def _evicted(seen: Observed) -> str | None:
    """Why Kueue evicted the run's Workload (None: it did not)."""
    wl = seen.workload
    if wl is None or not run_workloads.evicted(wl):
        return None
    return run_workloads.eviction(wl)


def _sooner(current: float | None, seconds: float) -> float:
    return seconds if current is None else min(current, seconds)


def _finished(
    ctx: Context,
    body: Mapping[str, Any],
    run: api.TrainingRun,
    seen: Observed,
    logger: Log,
    now: datetime,
) -> tuple[Outcome | None, Result]:
    """A finished run: its record written once (``recording``; the TTL waits for it while
    the registry cannot be reached, since the record keeps the Pods' log tails), then its
    TTL (``ttl_after_finished``); its MLflow run is ended when that failed before (the
    TTL does not wait for the tracking server)."""
    workloads.finish(ctx, seen.workload, str(seen.phase), _failed_message(seen.previous), now)
    recorded = recording.finished_run(ctx, body, seen.current, logger)
    outcome = None if recorded.status is None else Outcome(recorded.status, now, recorded.events)
    if recorded.hold:
        result = Result(requeue_after=recorded.retry)
    else:
        result = ttl.finished(ctx, run, seen.children, seen.completed, now)
        if recorded.retry is not None:
            result.requeue_after = _sooner(result.requeue_after, recorded.retry)
    if tracking.unfinished(ctx, seen.previous):  # its MLflow run not ended yet
        base = outcome or Outcome(dict(seen.previous), now)
        outcome = _tracked(ctx, run, seen.previous, base, None, result, logger)
    return outcome, result


def _parse(body: Mapping[str, Any], ctx: Context) -> api.TrainingRun:
    run = api.parse_trainingrun(dict(body))
    if run.spec.source.snapshot and not ctx.settings.registry_url:
        raise api.InvalidSpec(
            "source.snapshot needs the model registry service, and this operator has "
            "none (install the chart with the registry, or set TORCHYARD_REGISTRY_URL); "
            "or submit a folder under ~900 KiB, which goes into a ConfigMap"
        )
    return run


def observe(ctx: Context, run: api.TrainingRun, previous: Mapping[str, Any]) -> Observed:
    """The run's Pods (its own, not a deleted namesake's) and, unless it finished, its
    Environment."""
    uid = run.metadata.get("uid")
    children = [
        p
        for p in ctx.k8s.list_(
            k8s.PODS, run.namespace, label_selector=f"{names.LABEL_RUN}={run.name}"
        )
        if any(o.get("uid") == uid for o in p["metadata"].get("ownerReferences", []))
    ]
    attempts = failure_policy.Attempts.of(previous)
    current = [p for p in children if _attempt(p) == attempts.restarts]
    # restarts in place the launchers of Pods that ended said (their termination messages)
    attempts = attempts.in_place_seen(failures.in_place_said(current))
    seen = Observed(
        previous=previous,
        attempts=attempts,
        started=context.parse_time(previous.get("startTime")),
        completed=context.parse_time(previous.get("completionTime")),
        children=children,
        current=current,
        stale=[p for p in children if _attempt(p) != attempts.restarts],
    )
    kueue = workloads.mode(ctx, run)
    if kueue == "workload":
        seen = replace(seen, kueue=kueue, workload=workloads.observe(ctx, run))
    elif kueue is not None:
        seen = replace(seen, kueue=kueue)
    if seen.finished:
        return seen
    environment = ctx.k8s.get_or_none(k8s.ENVIRONMENTS, run.namespace, run.spec.environment)
    return replace(seen, environment=environment)


def _attempt(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"].get("labels", {}).get(pods.ATTEMPT_LABEL, "0"))


def _apply_children(
    ctx: Context, run: api.TrainingRun, seen: Observed, result: Result, logger: Log, now: datetime
) -> admission.Admission | None:
    """Delete an earlier attempt's Pods first (None); else the node Pods this attempt
    wants, created and admitted (``admission.admit``), once the objects the spec names
    exist (``references``); a refusal of the apiserver that a retry cannot fix comes
    back as ``pending`` (the run waits) or ``refused`` (it fails), see ``refusals``."""
    if seen.stale:
        # A Pod on a node left out as bad (NotReady: no kubelet confirms its end) is
        # deleted at once: the next attempt's Pod of the same name waits for it.
        bad = set(_excluded(seen))
        on_bad = [p for p in seen.stale if p.get("spec", {}).get("nodeName") in bad]
        context.delete_pods(ctx, run.namespace, [p for p in seen.stale if p not in on_bad])
        context.delete_pods(ctx, run.namespace, on_bad, grace_period_seconds=0)
        result.requeue_after = STALE_RETRY_SECONDS
        return None
    settled = admission.of_whole_gang(ctx, run, seen.current)
    if settled is not None:  # whole and ungated: no manifests to build, nothing to write
        return settled
    if not seen.current:  # before a gang's first Pod: what it names must exist
        waiting = references.missing(ctx, run)
        if waiting is not None:
            result.requeue_after = refusals.WAIT_SECONDS
            return admission.Admission(seen.current, pending=waiting)
    try:
        return _create_children(ctx, run, seen, result, logger, now)
    except k8s.ApiError as err:
        refusal = refusals.of(err, run)
        if refusal is None:
            raise
        if refusal.fails:
            return admission.Admission(seen.current, refused=refusal.message)
        result.requeue_after = refusals.WAIT_SECONDS
        return admission.Admission(seen.current, pending=refusal.pending)


def _create_children(
    ctx: Context, run: api.TrainingRun, seen: Observed, result: Result, logger: Log, now: datetime
) -> admission.Admission:
    """The node Pods this attempt wants, created and admitted, and what they need first
    (the MPI key, the checkpoint claim, the run's MLflow run: ``seen.tracking``)."""
    env_spec = (seen.environment or {}).get("spec", {})

    def node_pods() -> list[dict[str, Any]]:
        return pods.pods(
            run,
            image=_image(seen),
            python=str(env_spec.get("python") or "python3"),
            attempt=seen.attempts.restarts,
            settings=ctx.settings,
            excluded=_excluded(seen),
            deadline_left=deadlines.pod_seconds(run, seen.previous, now),
            tracking=seen.tracking if seen.tracking is not None else seen.previous.get("tracking"),
            # torchyard's own gang admission places it by its placement; Kueue by the
            # Workload's admission, or its Pod groups (the fallback)
            placement=workloads.request(ctx, run) if seen.kueue is None else None,
            gated=seen.kueue is None,
            pod_group=seen.kueue == "podGroups",
            restart_budget=seen.attempts.budget(run),
        )

    if not seen.current:
        mpi_keys.ensure(ctx, run)  # before the Pods that mount it
    claim = checkpoints.claim(run, pods.owner_reference(run))
    if claim is not None and len(seen.current) < run.spec.distribution.node_count:
        ctx.k8s.apply(claim)  # before the Pods that mount it; owned by the run
    if seen.kueue == "workload":  # Kueue admits its Workload: the Pods come after
        resuming = seen.phase == api.Phase.SUSPENDED.value
        applied = workloads.admit(
            ctx, run, seen.workload, node_pods, seen.current, result, logger, now, resuming=resuming
        )
    else:
        applied = admission.admit(ctx, run, node_pods(), seen.current, seen.previous)
    result.also.extend(applied.others)
    decision = applied.decision
    if decision is not None and decision.admit:
        logger.info("TrainingRun %s/%s admitted: %s", run.namespace, run.name, decision.message)
        created = context.parse_time(str(run.metadata.get("creationTimestamp") or ""))
        if seen.attempts.restarts == 0 and created is not None:
            telemetry.ADMISSION_WAIT_SECONDS.observe(max(0.0, (now - created).total_seconds()))
    return applied


def _image(seen: Observed) -> str:
    """The image the node Pods run: the Environment's built (or resolved) one, else its spec's."""
    env_status = (seen.environment or {}).get("status", {})
    env_spec = (seen.environment or {}).get("spec", {})
    return str(env_status.get("image") or env_spec.get("image") or "")


def _excluded(seen: Observed) -> list[str]:
    """The names of the nodes this run leaves out (``status.excludedNodes``)."""
    return [str(e.get("node")) for e in seen.previous.get("excludedNodes") or [] if e.get("node")]


def _status_inputs(
    seen: Observed, verdict: failure_policy.Verdict, applied: admission.Admission | None
) -> run_status.Observed:
    """What the status is computed from: what was observed, decided and applied."""
    decision = applied.decision if applied is not None else None
    return run_status.Observed(
        environment=seen.environment,
        pods=applied.pods if applied is not None else seen.current,
        restarts=seen.attempts.restarts,
        failed_attempts=seen.attempts.failed_attempts,
        in_place=seen.attempts.in_place,
        last_in_place=failures.newest_in_place(failures.in_place_said(seen.current)),
        deadline_exceeded=verdict.deadline_exceeded,
        failure=verdict.failure,
        pending=applied.pending if applied is not None else None,
        queued_message=decision.message if decision is not None and not decision.admit else None,
        queue=applied.queue if applied is not None else None,
    )


def _read_progress(
    ctx: Context, run: api.TrainingRun, observed: run_status.Observed, result: Result, now: datetime
) -> run_status.Observed:
    """The running node Pods' progress, read from their logs when due (``progress.poll``),
    and a look again when the next read is due."""
    uid = str(run.metadata.get("uid") or run.name)
    polled = progress.poll(ctx, run.namespace, uid, observed.pods, now)
    if polled is None:
        return observed
    again = polled.again_seconds
    result.requeue_after = (
        again if result.requeue_after is None else min(result.requeue_after, again)
    )
    if polled.in_place:  # what the running launchers said of their in-place restarts
        observed = run_status.with_in_place(observed, polled.in_place)
    return replace(observed, progress=polled.progress) if polled.progress else observed


def _conclude(
    ctx: Context,
    run: api.TrainingRun,
    seen: Observed,
    observed: run_status.Observed,
    result: Result,
    logger: Log,
    now: datetime,
) -> Outcome:
    """The new status and its Events; a run that just failed stops its surviving ranks,
    and one that finished is looked at again at its TTL."""
    new = status.trainingrun_status(run, observed, seen.previous, now)
    outcome = Outcome(new, now, context.phase_events(seen.previous, new))
    restarted = run_status.in_place_event(seen.previous, new)
    if restarted is not None:
        outcome.events.append(Event("Warning", "RestartedInPlace", restarted))
    warning = finalize.archive_warning(seen.previous, new)
    if warning is not None:
        outcome.events.append(warning)
    if new.get("phase") == api.Phase.FAILED.value and seen.phase != new["phase"]:
        # The node it blames is listed even with no attempt left: `torchyard describe`
        # shows it, and whoever runs there next can read it.
        outcome.events.extend(_exclude(seen, observed.failure, new, now))
        # No surviving rank burns a GPU.
        context.delete_pods(ctx, run.namespace, [p for p in observed.pods if context.live(p)])
        logger.warning(
            "TrainingRun %s/%s failed: %s", run.namespace, run.name, _failed_message(new)
        )
    if new.get("phase") in run_status.TERMINAL:
        # Waiting gangs are let in by the admission pass, on the Pods' events.
        after = run.spec.policy.ttl_seconds_after_finished
        if after is not None:
            result.requeue_after = float(after) + ttl.MARGIN_SECONDS
        if ctx.settings.registry_url:  # its record is written by the next reconcile
            result.requeue_after = 0.0
        if seen.workload is not None:  # its Workload is finished by the next one, once
            result.requeue_after = 0.0  # the status says so (MultiKueue copies it then)
    return outcome


def _restart(
    ctx: Context,
    run: api.TrainingRun,
    seen: Observed,
    restart: failure_policy.Restart,
    logger: Log,
    now: datetime,
) -> tuple[Outcome, Result]:
    """Restart the whole gang: delete this attempt's Pods; the status counts the restart
    and goes back to Pending, and a ``Restarting`` Event (not a ``Pending`` one) says why.
    A suspension's Pods keep their own grace period: their ranks save a checkpoint in it."""
    if restart.kind == "suspension":
        suspension.stop_gracefully(ctx, run.namespace, seen.current)
    else:
        context.delete_pods(ctx, run.namespace, seen.current)
    logger.warning("TrainingRun %s/%s: %s", run.namespace, run.name, restart.message)
    new = status.restarting_status(
        seen.previous,
        run.generation,
        restart.attempts.restarts,
        restart.attempts.failed_attempts,
        restart.message,
        now,
        restart.failure,
    )
    if restart.attempts.suspensions:
        new["suspensions"] = restart.attempts.suspensions
    if restart.attempts.in_place:  # as the ended launchers said it, not the last poll
        new["inPlaceRestarts"] = restart.attempts.in_place
    if restart.kind == "suspension":
        new.update(deadlines.paused(seen.previous, now))  # activeDeadlineSeconds stops
    events = [Event("Warning", "Restarting", restart.message)]
    events.extend(_exclude(seen, restart.failure, new, now))
    outcome = Outcome(new, now, events)
    return outcome, Result(requeue_after=RESTART_RETRY_SECONDS)


def _exclude(
    seen: Observed, failure: Mapping[str, Any] | None, new: dict[str, Any], now: datetime
) -> list[Event]:
    """Put the node ``failure`` blames (``exclusions.of_failure``, with the attempt
    before's ``status.lastFailure``) into ``new["excludedNodes"]``; the Event that says so."""
    bad = exclusions.of_failure(failure, now, seen.previous.get("lastFailure"))
    excluded = exclusions.merged(seen.previous.get("excludedNodes"), bad)
    if excluded:
        new["excludedNodes"] = excluded
    if bad is None:
        return []
    message = (
        f"node {bad['node']} is left out of this run's next attempts "
        f"({bad['reason']}: {bad['evidence']})"
    )
    return [Event("Warning", "NodeExcluded", message)]


def _invalid(
    generation: int | None, message: str, previous: Mapping[str, Any], now: datetime
) -> Outcome:
    new = status.invalid_trainingrun_status(generation, message, previous, now)
    return Outcome(new, now, context.phase_events(previous, new))


def _failed_message(new_status: Mapping[str, Any]) -> str:
    failed = status.find(new_status.get("conditions"), "Failed") or {}
    return str(failed.get("message", ""))
