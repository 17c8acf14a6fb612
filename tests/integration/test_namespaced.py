"""Namespaced mode (``--namespace``) on the real control plane: the periodic resync lists
each watched namespace (a namespaced operator may not list cluster-wide), and a deleted
node's Pods are released by their run's reconcile (``controller.lost_nodes``), only where
the operator watches, also by an operator that was down when the node went."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from tests.cluster.harness import Cluster, Pool
from tests.conftest import InProcessOperator
from tests.integration.conftest import operator_instead
from tests.integration.helpers import run_pods, wait_event, wait_for, wait_status
from tests.integration.test_trainingruns import extra_pool, running
from torchyard import k8s
from torchyard.controller import workqueue

__all__ = ["extra_pool"]  # a fixture


@pytest.fixture
def two_namespaces(cluster: Cluster, namespace: str) -> Iterator[tuple[str, str]]:
    other = cluster.create_namespace(f"{namespace[:56]}-b")
    yield namespace, other
    cluster.delete_namespace(other)


def bound_pod(namespace: str, run: str, node: str) -> dict[str, Any]:
    """A torchyard-labelled Pod bound to ``node`` (as a node Pod would be)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{run}-0",
            "namespace": namespace,
            "labels": {"torchyard.dev/run": run},
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [{"name": "trainer", "image": "busybox"}],
        },
    }


def test_the_resync_lists_only_the_watched_namespaces(
    two_namespaces: tuple[str, str], operator_client: k8s.Client
) -> None:
    watched, other = two_namespaces
    for ns in two_namespaces:
        k8s.create(TrainingRunBuilder("run", ns).obj())
    mine = workqueue.resync_keys(operator_client, [watched])
    assert ("TrainingRun", watched, "run") in mine
    assert {key[1] for key in mine} == {watched}
    everywhere = workqueue.resync_keys(operator_client)
    assert {("TrainingRun", watched, "run"), ("TrainingRun", other, "run")} <= set(everywhere)


@pytest.fixture
def namespaced_operator(operator: InProcessOperator, env: str) -> Iterator[InProcessOperator]:
    """An operator that watches only ``env`` (with its Environment ``pytorch`` Ready)
    instead of the session's."""
    with operator_instead(operator, [env]) as mine:
        yield mine


@pytest.mark.parametrize("extra_pool", [(1, 8)], indirect=True)
@pytest.mark.parametrize("down", [False, True], ids=["seen-live", "deleted-while-down"])
def test_a_deleted_nodes_pods_are_released_by_their_runs_reconcile_in_watched_namespaces(
    two_namespaces: tuple[str, str],
    extra_pool: Pool,
    namespaced_operator: InProcessOperator,
    down: bool,
) -> None:
    """The Node's DELETE queues the run, whose reconcile releases its Pod; an operator
    that was down when the Node went (``down``) never sees that event, and its reconcile
    releases the Pod all the same. The NodeLost Event is the operator's: PodGC would
    take the Pod too, but only after its quarantine (40 s) and without an Event."""
    watched, other = two_namespaces
    k8s.create(
        TrainingRunBuilder("lost", watched)
        .environment("pytorch")
        .nodes(1)
        .gpus(8)
        .pool(extra_pool.name)
        .obj()
    )
    running(watched, "lost")
    pod = run_pods(watched, "lost")[0]
    node = pod["spec"]["nodeName"]
    # Another installation's Pod on the same node, in a namespace this operator does not
    # watch: not its to release.
    k8s.create(bound_pod(other, "lost", node))
    if down:
        namespaced_operator.stop()
    k8s.delete(k8s.NODES, None, node)
    if down:
        wait_for("the Node gone", lambda: k8s.get_or_none(k8s.NODES, None, node) is None)
        namespaced_operator.start()

    wait_event(
        watched,
        "lost",
        "the NodeLost Event naming the node",
        lambda e: e["reason"] == "NodeLost" and f"node {node} was deleted" in e["message"],
    )
    restarted = wait_status(
        k8s.TRAININGRUNS,
        watched,
        "lost",
        lambda s: s.get("restarts") == 1 and s.get("phase") == "Queued",
    )
    assert restarted["status"]["lastFailure"]["reason"] == "NodeLost"
    assert pod["metadata"]["uid"] not in {p["metadata"]["uid"] for p in run_pods(watched, "lost")}
    namespaced_operator.caught_up("TrainingRun", watched, "lost")
    untouched = k8s.get(k8s.PODS, other, "lost-0")
    assert "deletionTimestamp" not in untouched["metadata"]
