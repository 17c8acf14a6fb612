"""The operator's own Pod watch (``controller.pod_watch`` over ``k8s.WatchStream``)
against a real apiserver: a list then a watch from its version, a stream closed from
another thread, only the Pods admission or a run's status cares about handed on, and a
list again (after an expired watch) handing on exactly what changed meanwhile."""

from __future__ import annotations

import threading
import time
from typing import Any

from tests.integration.helpers import wait_for
from torchyard import k8s
from torchyard.controller import pod_watch
from torchyard.planning import names


def pod(namespace: str, name: str, labels: dict[str, str], gpus: int = 0) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "schedulingGates": [{"name": "test.torchyard.dev/hold"}],  # stays Pending
            "containers": [{"name": "c", "image": "pause", "resources": resources}],
        },
    }


class Collected:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, str]] = []

    def __call__(self, events: list[pod_watch.Event]) -> None:
        with self.lock:
            self.events += [(t, p["metadata"]["name"]) for t, p in events]

    def has(self, type_: str, name: str) -> bool:
        with self.lock:
            return (type_, name) in self.events

    def names(self) -> set[str]:
        with self.lock:
            return {n for _, n in self.events}


def test_a_watch_from_the_lists_version_sees_a_change_and_ends_when_closed(
    namespace: str,
) -> None:
    k8s.create(pod(namespace, "a", {"x": "1"}))
    items, version = k8s.list_versioned(k8s.PODS, namespace)
    assert [p["metadata"]["name"] for p in items] == ["a"] and version
    stream = k8s.WatchStream(k8s.PODS, namespace, version, timeout_seconds=120)
    seen: list[tuple[str, str, str]] = []
    done = threading.Event()

    def read() -> None:
        for batch in stream:
            seen.extend((t, p["metadata"]["name"], p["metadata"]["labels"]["x"]) for t, p in batch)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    k8s.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "a", "namespace": namespace, "labels": {"x": "2"}},
        },
        field_manager="test",
    )
    wait_for("the change", lambda: ("MODIFIED", "a", "2") in seen)
    assert ("ADDED", "a", "1") not in seen  # from the list's version: only what came after
    closed = time.monotonic()
    stream.close()
    assert done.wait(10), "the stream did not end when closed"
    assert time.monotonic() - closed < 10


def test_the_pod_watch_hands_on_torchyards_pods_and_gpu_pods_only(
    namespace: str, operator_client: k8s.Client
) -> None:
    got = Collected()
    watch = pod_watch.PodWatch(operator_client, [namespace], got)
    k8s.create(pod(namespace, "before", {names.LABEL_RUN: "r1"}))
    watch.start()
    try:
        assert watch.listed.wait(30)
        k8s.create(pod(namespace, "node-0", {names.LABEL_RUN: "r2"}))
        k8s.create(pod(namespace, "gpu-user", {"app": "x"}, gpus=1))
        k8s.create(pod(namespace, "cpu-user", {"app": "y"}))
        wait_for("the GPU Pod", lambda: got.has("ADDED", "gpu-user"))
        wait_for("the run's Pod", lambda: got.has("ADDED", "node-0"))
        assert got.has("ADDED", "before")  # from the first list
        k8s.delete(k8s.PODS, namespace, "node-0", grace_period_seconds=0)
        wait_for("its deletion", lambda: got.has("DELETED", "node-0"))
        assert "cpu-user" not in got.names()
    finally:
        watch.stop()
    assert all(not t.is_alive() for t in watch._threads)


def test_a_list_again_hands_on_what_changed_and_what_went_meanwhile(
    namespace: str, operator_client: k8s.Client
) -> None:
    got = Collected()
    watch = pod_watch.PodWatch(operator_client, [namespace], got)
    k8s.create(pod(namespace, "kept", {names.LABEL_RUN: "r1"}))
    items, _ = k8s.list_versioned(k8s.PODS, namespace)
    kept = items[0]["metadata"]["resourceVersion"]
    # What the watch had seen before it expired: "kept" as it is, and "gone" (deleted since).
    seen = {(namespace, "kept"): kept, (namespace, "gone"): "1"}
    version = watch._relist(namespace, seen)
    assert version
    assert got.events == [("DELETED", "gone")]  # "kept" did not change: not handed on
    assert seen == {(namespace, "kept"): kept}
