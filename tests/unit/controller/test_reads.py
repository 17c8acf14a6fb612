"""Reads answered from what the watches delivered (operator/torchyard/controller/reads.py):
a held run or Environment is not fetched again, a run's Pods are not listed once the Pod
watch listed them, a newer copy is never replaced by an older event, and a delete shows
at once."""

from __future__ import annotations

from typing import Any

from tests.unit.controller import world
from tests.unit.controller.fake_k8s import FakeK8s
from torchyard import k8s
from torchyard.controller import reads


class Counting(FakeK8s):
    def __init__(self, *objects: dict[str, Any]) -> None:
        super().__init__(*objects)
        self.calls: list[str] = []

    def get(self, res: k8s.Resource, namespace: str | None, name: str) -> dict[str, Any]:
        self.calls.append(f"GET {res.plural}")
        return super().get(res, namespace, name)

    def apply_status(self, manifest: dict[str, Any], **kw: Any) -> dict[str, Any]:
        stored = super().apply_status(manifest)
        stored["metadata"]["resourceVersion"] = "6"  # a new version, as the apiserver's
        return stored

    def list_(self, res: k8s.Resource, namespace: str | None = None, **kw: Any) -> Any:
        self.calls.append(f"LIST {res.plural}")
        return super().list_(res, namespace, **kw)


def versioned(obj: dict[str, Any], version: int, **status: Any) -> dict[str, Any]:
    out = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(version)}}
    if status:
        out["status"] = status
    return out


def test_a_run_seen_on_the_watch_is_read_without_a_request_and_never_goes_back() -> None:
    body = world.run()
    inner = Counting(body)
    held = reads.WatchedReads(inner)
    held.seen(k8s.TRAININGRUNS, "ADDED", versioned(body, 5))
    got = held.get(k8s.TRAININGRUNS, world.NS, "r")
    assert got["metadata"]["resourceVersion"] == "5" and inner.calls == []
    got["spec"]["command"] = ["changed by the caller"]  # a copy: what is held stays
    assert held.get(k8s.TRAININGRUNS, world.NS, "r")["spec"]["command"] != got["spec"]["command"]
    held.seen(k8s.TRAININGRUNS, "MODIFIED", versioned(body, 9, phase="Queued"))
    held.seen(k8s.TRAININGRUNS, "MODIFIED", versioned(body, 7, phase="Pending"))  # late
    assert held.get(k8s.TRAININGRUNS, world.NS, "r")["status"]["phase"] == "Queued"
    held.seen(k8s.TRAININGRUNS, "DELETED", versioned(body, 10))
    held.get(k8s.TRAININGRUNS, world.NS, "r")  # not held any more: asked
    assert inner.calls == ["GET trainingruns"]


def test_a_status_write_is_held_as_the_apiserver_answered_it() -> None:
    body = world.run()
    inner = Counting(body)
    held = reads.WatchedReads(inner)
    held.seen(k8s.TRAININGRUNS, "ADDED", versioned(body, 5))
    held.apply_status(
        {
            "apiVersion": body["apiVersion"],
            "kind": "TrainingRun",
            "metadata": {"name": "r", "namespace": world.NS},
            "status": {"phase": "Queued"},
        }
    )
    assert held.get(k8s.TRAININGRUNS, world.NS, "r")["status"] == {"phase": "Queued"}
    assert inner.calls == []


def test_a_runs_pods_are_listed_from_the_pod_watch_once_it_listed_them() -> None:
    inner = Counting(world.run())
    held = reads.WatchedReads(inner)
    selector = "torchyard.dev/run=r"
    assert held.list_(k8s.PODS, world.NS, label_selector=selector) == []
    assert inner.calls == ["LIST pods"]  # the watch has not listed yet: asked
    held.pods_listed.set()
    pod0 = versioned(world.node_pod(0, phase="Running", node_name="gpu-0"), 3)
    other = versioned(world.node_pod(1), 4)
    other["metadata"]["labels"]["torchyard.dev/run"] = "s"
    held.pods_seen([("ADDED", pod0), ("ADDED", other)])
    listed = held.list_(k8s.PODS, world.NS, label_selector=selector)
    assert [p["metadata"]["name"] for p in listed] == ["r-0"]
    assert inner.calls == ["LIST pods"]  # answered from what the watch delivered
    # Any other selector still goes to the apiserver.
    held.list_(k8s.PODS, world.NS, label_selector=selector, field_selector="spec.nodeName=x")
    assert inner.calls == ["LIST pods", "LIST pods"]


