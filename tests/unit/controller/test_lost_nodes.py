"""Which Nodes of a run's Pods are gone (``lost_nodes.gone_nodes``): the cache's word when it
saw the Node, the apiserver's when it never did, and nothing before the cache is primed.
The release itself is a row of tests/unit/controller/test_reconcile.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.controller.fake_k8s import FakeK8s
from tests.unit.controller.world import gpu_node, node_pod
from torchyard import k8s
from torchyard.controller import context, lost_nodes


class CountingK8s(FakeK8s):
    """The fake, counting the Node lists (the only call ``gone_nodes`` may make)."""

    def __init__(self, *objects: dict[str, Any]) -> None:
        super().__init__(*objects)
        self.node_lists: list[str | None] = []

    def list_(self, res: k8s.Resource, namespace: str | None = None, **kw: Any) -> Any:
        if res.plural == k8s.NODES.plural:
            self.node_lists.append(kw.get("field_selector"))
        return super().list_(res, namespace, **kw)


def bound(node: str, phase: str = "Running") -> dict[str, Any]:
    return node_pod(0, phase=phase, node_name=node)


def ctx_of(fake: FakeK8s, cached: list[str], *, primed: bool = True) -> context.Context:
    ctx = context.Context(k8s=fake)
    if primed:
        ctx.cache.prime([gpu_node(n) for n in cached], [])
    return ctx


def test_a_node_the_cache_saw_deleted_is_gone_without_asking_the_apiserver() -> None:
    fake = CountingK8s()
    ctx = ctx_of(fake, ["gpu-0"])
    ctx.cache.feed("Node", "DELETED", gpu_node("gpu-0"))  # taken in by the reader
    assert lost_nodes.gone_nodes(ctx, [bound("gpu-0")]) == {"gpu-0"}
    assert fake.node_lists == []


def test_a_node_the_cache_holds_is_there_without_asking() -> None:
    fake = CountingK8s()  # the apiserver has no such Node: it is not asked
    ctx = ctx_of(fake, ["gpu-0"])
    assert lost_nodes.gone_nodes(ctx, [bound("gpu-0")]) == set()
    assert fake.node_lists == []


@pytest.mark.parametrize(
    ("in_apiserver", "gone"),
    [(False, {"gpu-9"}), (True, set())],
    ids=["deleted-while-no-watch-ran", "its-events-are-late"],
)
def test_a_node_the_cache_never_saw_is_what_the_apiserver_says(
    in_apiserver: bool, gone: set[str]
) -> None:
    fake = CountingK8s(*([gpu_node("gpu-9")] if in_apiserver else []))
    ctx = ctx_of(fake, ["gpu-0"])
    assert lost_nodes.gone_nodes(ctx, [bound("gpu-9"), bound("gpu-9")]) == gone
    assert fake.node_lists == ["metadata.name=gpu-9"]  # once per Node, by name


def test_finished_unbound_pods_and_an_unprimed_cache_ask_nothing() -> None:
    fake = CountingK8s()
    ctx = ctx_of(fake, [])
    pods = [bound("gpu-1", "Succeeded"), bound("gpu-2", "Failed"), node_pod(1)]
    assert lost_nodes.gone_nodes(ctx, pods) == set()
    # Before the start-up listing nothing is known: nothing is released.
    assert lost_nodes.gone_nodes(ctx_of(fake, [], primed=False), [bound("gpu-1")]) == set()
    assert fake.node_lists == []


def test_a_node_of_the_same_name_added_again_is_not_gone() -> None:
    fake = CountingK8s()
    ctx = ctx_of(fake, ["gpu-0"])
    old = gpu_node("gpu-0")
    old["metadata"]["resourceVersion"] = "5"
    ctx.cache.feed("Node", "DELETED", old)
    new = gpu_node("gpu-0")
    new["metadata"]["resourceVersion"] = "9"
    ctx.cache.feed("Node", "ADDED", new)
    assert lost_nodes.gone_nodes(ctx, [bound("gpu-0")]) == set()


def test_release_deletes_at_once_and_says_so_only_for_the_pods_it_deleted() -> None:
    pod = bound("gpu-1")
    fake = CountingK8s(pod)
    ctx = ctx_of(fake, ["gpu-0"])
    run = {"apiVersion": "torchyard.dev/v1alpha1", "kind": "TrainingRun", "metadata": {}}
    assert lost_nodes.release(ctx, run, [pod]) == [pod]
    assert fake.deleted == [("pods", "r-0")]
    assert [(t, r) for t, r, _ in fake.events] == [("Warning", "NodeLost")]
    assert "node gpu-1 was deleted: node Pod r-0 (node rank 0)" in fake.events[0][2]
    # Seen again before the watch's DELETED: released again, but no second Event.
    assert lost_nodes.release(ctx, run, [pod]) == [pod]
    assert len(fake.events) == 1
