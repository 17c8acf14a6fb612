"""The Pods of a run whose Node was deleted, released by the run's reconcile.

A Pod bound to a Node that was deleted stays until PodGC takes it (a while): no kubelet
will end it, and its run's gang would wait for it. Each TrainingRun reconcile
(``trainingruns.reconcile``, right after it observed the run's Pods) calls
:func:`release`, which deletes the run's unfinished Pods whose Node is gone (grace 0) and
records a Warning ``NodeLost`` Event on the run that names the node (the run's status
names the Pod, which is gone by then); the reconcile goes on without them, so its failure
policy sees a lost node Pod. A Node is gone when the watch-fed cache saw it deleted
(``cache.Cache.node_gone``), or, when the cache never saw it (the operator was down when
it went, or its events are late), when the apiserver has no Node of that name: so an
operator started after the Node vanished releases the Pods all the same. The Node event
handler (``handlers.node_event``) only queues the runs with Pods on a deleted Node.
Only the watched namespaces' runs are reconciled, so a namespaced operator releases no
other Pods. Tested in tests/unit/controller/test_reconcile.py and against a real control
plane in tests/integration/test_namespaced.py and test_trainingruns.py (a deleted KWOK
node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torchyard import k8s
from torchyard.controller import context
from torchyard.planning import names
from torchyard.status import timestamp


def gone_nodes(ctx: context.Context, pods: Sequence[Mapping[str, Any]]) -> set[str]:
    """The names of the Nodes, among those the unfinished ``pods`` are bound to, that are
    gone (see the module docstring): the apiserver is asked only of a Node the cache
    never saw."""
    bound = {str(p["spec"]["nodeName"]) for p in pods if _bound(p) and context.live(p)}
    gone = set()
    for node in sorted(bound):
        known = ctx.cache.node_gone(node)
        if known is None:
            known = not ctx.k8s.list_(k8s.NODES, None, field_selector=f"metadata.name={node}")
        if known:
            gone.add(node)
    return gone


def release(
    ctx: context.Context, run: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """Delete the unfinished ``pods`` of ``run`` that are bound to a gone Node, at once
    (grace 0: no kubelet will confirm their end), with a ``NodeLost`` Event for each one
    this call deleted; returns the Pods released (those already gone too)."""
    gone = gone_nodes(ctx, pods)
    lost = [p for p in pods if context.live(p) and _bound(p) and p["spec"]["nodeName"] in gone]
    for pod in lost:
        meta = pod["metadata"]
        if ctx.k8s.delete(k8s.PODS, meta["namespace"], meta["name"], grace_period_seconds=0):
            rank = meta.get("labels", {}).get(names.LABEL_NODE_RANK, "?")
            message = (
                f"node {pod['spec']['nodeName']} was deleted: node Pod {meta['name']} "
                f"(node rank {rank}) is lost with it"
            )
            now = timestamp(ctx.clock())
            ctx.k8s.record_event(dict(run), "Warning", "NodeLost", message, now=now)
    return lost


def _bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))
