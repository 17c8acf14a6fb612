"""Gang admission: create a run's missing node Pods, and admit the gang when it fits whole.

:func:`admit` is the "apply children" step of ``trainingruns.reconcile``. A fresh gang
that fits the pool is created without scheduling gates (one write per Pod); one that does
not is created gated, and admitted later by lifting every gate together. The decision
itself is pure (``planning.admission.decide``) over the cluster's Nodes and unfinished
Pods, which are read here under one lock, so that the next decision sees these Pods'
claim on the pool. A run with ``scheduling.queueName`` is left to Kueue. The apiserver's
refusals that a user must fix come back as :class:`Admission` fields rather than errors:
a missing ServiceAccount (the run waits for it) and Pod Security (the run cannot run).
Tested in tests/unit/controller/test_reconcile.py and against a real control plane in
tests/integration/test_trainingruns.py.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torchyard import api, k8s
from torchyard.controller import context, telemetry
from torchyard.controller.context import Context, Key
from torchyard.planning import admission as gangs
from torchyard.planning import names, pods

SERVICE_ACCOUNT_RETRY_SECONDS = 10.0
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Admission:
    """What applying the gang did."""

    pods: list[dict[str, Any]]  # the current attempt's Pods, those just created included
    decision: gangs.Decision | None = None  # None: nothing was decided this time
    others: list[Key] = field(default_factory=list)  # other runs the decision admitted
    # (reason, message): the Pods cannot be created yet (a missing ServiceAccount).
    pending: tuple[str, str] | None = None
    refused: str = ""  # the namespace's Pod Security admission refuses the Pods: why


def admit(
    ctx: Context,
    run: api.TrainingRun,
    wanted: list[dict[str, Any]],
    current: list[dict[str, Any]],
) -> Admission:
    """Create the missing node Pods of ``wanted`` (``current`` exist) and admit the gang
    when it fits; the apiserver's refusals that a user must fix are told apart."""
    try:
        return _create_and_admit(ctx, run, wanted, current)
    except k8s.ApiError as err:
        if err.status == 403 and no_service_account(err.message):
            # The run waits for it (its creation sends this operator no event).
            return Admission(current, pending=service_account_missing(run))
        if err.status == 403 and "PodSecurity" in err.message:
            return Admission(
                current,
                refused=(
                    f"the namespace's Pod Security admission refused the node Pods "
                    f"({err.message}); set spec.runAsUser (e.g. 1000, the curated "
                    "images' user) to run them as non-root"
                ),
            )
        raise


def no_service_account(message: str) -> bool:
    """The apiserver's ServiceAccount admission refused a Pod whose ServiceAccount is
    missing ("error looking up service account NS/NAME: serviceaccount "NAME" not found")."""
    text = message.lower()
    return "service account" in text and "not found" in text


def service_account_missing(run: api.TrainingRun) -> tuple[str, str]:
    sa, ns = run.spec.service_account_name, run.namespace
    return (
        "ServiceAccountNotFound",
        f"the node Pods run as ServiceAccount {sa} (spec.serviceAccountName), which does not "
        f"exist in namespace {ns}: create it (kubectl create serviceaccount {sa} -n {ns}) "
        "or name one that exists; the run waits for it",
    )


def _create_and_admit(
    ctx: Context, run: api.TrainingRun, wanted: list[dict[str, Any]], current: list[dict[str, Any]]
) -> Admission:
    ns = run.namespace
    key = (ns, run.name)
    have = {p["metadata"]["name"] for p in current}
    missing = [p for p in wanted if p["metadata"]["name"] not in have]
    gated = [p for p in current if gangs.is_gated(p)]
    if not missing and not gated:
        return Admission(current)  # created and admitted: nothing to decide
    if missing:
        ctx.k8s.apply(pods.service(run))
    if run.spec.scheduling.queue_name:  # Kueue admits plain Pod groups itself
        return _create(ctx, ns, current, missing)
    if missing and current and len(gated) < len(current):
        # An admitted gang that lost some Pods before they were all created (operator
        # restart): finish it ungated.
        return _create(ctx, ns, current, [pods.ungate(p) for p in missing])
    with _LOCK:
        cluster_pods = _cluster_pods(ctx)
        waiting = [g for g in _gangs(cluster_pods) if g.key != key]
        waiting.append(_gang_of(run, wanted))
        decisions = gangs.decide(waiting, ctx.k8s.list_(k8s.NODES), cluster_pods)
        decision = decisions[key]
        if decision.admit:
            by_name = {p["metadata"]["name"]: p for p in wanted}
            context.parallel(
                ctx.k8s.apply,
                [pods.ungate(p) for p in missing]
                + [pods.ungate(by_name[p["metadata"]["name"]]) for p in gated],
            )
        else:
            context.parallel(ctx.k8s.apply, missing)
    if missing:
        telemetry.PODS_CREATED.inc(len(missing), namespace=ns)
    others = [("TrainingRun", k[0], k[1]) for k, d in decisions.items() if d.admit and k != key]
    return Admission(current + missing, decision, others)


def _create(
    ctx: Context, ns: str, current: list[dict[str, Any]], missing: list[dict[str, Any]]
) -> Admission:
    """Create ``missing`` as they are, with no admission decision."""
    context.parallel(ctx.k8s.apply, missing)
    telemetry.PODS_CREATED.inc(len(missing), namespace=ns)
    return Admission(current + missing)


def _gangs(cluster_pods: list[dict[str, Any]]) -> list[gangs.Gang]:
    """The runs whose Pods all still carry the gang gate, from a cluster-wide Pod list."""
    by_run: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for p in cluster_pods:
        run = p["metadata"].get("labels", {}).get(names.LABEL_RUN)
        if run and gangs.is_gated(p) and not p["metadata"].get("deletionTimestamp"):
            by_run[(p["metadata"]["namespace"], run)].append(p)
    found = []
    for key, members in by_run.items():
        first = min(members, key=lambda p: p["metadata"].get("creationTimestamp", ""))
        created = first["metadata"].get("creationTimestamp", "")
        queued_at = first["metadata"].get("annotations", {}).get(pods.QUEUED_AT_ANNOTATION, created)
        found.append(_gang(key, queued_at, len(members), first))
    return found


def _gang_of(run: api.TrainingRun, wanted: list[dict[str, Any]]) -> gangs.Gang:
    created = str(run.metadata.get("creationTimestamp", ""))
    return _gang((run.namespace, run.name), created, len(wanted), wanted[0])


def _gang(key: tuple[str, str], created: str, size: int, pod: Mapping[str, Any]) -> gangs.Gang:
    """A gang of ``size`` Pods like ``pod``."""
    spec = pod["spec"]
    return gangs.Gang(
        key=key,
        created=created,
        size=size,
        request=gangs.pod_requests(pod),
        selector=spec.get("nodeSelector", {}),
        tolerations=spec.get("tolerations", []),
        pool=spec.get("nodeSelector", {}).get(pods.POOL_LABEL, ""),
    )


def _cluster_pods(ctx: Context) -> list[dict[str, Any]]:
    return ctx.k8s.list_(
        k8s.PODS, None, field_selector="status.phase!=Succeeded,status.phase!=Failed"
    )


def waiting_runs(ctx: Context) -> list[Key]:
    """Runs waiting for admission: reconcile them when capacity frees up."""
    return [("TrainingRun", g.key[0], g.key[1]) for g in _gangs(_cluster_pods(ctx))]