def test_a_deleted_pod_shows_as_being_deleted_at_once_and_goes_with_its_event() -> None:
    pod0 = versioned(world.node_pod(0, phase="Running", node_name="gpu-0"), 3)
    inner = Counting(world.run(), pod0)
    held = reads.WatchedReads(inner)
    held.pods_listed.set()
    held.pods_seen([("ADDED", pod0)])
    held.delete(k8s.PODS, world.NS, "r-0", grace_period_seconds=5)
    [being] = held.list_(k8s.PODS, world.NS, label_selector="torchyard.dev/run=r")
    assert being["metadata"].get("deletionTimestamp")
    held.pods_seen([("DELETED", versioned(pod0, 6))])
    held.pods_seen([("MODIFIED", versioned(pod0, 5))])  # a late event: not back
    assert held.list_(k8s.PODS, world.NS, label_selector="torchyard.dev/run=r") == []
    # A new Pod of that name (a restart's) is newer: held again.
    held.pods_seen([("ADDED", versioned(pod0, 8))])
    assert len(held.list_(k8s.PODS, world.NS, label_selector="torchyard.dev/run=r")) == 1


def test_an_event_on_its_way_when_the_pod_was_deleted_keeps_it_marked_as_being_deleted() -> None:
    """Else the next reconcile would see it live and send its delete again."""
    pod0 = versioned(world.node_pod(0, phase="Running", node_name="gpu-0"), 3)
    pod0["metadata"]["uid"] = "uid-old"
    inner = Counting(world.run(), pod0)
    held = reads.WatchedReads(inner)
    held.pods_listed.set()
    held.pods_seen([("ADDED", pod0)])
    held.delete(k8s.PODS, world.NS, "r-0", grace_period_seconds=5)
    # written before the delete (a status change), delivered after it
    held.pods_seen([("MODIFIED", versioned(pod0, 4, phase="Failed"))])
    [being] = held.list_(k8s.PODS, world.NS, label_selector="torchyard.dev/run=r")
    assert being["metadata"].get("deletionTimestamp"), being
    assert being["status"]["phase"] == "Failed"  # the event's news is kept
    # the next attempt's Pod of that name is another Pod: not being deleted
    fresh = versioned(world.node_pod(0, phase="Pending"), 9)
    fresh["metadata"]["uid"] = "uid-new"
    held.pods_seen([("DELETED", versioned(pod0, 6)), ("ADDED", fresh)])
    [new] = held.list_(k8s.PODS, world.NS, label_selector="torchyard.dev/run=r")
    assert not new["metadata"].get("deletionTimestamp")
    # and a namesake seen before the old one's DELETED is not marked either
    held.delete(k8s.PODS, world.NS, "r-0", grace_period_seconds=5)
    other = versioned(world.node_pod(0, phase="Pending"), 12)
    other["metadata"]["uid"] = "uid-third"
    held.pods_seen([("ADDED", other)])
    [third] = held.list_(k8s.PODS, world.NS, label_selector="torchyard.dev/run=r")
    assert not third["metadata"].get("deletionTimestamp")


