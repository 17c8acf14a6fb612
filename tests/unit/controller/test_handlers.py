"""The Kopf handlers only queue keys: each event handler is called with an API that fails
the test on any call, and leaves behind the keys it queued and nothing else."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from tests.unit.controller.test_admission_pass import gang_pod
from tests.unit.controller.world import NS, env, gpu_node
from torchyard import k8s
from torchyard.controller import context, handlers, reads, workqueue


class NoApi:
    """A ``torchyard.k8s`` stand-in that fails on any call: a handler must not talk to
    the apiserver."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a handler called k8s.{name}")


def operator_memo(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> kopf.Memo:
    """The memo as ``handlers.configure`` leaves it, over :class:`NoApi`."""
    memo = kopf.Memo()
    memo.reads = reads.WatchedReads(NoApi())
    memo.ctx = context.Context(k8s=NoApi())
    memo.ctx.cache.prime(nodes, pods)
    memo.queue = workqueue.WorkQueue()
    memo.admission_wake = asyncio.Event()
    return memo


def queued(memo: kopf.Memo) -> list[context.Key]:
    keys = []
    while (key := memo.queue.take_nowait()) is not None:
        keys.append(key)
    return sorted(keys)


def test_a_deleted_node_only_queues_the_runs_with_pods_on_it() -> None:
    pods = [
        gang_pod("on-it", 0, gated=False, node_name="gpu-1"),
        gang_pod("elsewhere", 0, gated=False, node_name="gpu-0"),
    ]
    memo = operator_memo([gpu_node("gpu-0"), gpu_node("gpu-1")], pods)

    async def deleted() -> None:
        await handlers.node_event(type="DELETED", name="gpu-1", body=gpu_node("gpu-1"), memo=memo)

    asyncio.run(deleted())
    assert queued(memo) == [("TrainingRun", NS, "on-it")]
    # The cache takes the deletion in (for the reconcile's lost_nodes): nothing else did.
    assert memo.ctx.cache.node_gone("gpu-1") is True


def test_a_healthy_nodes_change_queues_nothing() -> None:
    pods = [gang_pod("on-it", 0, gated=False, node_name="gpu-1")]
    memo = operator_memo([gpu_node("gpu-1")], pods)
    asyncio.run(
        handlers.node_event(type="MODIFIED", name="gpu-1", body=gpu_node("gpu-1"), memo=memo)
    )
    assert queued(memo) == []


def test_a_build_job_queues_the_environments_the_watch_holds_in_its_namespace() -> None:
    memo = operator_memo([], [])
    mine, other = env(), env()
    other["metadata"].update(name="elsewhere", namespace="other")
    for obj in (mine, other):
        memo.reads.seen(k8s.ENVIRONMENTS, None, obj)
    asyncio.run(handlers.build_job_event(namespace=NS, memo=memo))
    assert queued(memo) == [("Environment", NS, "pytorch")]


def test_a_fetch_job_queues_the_runs_with_inputs_the_watch_holds_that_wait_for_them() -> None:
    memo = operator_memo([], [])
    waiting = {"metadata": {"name": "waits", "namespace": NS}, "spec": {"inputs": [{}]}}
    running = {
        "metadata": {"name": "runs", "namespace": NS},
        "spec": {"inputs": [{}]},
        "status": {"phase": "Running"},
    }
    plain = {"metadata": {"name": "plain", "namespace": NS}, "spec": {}}
    for run in (waiting, running, plain):
        memo.reads.seen(k8s.TRAININGRUNS, "ADDED", run)
    asyncio.run(handlers.input_fetch_event(namespace=NS, memo=memo))
    assert queued(memo) == [("TrainingRun", NS, "waits")]
