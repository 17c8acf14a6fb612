"""The work queue: first-due-first order, one entry per key, the events lane before the
background lane, and a resync that queues only what changed unseen, spread over its period
(operator/torchyard/controller/workqueue.py)."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest

from torchyard.controller import workqueue
from torchyard.controller.workqueue import BACKGROUND, EVENTS, STATUS, WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.now


def run(name: str) -> workqueue.Key:
    return ("TrainingRun", "team-a", name)


def drain(queue: WorkQueue) -> list[workqueue.Key]:
    taken = []
    while (key := queue.take_nowait()) is not None:
        taken.append(key)
        queue.done(key)
    return taken


def test_keys_are_served_in_the_order_they_became_due() -> None:
    clock = Clock()
    queue = WorkQueue(clock=clock)
    queue.add(run("later"), delay=5)
    queue.add(run("first"))
    clock.now += 1
    queue.add(run("second"))
    queue.add(run("first"))  # again: keeps its place, not moved to the back
    clock.now += 10  # "later" is due now, after the two others became due
    queue.add(run("third"))
    assert drain(queue) == [run("first"), run("second"), run("later"), run("third")]


def test_a_key_is_held_once_however_often_it_is_added() -> None:
    clock = Clock()
    queue = WorkQueue(clock=clock)
    for delay in (0, 0, 3, 60):
        queue.add(run("busy"), delay=delay)
    assert len(queue) == 1
    assert drain(queue) == [run("busy")]
    clock.now += 100  # the delayed adds were folded into the one that came due first
    assert drain(queue) == []


def test_an_earlier_due_time_wins_over_a_later_one() -> None:
    clock = Clock()
    queue = WorkQueue(clock=clock)
    queue.add(run("ttl"), delay=60)
    queue.add(run("ttl"), delay=2)
    clock.now += 2
    assert drain(queue) == [run("ttl")]
    clock.now += 100
    assert drain(queue) == []


def test_an_add_while_the_key_is_reconciled_queues_it_once_more_after() -> None:
    clock = Clock()
    queue = WorkQueue(clock=clock)
    queue.add(run("a"))
    key = queue.take_nowait()
    assert key == run("a")
    queue.add(run("a"))  # e.g. its Pod changed meanwhile
    queue.add(run("a"))
    assert queue.take_nowait() is None  # never two reconciles of one key at once
    queue.done(key)
    assert drain(queue) == [run("a")]


def test_events_are_served_before_resync_and_backoff_keys() -> None:
    clock = Clock()
    queue = WorkQueue(clock=clock)
    for i in range(100):
        queue.add(run(f"resync-{i}"), lane=BACKGROUND)
    queue.add(run("retry"), delay=0, lane=BACKGROUND)
    clock.now += 1
    queue.add(run("pod-went-running"))  # a Pod's phase change: its run's status is due
    queue.add(run("resync-50"), lane=EVENTS)  # an event for a key waiting in the background
    taken = drain(queue)
    assert taken[:2] == [run("pod-went-running"), run("resync-50")]
    assert taken[2:] == [run(f"resync-{i}") for i in range(100) if i != 50] + [run("retry")]


def test_backoff_doubles_on_the_background_lane_and_forget_resets_it() -> None:
    clock = Clock()
    queue = WorkQueue(clock=clock)
    assert [queue.backoff(run("flaky")) for _ in range(3)] == [0.5, 1.0, 2.0]
    queue.forget(run("flaky"))
    assert queue.backoff(run("flaky")) == 0.5
    clock.now += 0.5
    queue.add(run("event"))
    assert drain(queue) == [run("event"), run("flaky")]


def test_a_failed_reconcile_backs_off_and_a_gone_object_is_forgotten() -> None:
    clock = Clock()
    queue = WorkQueue(clock=clock)
    workqueue.follow_up(queue, run("ok"), workqueue.Followup(version="7", also=(run("other"),)))
    assert queue.seen == {run("ok"): "7"}
    assert drain(queue) == [run("other")]
    workqueue.follow_up(queue, run("bad"), workqueue.Followup(failed=True))
    assert drain(queue) == []  # not before its backoff
    clock.now += 0.5
    assert drain(queue) == [run("bad")]
    workqueue.follow_up(queue, run("ok"), workqueue.Followup(gone=True))
    assert queue.seen == {}


def test_the_resync_queues_only_what_changed_unseen_spread_over_the_period() -> None:
    clock = Clock()
    queue = WorkQueue(clock=clock)
    versions = {run(f"r{i}"): "1" for i in range(2000)}
    for key in list(versions)[:1000]:
        queue.seen[key] = "1"  # reconciled at this version: nothing to do
    queue.seen[run("deleted")] = "3"
    versions[run("r0")] = "2"  # changed, and the event was missed
    period = 600.0
    queued = workqueue.schedule_resync(queue, versions, period)
    assert set(queued) == {run("r0")} | {run(f"r{i}") for i in range(1000, 2000)}
    assert run("deleted") not in queue.seen
    assert queue.take_nowait() is None  # nothing all at once
    # Spread: every tenth of the period brings about a tenth of the keys.
    per_tenth = collections.Counter()
    for tenth in range(10):
        clock.now += period / 10
        per_tenth[tenth] = len(drain(queue))
    assert sum(per_tenth.values()) == len(queued)
    assert all(60 <= n <= 140 for n in per_tenth.values()), per_tenth


def test_a_keys_resync_offset_is_stable_and_within_the_period() -> None:
    offsets = [workqueue.offset(run(f"r{i}"), 600.0) for i in range(500)]
    assert offsets == [workqueue.offset(run(f"r{i}"), 600.0) for i in range(500)]
    assert min(offsets) >= 0 and max(offsets) < 600.0


def test_an_idle_queue_sleeps_until_an_add_without_polling() -> None:
    clock = Clock()

    async def scenario() -> tuple[int, list[asyncio.TimerHandle], workqueue.Key]:
        loop = asyncio.get_running_loop()
        queue = WorkQueue(clock=clock)
        taker = asyncio.create_task(queue.take())
        while clock.calls == 0:  # until the taker has looked at the empty queue
            await asyncio.sleep(0)
        await asyncio.sleep(0)  # and gone on to wait
        # An idle operator: nothing on the loop's clock (its private heap of timers) could
        # wake the taker again, so nothing but an add can: no tick every second.
        timers = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        calls_while_idle = clock.calls
        queue.add(run("new"))
        return calls_while_idle, timers, await asyncio.wait_for(taker, 5)

    calls, timers, key = asyncio.run(scenario())
    assert timers == []
    assert calls <= 3  # looked once, then slept
    assert key == run("new")


def test_the_resync_period_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHYARD_RESYNC_SECONDS", raising=False)
    assert workqueue.resync_seconds() == 600.0
    monkeypatch.setenv("TORCHYARD_RESYNC_SECONDS", "1800")
    assert workqueue.resync_seconds() == 1800.0
    for bad in ("0", "-5", "ten minutes"):
        monkeypatch.setenv("TORCHYARD_RESYNC_SECONDS", bad)
        with pytest.raises(ValueError, match="not a positive number of seconds; set it to"):
            workqueue.resync_seconds()


def test_a_runs_own_pod_event_goes_before_new_runs_and_resync() -> None:
    clock = Clock()
    queue = WorkQueue(clock=clock)
    queue.add(run("resync"), lane=BACKGROUND)
    for i in range(1000):  # a burst of new runs, applied at once
        queue.add(run(f"new-{i}"))
    clock.now += 1
    queue.add(run("its-pod-went-running"), lane=STATUS)
    queue.add(run("new-999"), lane=STATUS)  # admitted by the pass: its gates are due
    taken = drain(queue)
    assert taken[:2] == [run("its-pod-went-running"), run("new-999")]
    assert taken[-1] == run("resync")


def test_a_reconciles_own_status_write_is_the_version_it_saw_and_its_echo_queues_nothing() -> None:
    from tests.unit.controller import world
    from tests.unit.controller.fake_k8s import FakeK8s
    from torchyard.controller import admission, context, handlers

    class Versioned(FakeK8s):
        """Answers a status write with a new resourceVersion, as the apiserver does."""

        def apply_status(self, manifest: dict, **kw: object) -> dict:  # type: ignore[type-arg]
            stored = super().apply_status(manifest)
            stored["metadata"]["resourceVersion"] = "42"
            return stored

    body = world.run()
    body["metadata"]["resourceVersion"] = "7"
    fake = Versioned(body, world.env(), world.gpu_node("gpu-0"), world.gpu_node("gpu-1"))
    ctx = context.Context(k8s=fake)
    admission.prime(ctx)
    key = ("TrainingRun", world.NS, "r")
    outcome = workqueue.reconcile_key(key, ctx)
    assert fake.statuses, "the first reconcile writes a status"
    assert outcome.version == "42" and ctx.written[key] == "42"
    memo = {"ctx": ctx}
    assert handlers._own_write(memo, key, {"resourceVersion": "42"})  # our write, back
    assert not handlers._own_write(memo, key, {"resourceVersion": "43"})  # somebody else's
    # A reconcile that writes nothing keeps the version it read (the fake's stays "7").
    fake.statuses.clear()
    again = workqueue.reconcile_key(key, ctx)
    assert fake.statuses == [] and again.version == "7"


def test_a_worker_kept_for_the_status_lane_takes_only_status_keys() -> None:
    queue = WorkQueue(clock=Clock())
    for i in range(100):  # new runs: the other workers' work
        queue.add(run(f"new-{i}"))
    queue.add(run("resync"), lane=BACKGROUND)
    assert queue.take_nowait(STATUS) is None  # nothing for it: new runs are not its work
    queue.add(run("its-pod-went-running"), lane=STATUS)
    assert queue.take_nowait(STATUS) == run("its-pod-went-running")
    assert queue.take_nowait(STATUS) is None
    assert queue.take_nowait(EVENTS) == run("new-0")
    assert len(queue) == 100  # 99 new runs and the resync, for the other workers


def test_the_status_workers_write_a_status_while_every_other_worker_is_busy() -> None:
    """A status key is served at once though the 2 general workers are held by slow new
    runs: the status-only worker takes it."""

    async def main() -> list[workqueue.Key]:
        queue = WorkQueue()
        release = asyncio.Event()
        served: list[workqueue.Key] = []

        async def worker(last_lane: int) -> None:
            while True:
                key = await queue.take(last_lane)
                served.append(key)
                if key[2].startswith("new"):
                    await release.wait()  # a slow reconcile of a new run
                queue.done(key)

        tasks = [asyncio.create_task(worker(BACKGROUND)) for _ in range(2)]
        tasks.append(asyncio.create_task(worker(STATUS)))
        for i in range(10):
            queue.add(run(f"new-{i}"))
        await asyncio.sleep(0.01)
        queue.add(run("its-pod-went-running"), lane=STATUS)
        await asyncio.sleep(0.01)
        status_served = list(served)
        release.set()
        for task in tasks:
            task.cancel()
        return status_served

    served = asyncio.run(main())
    assert run("its-pod-went-running") in served
    assert sum(1 for k in served if k[2].startswith("new")) == 2  # the general workers' two


def test_a_pod_watch_event_queues_its_run_on_the_status_lane_but_not_an_echo() -> None:
    from tests.unit.controller.fake_k8s import FakeK8s
    from torchyard.controller import context, pod_watch

    async def main() -> tuple[list[workqueue.Key], bool]:
        ctx = context.Context(k8s=FakeK8s())
        queue = WorkQueue()
        wake = asyncio.Event()
        mine = {
            "metadata": {
                "name": "r-0",
                "namespace": "team-a",
                "resourceVersion": "5",
                "labels": {"torchyard.dev/run": "r"},
            }
        }
        ctx.cache.assume(mine)  # this operator wrote it: version 5
        pod_watch.deliver(ctx, queue, wake, [("MODIFIED", mine)])
        echoed = queue.take_nowait(STATUS)
        running = {**mine, "metadata": {**mine["metadata"], "resourceVersion": "6"}}
        pod_watch.deliver(ctx, queue, wake, [("MODIFIED", running)])
        return [k for k in (echoed, queue.take_nowait(STATUS)) if k is not None], wake.is_set()

    taken, woke = asyncio.run(main())
    assert taken == [run("r")]  # the echo queued nothing; the change queued its run
    assert woke  # and the admission pass was woken


def test_a_big_gangs_pod_events_queue_its_run_once_after_a_delay_that_grows_with_the_gang() -> None:
    from tests.unit.controller.fake_k8s import FakeK8s
    from torchyard.controller import context, pod_watch

    def pod(run_name: str, i: int, version: int) -> dict[str, Any]:
        meta = {"name": f"{run_name}-{i}", "namespace": "team-a"}
        labels = {"torchyard.dev/run": run_name}
        return {"metadata": {**meta, "resourceVersion": str(version), "labels": labels}}

    async def main() -> dict[str, list[list[workqueue.Key]]]:
        clock = Clock()
        ctx = context.Context(k8s=FakeK8s())
        queue = WorkQueue(clock=clock)
        wake = asyncio.Event()
        for name, size in (("small", 16), ("big", 256)):
            for i in range(size):
                ctx.cache.assume(pod(name, i, 1))
        taken: dict[str, list[list[workqueue.Key]]] = {}
        for name, size in (("small", 16), ("big", 256)):
            # every Pod of the gang scheduled, then Running, in events over 0.3 s
            rounds = []
            for step, version in enumerate((2, 3)):
                clock.now += 0.15 * step
                pod_watch.deliver(
                    ctx, queue, wake, [("MODIFIED", pod(name, i, version)) for i in range(size)]
                )
                rounds.append(drain(queue))
            clock.now += pod_watch.batch_delay(size)
            rounds.append(drain(queue))
            taken[name] = rounds
        return taken

    taken = asyncio.run(main())
    # a small gang's run is queued at once, each time
    assert taken["small"] == [[run("small")], [run("small")], []]
    # a big one's once for the burst, when its delay is over
    assert taken["big"] == [[], [], [run("big")]]
    assert pod_watch.batch_delay(16) == 0.0 and pod_watch.batch_delay(17) > 0
    assert pod_watch.batch_delay(256) == 0.512
    assert pod_watch.batch_delay(100_000) == pod_watch.BATCH_MAX_SECONDS


def test_caught_up_once_the_last_reconcile_saw_the_version_and_nothing_is_due() -> None:
    clock = Clock()
    queue = WorkQueue(clock=clock)
    key = run("quiet")
    assert not queue.caught_up(key, "7")  # never reconciled
    queue.add(key)
    assert not queue.caught_up(key, "7")  # ready
    taken = queue.take_nowait()
    assert taken == key
    workqueue.follow_up(queue, key, workqueue.Followup(version="7", requeue_after=30))
    queue.add(key)  # an event while it is reconciled: one more reconcile is due after
    assert not queue.caught_up(key, "7")  # being reconciled
    queue.done(key)
    assert not queue.caught_up(key, "7")  # ready again
    assert queue.take_nowait() == key
    workqueue.follow_up(queue, key, workqueue.Followup(version="8", requeue_after=30))
    queue.done(key)
    assert queue.caught_up(key, "8")  # a timer 30 s from now is not due
    assert not queue.caught_up(key, "7")  # an older version: not what it saw last
    clock.now += 31
    assert not queue.caught_up(key, "8")  # the timer came due