def test_the_old_pods_delete_event_leaves_its_namesake_the_operator_already_made() -> None:
    """A restarted gang's Pod, held from the operator's own write, is newer than the old
    Pod of its name whose DELETED event the watch delivers after it: it stays held (else
    the next reconcile finds it gone and restarts the gang again)."""
    old = versioned(world.node_pod(0, phase="Running", node_name="gpu-0"), 3)
    inner = Counting(world.run())
    held = reads.WatchedReads(inner)
    held.pods_listed.set()
    held.pods_seen([("ADDED", old)])
    fresh = versioned(world.node_pod(0, phase="Pending"), 9)
    fresh["metadata"]["uid"] = "uid-new"
    held.seen(k8s.PODS, None, fresh)  # as the operator's create answered it
    held.pods_seen([("DELETED", versioned(old, 6))])  # the old Pod's end, told late
    [kept] = held.list_(k8s.PODS, world.NS, label_selector="torchyard.dev/run=r")
    assert kept["metadata"]["uid"] == "uid-new"
    assert inner.calls == []  # answered from the held copy, not listed again


def trial_run(name: str, sweep: str, version: int, **status: Any) -> dict[str, Any]:
    body = versioned(world.run(), version, **status)
    labels = {"torchyard.dev/sweep": sweep, "torchyard.dev/trial": name.rsplit("-t", 1)[-1]}
    body["metadata"] = {**body["metadata"], "name": name, "labels": labels}
    return body


SWEEP_SELECTOR = "torchyard.dev/sweep=tune"


def listed_trials(held: reads.WatchedReads, selector: str = SWEEP_SELECTOR) -> list[str]:
    found = held.list_(k8s.TRAININGRUNS, world.NS, label_selector=selector)
    return [t["metadata"]["name"] for t in found]


def test_a_sweeps_trials_are_listed_from_the_held_runs_once_the_run_watch_listed_them() -> None:
    inner = Counting(trial_run("tune-t0", "tune", 2), trial_run("other-t0", "other", 3))
    held = reads.WatchedReads(inner)
    held.seen(k8s.TRAININGRUNS, None, trial_run("tune-t1", "tune", 4))
    # Kopf's watch has not listed every run yet: what is held may be a part, so asked
    assert listed_trials(held) == ["tune-t0"]
    assert inner.calls == ["LIST trainingruns"]
    for name, sweep, version in (("tune-t0", "tune", 2), ("other-t0", "other", 3)):
        held.seen(k8s.TRAININGRUNS, None, trial_run(name, sweep, version))
    held.runs_listed.set()
    assert listed_trials(held) == ["tune-t0", "tune-t1"]
    assert listed_trials(held, "torchyard.dev/sweep=other") == ["other-t0"]
    assert inner.calls == ["LIST trainingruns"]  # answered from the held runs
    # a newer copy is what is listed; a late older event does not bring the old one back
    held.seen(k8s.TRAININGRUNS, "MODIFIED", trial_run("tune-t1", "tune", 9, phase="Running"))
    held.seen(k8s.TRAININGRUNS, "MODIFIED", trial_run("tune-t1", "tune", 5, phase="Queued"))
    [_, t1] = held.list_(k8s.TRAININGRUNS, world.NS, label_selector=SWEEP_SELECTOR)
    assert t1["status"] == {"phase": "Running"}
    # a deleted trial goes; one relabelled leaves its old sweep's list
    held.seen(k8s.TRAININGRUNS, "DELETED", trial_run("tune-t0", "tune", 10))
    held.seen(k8s.TRAININGRUNS, "MODIFIED", trial_run("tune-t1", "other", 11))
    assert listed_trials(held) == []
    assert listed_trials(held, "torchyard.dev/sweep=other") == ["other-t0", "tune-t1"]
    assert inner.calls == ["LIST trainingruns"]


def test_a_trial_the_operator_made_is_listed_at_once_before_its_watch_event() -> None:
    inner = Counting()
    held = reads.WatchedReads(inner)
    held.runs_listed.set()
    made = trial_run("tune-t0", "tune", 1)
    made["metadata"].pop("resourceVersion")
    held.create(made)
    assert listed_trials(held) == ["tune-t0"] and inner.calls == []


