"""The Kopf handlers only queue keys: each event handler is called with an API that fails
the test on any call, and leaves behind the keys it queued and nothing else."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kopf

from tests.unit.controller.test_admission_pass import gang_pod
from tests.unit.controller.world import NS, env, gpu_node
from torchyard import k8s
from torchyard.api import wire
from torchyard.controller import admission, context, handlers, reads, workqueue


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
    memo.sweep_reads = {}
    memo.settled_sweeps = {}
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


def trial(phase: str, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {
            "name": "tune-t7",
            "namespace": NS,
            "resourceVersion": "1",
            "labels": {wire.LABEL_SWEEP: "tune", wire.LABEL_TRIAL: "7"},
        },
        "spec": {"command": ["python", "train.py"]},
        "status": {"phase": phase, **status},
    }


def trial_event(memo: kopf.Memo, body: dict[str, Any], type_: str = "MODIFIED") -> list[Any]:
    meta = body["metadata"]
    body["metadata"]["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
    asyncio.run(
        handlers.trainingrun_event(
            type=type_,
            name=meta["name"],
            namespace=NS,
            meta=meta,
            status=body["status"],
            body=copy.deepcopy(body),
            memo=memo,
        )
    )
    keys = queued(memo)
    for key in keys:
        memo.queue.done(key)  # reconciled: the next event queues it again
    return [key for key in keys if key[0] == "Sweep"]


def test_a_trial_queues_its_sweep_only_when_what_the_sweep_reads_of_it_changed() -> None:
    memo = operator_memo([], [])
    sweep = [("Sweep", NS, "tune")]
    waiting = trial("Queued", queue={"pool": "a100", "position": 9})
    assert trial_event(memo, waiting, "ADDED") == sweep  # first seen
    # moved up the queue, its Admitted condition's message with it: nothing the Sweep reads
    waiting["status"]["queue"]["position"] = 8
    waiting["status"]["conditions"] = [{"type": "Admitted", "status": "False", "message": "8th"}]
    assert trial_event(memo, waiting) == []
    assert trial_event(memo, waiting) == []  # the same again (a watch that listed anew)
    running = trial("Running", startTime="2026-11-27T10:00:00Z")
    assert trial_event(memo, running) == sweep
    running["status"]["progress"] = {"step": 1, "metrics": {"best_val_acc": 0.5}}
    assert trial_event(memo, running) == sweep
    running["metadata"]["annotations"] = {wire.ANNOTATION_DECISION: "stopped"}
    assert trial_event(memo, running) == sweep
    failed = {"type": "Failed", "status": "True", "message": "rank 0 exited with 1"}
    running["status"]["conditions"] = [failed]
    assert trial_event(memo, running) == sweep
    assert trial_event(memo, running, "DELETED") == sweep
    assert trial_event(memo, running, "ADDED") == sweep  # a namesake made again


def test_runs_are_held_by_the_index_handler_and_trials_read_from_them_once_listed() -> None:
    """Kopf runs the index handler of every listed run before any event handler, so the
    first event handler says the held runs are complete: a Sweep's trials are then listed
    from them (the API here fails on any call)."""
    memo = operator_memo([], [])
    waiting = trial("Queued")
    assert asyncio.run(handlers.trainingrun_held(body=copy.deepcopy(waiting), memo=memo)) is None
    assert not memo.reads.runs_listed.is_set()
    assert memo.reads.names(k8s.TRAININGRUNS, NS) == ["tune-t7"]
    asyncio.run(
        handlers.sweep_event(type=None, name="tune", namespace=NS, meta={}, body={}, memo=memo)
    )
    assert memo.reads.runs_listed.is_set()
    selector = f"{wire.LABEL_SWEEP}=tune"
    [held] = memo.reads.list_(k8s.TRAININGRUNS, NS, label_selector=selector)
    assert held["status"]["phase"] == "Queued"
    trial_event(memo, waiting, "DELETED")  # the deletion comes by the event handler
    assert memo.reads.list_(k8s.TRAININGRUNS, NS, label_selector=selector) == []


def test_a_pass_that_admitted_a_gang_shows_the_others_new_places_a_moment_later() -> None:
    """The admitted run's reconcile (its gates lifted) goes first; the runs that moved up
    the queue (their position written) wait a moment when a gang was admitted, so that
    their status writes do not take its CPU; with no gang admitted they go at once."""
    admitted = [("TrainingRun", NS, "next")]
    moved = [("TrainingRun", NS, f"r{i}") for i in range(3)]
    delay = handlers.MOVED_DELAY_SECONDS
    assert delay > 0
    assert handlers.after_pass(admission.Passed(admitted, moved)) == [
        (admitted[0], 0.0, workqueue.STATUS),
        *((key, delay, workqueue.BACKGROUND) for key in moved),
    ]
    assert handlers.after_pass(admission.Passed([], moved)) == [
        (key, 0.0, workqueue.BACKGROUND) for key in moved
    ]


def sweep_seen(memo: kopf.Memo, status: dict[str, Any]) -> None:
    """The Sweep ``tune``'s event with ``status`` (its own status write: nothing queued)."""
    asyncio.run(
        handlers.sweep_event(
            type="MODIFIED",
            name="tune",
            namespace=NS,
            meta={"resourceVersion": "5"},
            body={"status": status},
            memo=memo,
        )
    )


def test_a_trials_change_queues_a_settled_sweep_a_moment_later_else_at_once() -> None:
    """A sweep whose every trial is made (none paused) only keeps its books when a trial
    ends: it is queued a moment later, after the gang admitted into the freed place, and
    the burst of its trials' events is one reconcile; one with trials left to make is
    queued at once (it makes the next)."""
    memo = operator_memo([], [])
    now = [100.0]
    memo.queue = workqueue.WorkQueue(clock=lambda: now[0])
    memo.ctx.written[("Sweep", NS, "tune")] = "5"
    sweep = [("Sweep", NS, "tune")]
    sweep_seen(memo, {"phase": "Running", "trials": {"planned": 500, "created": 40}})
    assert trial_event(memo, trial("Running", startTime="2026-11-27T10:00:00Z")) == sweep
    sweep_seen(memo, {"phase": "Running", "trials": {"planned": 500, "created": 500}})
    assert trial_event(memo, trial("Succeeded", startTime="2026-11-27T10:00:00Z")) == []
    now[0] += handlers.SETTLED_SWEEP_DELAY_SECONDS
    assert queued(memo) == sweep
