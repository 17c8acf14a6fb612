"""Gang admission: create a run's missing node Pods, and admit gangs when they fit whole.

Waiting gangs are kept in one queue per pool (``planning.admission.order``: priority class
value, then age) and admitted in one pass over every queue, :func:`run_pass`, over the
watch-fed :class:`~torchyard.controller.cache.Cache` (``Context.cache``): no list of the
cluster's Pods or Nodes in a reconcile. ``handlers`` runs a pass whenever what admission
sees changes (a Pod finished, deleted or bound, a Node changed); a pass marks the gangs
it admits in the cache, so that they take their room at once, queues their runs (whose
reconcile lifts the gates and says Running), and queues the runs whose place in their
pool's queue changed (their status shows it). A reconcile that creates a gang, through
:func:`admit` (the "apply children" step of ``trainingruns.reconcile``), makes the same
pass with the new gang in it: a gang that fits is created without scheduling gates (one
write per Pod), one that does not is created gated; a gang created with at least
``EXACT_POSITIONS`` (50) gangs ahead of it in a pool whose head is blocked is placed
without that pass (:func:`_far_back`: its place would be "more than 50 ahead" whatever
the pass found, and nobody behind it moves), so a burst of thousands of new runs costs
no pass over thousands each. A gang whose Pods all exist ungated needs none of this:
:func:`of_whole_gang` says so without the wanted manifests being built. A run with
``scheduling.queueName`` is left to Kueue. Until the cache is primed (``prime``, at
start-up) nothing is admitted. The apiserver's refusals are raised as they come;
``trainingruns`` tells them apart (``refusals``: the run waits, fails, or the work queue
retries). Tested in
tests/unit/controller/test_admission_pass.py, tests/unit/controller/test_reconcile.py and
tests/unit/controller/test_fanout_cost.py, and against a real control plane in
tests/integration/test_trainingruns.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchyard import api, k8s
from torchyard.controller import cache as caches
from torchyard.controller import context, telemetry
from torchyard.controller.context import Context, Key
from torchyard.planning import admission as gangs
from torchyard.planning import names, pods, shipped, topology

# Before the first pass after a restart has placed a gang: what its status said is kept.
WAITING_MESSAGE = "waiting for the admission pass"
OUTSIDE_REFRESH_SECONDS = 30.0
SHIP_REFRESH_SECONDS = 300.0


@dataclass(frozen=True)
class Admission:
    """What applying the gang did."""

    pods: list[dict[str, Any]]  # the current attempt's Pods, those just created included
    decision: gangs.Decision | None = None  # None: nothing was decided this time
    others: list[Key] = field(default_factory=list)  # other runs the decision admitted
    # (reason, message): the Pods cannot be created yet (``references``, ``refusals``:
    # a missing ConfigMap, claim, PriorityClass, LocalQueue or ServiceAccount).
    pending: tuple[str, str] | None = None
    refused: str = ""  # the apiserver refuses a child for good (``refusals``): why
    queue: dict[str, Any] | None = None  # {pool, position}: the run's place in its queue


def admit(
    ctx: Context,
    run: api.TrainingRun,
    wanted: list[dict[str, Any]],
    current: list[dict[str, Any]],
    previous: Mapping[str, Any] | None = None,
) -> Admission:
    """Create the missing node Pods of ``wanted`` (``current`` exist) and admit the gang
    when it fits; an apiserver's refusal is raised (``trainingruns`` maps it with
    ``refusals``). ``previous`` (the run's status) is kept while no pass has placed the
    gang yet."""
    return _create_and_admit(ctx, run, wanted, current, previous or {})


def of_whole_gang(
    ctx: Context, run: api.TrainingRun, current: list[dict[str, Any]]
) -> Admission | None:
    """What :func:`admit` would answer for a gang that is whole and ungated (every node
    Pod of this attempt exists, none gated), worked out without building the wanted
    manifests: most reconciles of a running gang (each burst of its Pods' status
    changes) need none. None when :func:`admit` must decide."""
    have = {p["metadata"]["name"] for p in current}
    if any(gangs.is_gated(p) for p in current) or not have.issuperset(
        names.pod(run.name, i) for i in range(run.spec.distribution.node_count)
    ):
        return None
    ctx.cache.forget_run((run.namespace, run.name))
    return Admission(current)


def ship(ctx: Context, namespace: str) -> None:
    """Apply the shipped modules' ConfigMap (the launcher) in ``namespace`` before its
    node Pods. It is immutable and named by its content, so one apply holds; it is applied
    again only when the last one is SHIP_REFRESH_SECONDS old, which brings it back (and
    the kubelet then mounts it) in a namespace deleted and made again meanwhile."""
    # The name is hashed once per process; the manifest is built only when applied.
    key = (namespace, shipped.name_of(pods.SHIPPED_MODULES))
    now = ctx.clock()
    applied = ctx.shipped.get(key)
    if applied is None or (now - applied).total_seconds() >= SHIP_REFRESH_SECONDS:
        ctx.k8s.apply(pods.launcher_config_map(namespace))
        ctx.shipped[key] = now


def _create_and_admit(
    ctx: Context,
    run: api.TrainingRun,
    wanted: list[dict[str, Any]],
    current: list[dict[str, Any]],
    previous: Mapping[str, Any],
) -> Admission:
    ns = run.namespace
    key = (ns, run.name)
    have = {p["metadata"]["name"] for p in current}
    missing = [p for p in wanted if p["metadata"]["name"] not in have]
    gated = [p for p in current if gangs.is_gated(p)]
    if not missing and not gated:
        ctx.cache.forget_run(key)
        return Admission(current)  # created and admitted: nothing to decide
    if missing:
        ship(ctx, ns)
    # The headless Service (rank 0's DNS name) is applied when the gang is admitted, not
    # while it waits: a queue of thousands makes no Services (nor their Endpoints) early.
    if run.spec.scheduling.queue_name:  # Kueue admits plain Pod groups itself
        if missing:
            ctx.k8s.apply(pods.service(run))
        return _create(ctx, ns, current, missing)
    if missing and current and len(gated) < len(current):
        # An admitted gang that lost some Pods before they were all created (operator
        # restart): finish it ungated, each in the domain of the rank next to it.
        ctx.k8s.apply(pods.service(run))
        return _create(ctx, ns, current, [_beside(p, current, run) for p in missing])
    if missing:
        return _create_gang(ctx, run, wanted, current, missing)
    if key in ctx.cache.admitted:  # a pass admitted it: lift every gate together
        ctx.k8s.apply(pods.service(run))
        by_name = {p["metadata"]["name"]: p for p in wanted}
        chosen = ctx.cache.selectors.get(key, ())
        note = _where(run, chosen)
        _write(ctx, [_open(by_name[p["metadata"]["name"]], chosen, note) for p in gated])
        ctx.cache.forget_run(key)
        return Admission(current, _admitted(run, wanted))
    return _queued(ctx, key, current, previous)


def _create_gang(
    ctx: Context,
    run: api.TrainingRun,
    wanted: list[dict[str, Any]],
    current: list[dict[str, Any]],
    missing: list[dict[str, Any]],
) -> Admission:
    """Create the gang's missing Pods, ungated when a pass with the gang in it admits
    it. With a PriorityClass (whose value only the apiserver knows), or before the cache
    is primed, they are created gated, and the next pass places them."""
    key = (run.namespace, run.name)
    cache = ctx.cache
    with cache.lock:
        decisions: dict[tuple[str, str], gangs.Decision] = {}
        far_back = None
        if cache.ready and not run.spec.compute.priority_class_name:
            gang = gangs.gang_of(key, _queued_at(run), len(wanted), wanted[0])
            far_back = _far_back(cache, gang)
            if far_back is None:
                decisions = _decide(cache, gang)
        admit_it = key in decisions and decisions[key].admit
        chosen = decisions[key].selectors if admit_it else ()
        note = _where(run, chosen)
        planned = [_open(p, chosen, note) for p in missing] if admit_it else missing
        for p in planned:  # taken (or queued) at once, before the apiserver answers
            cache.assume(p, quiet=far_back is not None)
        admitted, moved = _record(cache, decisions, skip=key)
        others = admitted + moved
        if not admit_it and far_back is None:
            cache.dirty = True
    try:
        if admit_it:
            ctx.k8s.apply(pods.service(run))
        _write(ctx, planned, quiet=far_back is not None, new=True)
    except Exception:
        for p in planned:
            cache.pod_event("DELETED", p)
        raise
    telemetry.PODS_CREATED.inc(len(missing), namespace=run.namespace)
    created = current + missing
    if admit_it:
        return Admission(created, _admitted(run, wanted), others)
    if far_back is not None:
        return Admission(created, far_back, others, queue=_queue_field(far_back.pool, far_back))
    decision = decisions.get(key)
    if decision is None:
        return Admission(created, gangs.Decision(False, 0, WAITING_MESSAGE), others)
    gang = gangs.gang_of(key, _queued_at(run), len(wanted), wanted[0])
    return Admission(created, decision, others, queue=_queue_field(pool_name(gang), decision))


def _rank(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"]["labels"][names.LABEL_NODE_RANK])


def _where(run: api.TrainingRun, selectors: Sequence[Mapping[str, str]]) -> str | None:
    """Where a gang with a placement went, by node rank (its Pods' admitted note)."""
    if run.spec.placement is None or not selectors:
        return None
    level = run.spec.placement.topology.level
    values = [str(s.get(level, "")) for s in selectors]
    return f"all {len(values)} node Pod(s) admitted together" + topology.describe(level, values)


def _open(
    pod: dict[str, Any], selectors: Sequence[Mapping[str, str]], note: str | None = None
) -> dict[str, Any]:
    """``pod`` ungated, in its rank's domain when its gang has a placement (``note``: where
    the gang went)."""
    rank = _rank(pod)
    return pods.ungate(pod, selectors[rank] if rank < len(selectors) else None, admitted=note)


def _beside(
    pod: dict[str, Any], current: Sequence[Mapping[str, Any]], run: api.TrainingRun
) -> dict[str, Any]:
    """``pod`` ungated, in the domain of the nearest rank created before it (a gang with
    a placement: its ranks stay together)."""
    if run.spec.placement is None:
        return pods.ungate(pod)
    level = run.spec.placement.topology.level
    rank = _rank(pod)
    near = sorted(current, key=lambda p: (abs(_rank(p) - rank), _rank(p)))
    selector = next(
        (
            {k: v for k, v in (p["spec"].get("nodeSelector") or {}).items() if k == level}
            for p in near
            if level in (p["spec"].get("nodeSelector") or {})
        ),
        None,
    )
    return pods.ungate(pod, selector)


@dataclass(frozen=True)
class _FarBack(gangs.Decision):
    """The decision for a gang created far back in a blocked queue, with its pool's name."""

    pool: str = ""


def _far_back(cache: caches.Cache, gang: gangs.Gang) -> _FarBack | None:
    """A new gang with ``EXACT_POSITIONS`` gangs ahead of it in a pool whose head the
    last pass found blocked: not admitted, and further back than an exact position is
    kept, which needs no pass (a pass would decide the same, and move nobody: those
    behind it are further back too). None when a pass must decide (the head is not
    blocked, the gang is near the head, or it might not fit the pool at all). A change
    not yet passed over (dirty) makes a pass soon, which moves this gang if its place
    turns out otherwise."""
    cache.drain()
    if gang.pool_key not in cache.blocked:
        return None
    mine, ahead = gangs.order_key(gang), 0
    for other in cache.iter_waiting():
        if other.pool_key == gang.pool_key and gangs.order_key(other) < mine:
            ahead += 1
            if ahead >= gangs.EXACT_POSITIONS:
                break
    else:
        return None
    idle = gangs.free_nodes(cache.nodes(), [])
    if gangs.place(gang, idle) < gang.size:  # no room even in the idle pool: say so
        return None
    message = gangs.beyond_message(gangs.describe_need(gang))
    cache.places[gang.key] = caches.Place(pool_name(gang), 0, message)
    return _FarBack(False, 0, message, pool=pool_name(gang))


def _queued(
    ctx: Context, key: tuple[str, str], current: list[dict[str, Any]], previous: Mapping[str, Any]
) -> Admission:
    """A gated gang that no pass has admitted: its place in its pool's queue, as the
    last pass saw it (before the first pass, what its status said)."""
    with ctx.cache.lock:
        place = ctx.cache.places.get(key)
    if place is None:
        said = next(
            (
                c.get("message", "")
                for c in previous.get("conditions") or []
                if c.get("type") == "Admitted" and c.get("reason") == "Queued"
            ),
            "",
        )
        queue = previous.get("queue")
        return Admission(
            current,
            gangs.Decision(False, 0, said or WAITING_MESSAGE),
            queue=dict(queue) if isinstance(queue, Mapping) else None,
        )
    decision = gangs.Decision(False, 0, place.message, place.position)
    return Admission(current, decision, queue=_queue_field(place.pool, decision))


def _admitted(run: api.TrainingRun, wanted: list[dict[str, Any]]) -> gangs.Decision:
    gang = gangs.gang_of((run.namespace, run.name), "", len(wanted), wanted[0])
    return gangs.Decision(True, gang.size, f"{gangs.describe_need(gang)}: all fit")


def _queued_at(run: api.TrainingRun) -> str:
    return str(run.metadata.get("creationTimestamp", ""))


def _queue_field(pool: str, decision: gangs.Decision) -> dict[str, Any] | None:
    """``{pool, position}``; a run further back than the exact positions: ``{pool}``."""
    if decision.admit or not pool:
        return None
    return {"pool": pool, "position": decision.position} if decision.position else {"pool": pool}


def pool_name(gang: gangs.Gang) -> str:
    """The name a pool's queue goes by: its pool label, else its node selector."""
    return gang.pool or ",".join(f"{k}={v}" for k, v in gang.pool_key) or "default"


def _write(
    ctx: Context, manifests: list[dict[str, Any]], *, quiet: bool = False, new: bool = False
) -> None:
    """Write ``manifests`` (Pods) and tell the cache what the apiserver holds now.

    A Pod that exists (``new`` False: its gate is being lifted) or carries the gang gate
    is applied: the gate goes by a later apply that leaves it out, which removes only
    what that manager's applies set. A ``new`` Pod without the gate (an admitted gang,
    Kueue's Pods) is created by POST, which costs the apiserver less than an apply (it
    merges no applied configuration: about 1 ms of its CPU per Pod, measured); one that
    exists already (409: an earlier write this reconcile did not see) is applied."""

    def write(pod: dict[str, Any]) -> dict[str, Any]:
        if not new or gangs.is_gated(pod):
            return ctx.k8s.apply(pod)
        try:
            return ctx.k8s.create(pod, field_manager=k8s.FIELD_MANAGER)
        except k8s.ApiError as err:
            if not err.conflict:
                raise
            return ctx.k8s.apply(pod)

    written: list[dict[str, Any]] = []
    context.parallel(lambda p: written.append(write(p)), manifests)
    for pod in written:
        ctx.cache.assume(pod, quiet=quiet)


def _create(
    ctx: Context, ns: str, current: list[dict[str, Any]], missing: list[dict[str, Any]]
) -> Admission:
    """Create ``missing`` as they are, with no admission decision."""
    create_pods(ctx, ns, missing)
    return Admission(current + missing)


def create_pods(ctx: Context, ns: str, manifests: list[dict[str, Any]]) -> None:
    """Create node Pods someone else admitted (Kueue), ungated, by POST."""
    _write(ctx, manifests, new=True)
    telemetry.PODS_CREATED.inc(len(manifests), namespace=ns)


# -- the admission pass -------------------------------------------------------------------


def prime(ctx: Context) -> None:
    """The one list at start-up that the watches then keep current: Nodes, and the
    unfinished Pods (the cache keeps torchyard's and those that hold GPUs)."""
    ctx.cache.prime(ctx.k8s.list_(k8s.NODES), _live_pods(ctx))


def _live_pods(ctx: Context) -> list[dict[str, Any]]:
    return ctx.k8s.list_(
        k8s.PODS, None, field_selector="status.phase!=Succeeded,status.phase!=Failed"
    )


def refresh_outside(ctx: Context, namespaces: Sequence[str]) -> bool:
    """A namespaced operator watches its namespaces only, but other installations' gangs
    and GPU Pods share the nodes: this list (every ``OUTSIDE_REFRESH_SECONDS``, not per
    reconcile) keeps them current in the cache. True when they changed."""
    return ctx.cache.replace_outside(namespaces, _live_pods(ctx))


@dataclass(frozen=True)
class Passed:
    """The runs an admission pass wants reconciled."""

    admitted: list[Key] = field(default_factory=list)  # their gates are to be lifted: soon
    moved: list[Key] = field(default_factory=list)  # their place in the queue changed

    @property
    def keys(self) -> list[Key]:
        return self.admitted + self.moved


def run_pass(ctx: Context, *, force: bool = False) -> Passed:
    """One admission pass over every pool's queue, when the cache changed since the
    last one (or ``force``): the runs to reconcile (admitted, or moved in their queue)."""
    cache = ctx.cache
    with cache.lock:
        cache.drain()
        if not cache.ready or not (cache.dirty or force):
            return Passed()
        cache.dirty = False
        decisions = _decide(cache, None)
        if not decisions:
            cache.blocked = set()  # nobody waits: no pool is blocked
        return Passed(*_record(cache, decisions, skip=None))


def _decide(cache: caches.Cache, extra: gangs.Gang | None) -> dict[tuple[str, str], gangs.Decision]:
    """The decisions over the cache's queues (with ``extra``, a gang not created yet).
    Admitted gangs whose gates are lifted (or that are gone) stop being held as such."""
    cache.drain()
    for key in list(cache.admitted):
        if not any(gangs.is_gated(p) for p in cache.run_pods(key)):
            cache.admitted.discard(key)
    waiting = [g for g in cache.waiting() if extra is None or g.key != extra.key]
    if extra is not None:
        waiting.append(extra)
    return gangs.decide(waiting, cache.nodes(), cache.pods())


def _record(
    cache: caches.Cache,
    decisions: Mapping[tuple[str, str], gangs.Decision],
    skip: tuple[str, str] | None,
) -> tuple[list[Key], list[Key]]:
    """Hold the admitted gangs as admitted and every waiting run's place; the runs (but
    ``skip``, the run being reconciled) admitted, and those whose place changed."""
    if not decisions:
        return [], []
    admitted: list[Key] = []
    moved: list[Key] = []
    waiting = {g.key: g for g in cache.waiting()}
    gang_pools = {k: pool_name(g) for k, g in waiting.items()}
    cache.blocked = {
        waiting[key].pool_key for key, d in decisions.items() if d.blocking and key in waiting
    }
    for (ns, name), decision in decisions.items():
        key = (ns, name)
        if decision.admit:
            cache.admitted.add(key)
            if decision.selectors:
                cache.selectors[key] = decision.selectors
            cache.places.pop(key, None)
            if key != skip:
                admitted.append(("TrainingRun", ns, name))
            continue
        place = caches.Place(gang_pools.get(key, ""), decision.position, decision.message)
        if cache.places.get(key) != place:
            cache.places[key] = place
            if key != skip:
                moved.append(("TrainingRun", ns, name))
    for key in set(cache.places) - set(decisions):
        del cache.places[key]  # admitted or gone
    return admitted, moved
