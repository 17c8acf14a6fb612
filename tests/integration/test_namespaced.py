"""Namespaced mode (``--namespace``) on the real control plane: the periodic resync lists
each watched namespace (a namespaced operator may not list cluster-wide), and a lost
node's Pods are released only where the operator watches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from tests.cluster.harness import Cluster
from tests.integration.helpers import wait_for
from torchyard import k8s
from torchyard.controller import lost_nodes, workqueue


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


def test_a_lost_nodes_pods_are_released_only_in_watched_namespaces(
    two_namespaces: tuple[str, str], operator_client: k8s.Client
) -> None:
    watched, other = two_namespaces
    node = "cpu-1"  # a KWOK node; the function is called as if it had been deleted
    for ns in two_namespaces:
        k8s.create(bound_pod(ns, "lost", node))
    released = lost_nodes.release(operator_client, node, [watched])
    assert released == [(watched, "lost")]

    def gone_or_going(ns: str) -> bool:
        pod = k8s.get_or_none(k8s.PODS, ns, "lost-0")
        return pod is None or bool(pod["metadata"].get("deletionTimestamp"))

    wait_for("the watched namespace's Pod to go", lambda: gone_or_going(watched))
    untouched = k8s.get(k8s.PODS, other, "lost-0")
    assert "deletionTimestamp" not in untouched["metadata"]
    # Cluster-wide (no --namespace), the other namespace's Pod goes too.
    assert (other, "lost") in lost_nodes.release(operator_client, node)
    wait_for("the other namespace's Pod to go", lambda: gone_or_going(other))