def test_any_other_selector_or_namespace_of_trials_goes_to_the_apiserver() -> None:
    inner = Counting(trial_run("tune-t0", "tune", 2))
    held = reads.WatchedReads(inner, namespaces=(world.NS,))
    held.runs_listed.set()
    held.seen(k8s.TRAININGRUNS, None, trial_run("tune-t0", "tune", 2))
    asked = [
        {"label_selector": f"{SWEEP_SELECTOR},torchyard.dev/trial=0"},
        {"label_selector": "torchyard.dev/sweep==tune"},
        {"label_selector": "torchyard.dev/sweep!=tune"},
        {"label_selector": "torchyard.dev/sweep"},
        {"label_selector": SWEEP_SELECTOR, "field_selector": "metadata.name=tune-t0"},
        {"label_selector": "torchyard.dev/run=tune-t0"},
        {},
    ]
    for selectors in asked:
        held.list_(k8s.TRAININGRUNS, world.NS, **selectors)
    held.list_(k8s.TRAININGRUNS, "elsewhere", label_selector=SWEEP_SELECTOR)  # not watched
    held.list_(k8s.TRAININGRUNS, None, label_selector=SWEEP_SELECTOR)  # every namespace
    assert inner.calls == ["LIST trainingruns"] * (len(asked) + 2)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_trial_deleted_while_no_watch_saw_it_is_dropped_at_the_next_check() -> None:
    """A watch that re-lists after a gap never delivers the DELETED event of a trial
    deleted in the gap: once a minute the Sweep's list goes to the apiserver, which drops
    it; a trial made after that list was asked for is kept."""
    clock = Clock()
    inner = Counting(trial_run("tune-t0", "tune", 2))
    held = reads.WatchedReads(inner, clock=clock)
    held.runs_listed.set()
    for name, version in (("tune-t0", 2), ("tune-t1", 3)):  # t1: deleted, unseen
        held.seen(k8s.TRAININGRUNS, None, trial_run(name, "tune", version))
    assert listed_trials(held) == ["tune-t0", "tune-t1"] and inner.calls == []
    clock.now += reads.VERIFY_SECONDS - 1
    assert listed_trials(held) == ["tune-t0", "tune-t1"] and inner.calls == []
    clock.now += 1
    inner.put(trial_run("tune-t0", "tune", 5, phase="Running"))  # newer at the apiserver
    [t0] = held.list_(k8s.TRAININGRUNS, world.NS, label_selector=SWEEP_SELECTOR)
    assert inner.calls == ["LIST trainingruns"]
    assert (t0["metadata"]["name"], t0["status"]) == ("tune-t0", {"phase": "Running"})
    assert held.get_or_none(k8s.TRAININGRUNS, world.NS, "tune-t1") is None
    # a late event of the dropped trial does not bring it back; a new trial is held
    held.seen(k8s.TRAININGRUNS, "MODIFIED", trial_run("tune-t1", "tune", 3))
    made = trial_run("tune-t2", "tune", 4)
    held.seen(k8s.TRAININGRUNS, None, made)
    assert listed_trials(held) == ["tune-t0", "tune-t2"]
    assert inner.calls == ["LIST trainingruns"]  # the next check is a minute later


def test_a_trial_made_while_the_check_lists_is_kept() -> None:
    clock = Clock()

    class MadeDuringTheList(Counting):
        def list_(self, res: k8s.Resource, namespace: str | None = None, **kw: Any) -> Any:
            found = super().list_(res, namespace, **kw)  # asked for before the trial is made
            clock.now += 0.5
            held.create(trial_run("tune-t1", "tune", 7))
            return found

    inner = MadeDuringTheList(trial_run("tune-t0", "tune", 2))
    held = reads.WatchedReads(inner, clock=clock)
    held.runs_listed.set()
    held.seen(k8s.TRAININGRUNS, None, trial_run("tune-t0", "tune", 2))
    assert listed_trials(held) == ["tune-t0"]
    clock.now += reads.VERIFY_SECONDS
    assert listed_trials(held) == ["tune-t0", "tune-t1"]
    assert inner.calls == ["LIST trainingruns"]
