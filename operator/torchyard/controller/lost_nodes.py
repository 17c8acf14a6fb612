"""A deleted Node's torchyard Pods, released at once.

A Pod bound to a Node that was deleted stays until PodGC takes it (a while); its run's
gang would wait for it. The node event handler (``handlers.node_event``) calls
:func:`release` off the event loop, which deletes those Pods (grace 0) in the watched
namespaces only (a namespaced operator's Roles grant nothing elsewhere) and records a
Warning ``NodeLost`` Event on each Pod's TrainingRun that names the node (the run's
status names the Pod, which is gone by then); the handler then queues the runs, whose
failure policy sees the lost Pods. Tested in tests/integration/test_namespaced.py and
test_trainingruns.py (a deleted KWOK node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torchyard import k8s
from torchyard.controller import context, workqueue
from torchyard.planning import names
from torchyard.status import timestamp


def release(client: k8s.Client, node: str, namespaces: Sequence[str] = ()) -> list[tuple[str, str]]:
    """Delete torchyard's Pods bound to a deleted node at once (PodGC would take a while),
    only in the watched namespaces: returns the (namespace, run) of each. A Warning
    ``NodeLost`` Event on each Pod's TrainingRun names the node (the run's status names
    the Pod, which is gone by then)."""
    lost = [
        pod
        for namespace in workqueue.watched(namespaces)
        for pod in client.list_(
            k8s.PODS,
            namespace,
            label_selector=names.LABEL_RUN,
            field_selector=f"spec.nodeName={node}",
        )
    ]
    runs = []
    for pod in lost:
        meta = pod["metadata"]
        client.delete(k8s.PODS, meta["namespace"], meta["name"], grace_period_seconds=0)
        runs.append((meta["namespace"], meta["labels"][names.LABEL_RUN]))
        _record_node_lost(client, pod, node)
    return runs


def _record_node_lost(client: k8s.Client, pod: Mapping[str, Any], node: str) -> None:
    """The Event on the Pod's TrainingRun (its controller owner) that names the node."""
    meta = pod["metadata"]
    owner = next(
        (
            o
            for o in meta.get("ownerReferences", [])
            if o.get("controller") and o.get("kind") == "TrainingRun"
        ),
        None,
    )
    if owner is None:
        return
    run = {
        "apiVersion": owner.get("apiVersion"),
        "kind": "TrainingRun",
        "metadata": {"name": owner["name"], "namespace": meta["namespace"], "uid": owner["uid"]},
    }
    rank = meta.get("labels", {}).get(names.LABEL_NODE_RANK, "?")
    message = f"node {node} was deleted: node Pod {meta['name']} (node rank {rank}) is lost with it"
    client.record_event(run, "Warning", "NodeLost", message, now=timestamp(context.utcnow()))
