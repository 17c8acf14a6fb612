"""The watch-fed cache: what it keeps of Nodes and Pods, and which events change it."""

from __future__ import annotations

from typing import Any

from tests.unit.controller.test_admission_pass import gang_pod
from tests.unit.controller.world import gpu_node
from torchyard.controller.cache import Cache


def other_pod(
    name: str, gpus: int | None, *, node: str = "gpu-0", version: int = 1
) -> dict[str, Any]:
    """Somebody else's Pod bound to ``node``, asking for ``gpus`` (None: none)."""
    limits = {"cpu": "1"} if gpus is None else {"nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "resourceVersion": str(version),
            "labels": {"app": "x"},
            "annotations": {"big": "x" * 1000},
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "i", "env": [], "resources": {"limits": limits}}],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.1"},
    }


def test_the_cache_is_not_ready_until_primed() -> None:
    cache = Cache()
    cache.node_event("ADDED", gpu_node("gpu-0"))
    assert not cache.ready
    cache.prime([], [])
    assert cache.ready and [n["metadata"]["name"] for n in cache.nodes()] == ["gpu-0"]


def test_it_keeps_torchyards_pods_and_others_that_hold_gpus_trimmed() -> None:
    cache = Cache()
    cache.prime(
        [gpu_node("gpu-0")], [other_pod("gpu-job", 2), other_pod("web", None), gang_pod("r", 0)]
    )
    held = {p["metadata"]["name"]: p for p in cache.pods()}
    assert sorted(held) == ["gpu-job", "r-0"]
    assert held["gpu-job"]["metadata"]["annotations"] == {}  # only what admission reads
    assert held["gpu-job"]["spec"]["containers"] == [
        {"resources": {"limits": {"nvidia.com/gpu": "2"}}}
    ]
    assert "podIP" not in held["gpu-job"]["status"]


def test_a_finished_or_deleted_pod_leaves_and_a_late_older_event_does_not_bring_it_back() -> None:
    cache = Cache()
    cache.prime([], [other_pod("gpu-job", 2, version=5)])
    assert not cache.pod_event("MODIFIED", other_pod("gpu-job", 2, version=4))  # older
    done = other_pod("gpu-job", 2, version=6)
    done["status"]["phase"] = "Succeeded"
    assert cache.pod_event("MODIFIED", done)
    assert cache.pods() == []
    assert not cache.pod_event("MODIFIED", other_pod("gpu-job", 2, version=5))
    assert cache.pods() == []
    assert cache.pod_event("ADDED", other_pod("gpu-job", 2, version=9))  # a new namesake
    assert not cache.pod_event("DELETED", other_pod("x", 2))  # never held


def test_only_what_admission_reads_marks_it_dirty() -> None:
    cache = Cache()
    cache.prime([gpu_node("gpu-0")], [gang_pod("r", 0)])
    cache.dirty = False
    heartbeat = gpu_node("gpu-0")
    heartbeat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T12:00:10Z"
    heartbeat["metadata"]["resourceVersion"] = "7"
    assert not cache.node_event("MODIFIED", heartbeat)
    assert not cache.dirty
    bound = gang_pod("r", 0, gated=False, node_name="gpu-0", version=2)
    assert cache.pod_event("MODIFIED", bound)
    assert cache.dirty
    cordoned = gpu_node("gpu-0")
    cordoned["spec"]["unschedulable"] = True
    assert cache.node_event("MODIFIED", cordoned)
    assert cache.node_event("DELETED", cordoned) and cache.nodes() == []


def test_a_namespaced_operators_list_of_other_namespaces_replaces_what_it_held() -> None:
    cache = Cache()
    mine = gang_pod("r", 0)  # namespace "ns", watched
    cache.prime([], [mine, other_pod("gone", 2), other_pod("stays", 2)])
    cache.dirty = False
    assert not cache.replace_outside(["ns"], [other_pod("gone", 2), other_pod("stays", 2)])
    assert not cache.dirty
    # "gone" finished unseen (no watch there): the next list drops it, "new" comes in.
    assert cache.replace_outside(["ns"], [other_pod("stays", 2), other_pod("new", 1)])
    assert cache.dirty
    assert sorted(p["metadata"]["name"] for p in cache.pods()) == ["new", "r-0", "stays"]


def test_fed_events_wait_for_the_next_reader() -> None:
    cache = Cache()
    cache.prime([gpu_node("gpu-0")], [])
    cache.dirty = False
    cache.feed("Pod", "ADDED", gang_pod("r", 0))
    cache.feed("Node", "DELETED", gpu_node("gpu-0"))
    assert [p["metadata"]["name"] for p in cache._pods.values()] == []  # not yet taken in
    assert cache.drain() and cache.dirty
    assert [p["metadata"]["name"] for p in cache.pods()] == ["r-0"] and cache.nodes() == []
    assert not cache.drain()


def test_a_pod_event_that_brings_back_our_own_write_is_an_echo_once() -> None:
    cache = Cache()
    cache.prime([gpu_node("gpu-0")], [])
    cache.assume(gang_pod("a", 0, version=5))
    assert not cache.echo(gang_pod("a", 0, version=6))  # a newer change: not ours
    assert cache.echo(gang_pod("a", 0, version=5))
    assert not cache.echo(gang_pod("a", 0, version=5))  # told once


def test_a_quiet_assume_asks_for_no_pass_but_the_pod_is_held() -> None:
    cache = Cache()
    cache.prime([gpu_node("gpu-0")], [])
    cache.dirty = False
    cache.assume(gang_pod("a", 0), quiet=True)
    assert not cache.dirty and [g.key for g in cache.waiting()] == [("ns", "a")]
    cache.assume(gang_pod("b", 0))
    assert cache.dirty


def test_a_runs_waiting_gang_follows_its_pods() -> None:
    cache = Cache()
    cache.prime([gpu_node("gpu-0")], [gang_pod("a", 0), gang_pod("a", 1)])
    assert [(g.key, g.size) for g in cache.waiting()] == [(("ns", "a"), 2)]
    cache.pod_event("MODIFIED", gang_pod("a", 0, gated=False, version=2))
    cache.pod_event("MODIFIED", gang_pod("a", 1, gated=False, version=2))
    assert cache.waiting() == []  # its gates lifted: not waiting
    cache.pod_event("DELETED", gang_pod("a", 0, version=3))
    cache.pod_event("DELETED", gang_pod("a", 1, version=3))
    assert cache.waiting() == [] and cache.run_pods(("ns", "a")) == []


def test_get_runs_shows_a_run_further_back_than_the_exact_positions_as_more_than_50() -> None:
    from torchyard.cli import inspect

    assert inspect._queue({"pool": "a100", "position": 3}) == "3 (a100)"
    assert inspect._queue({"pool": "a100"}) == ">50 (a100)"
    assert inspect._queue(None) == "-"


def test_the_apiservers_copy_of_a_pod_assumed_before_its_write_is_no_change() -> None:
    cache = Cache()
    cache.prime([gpu_node("gpu-0")], [])
    manifest = gang_pod("a", 0)
    del manifest["metadata"]["resourceVersion"]  # as planned, before the apiserver has it
    cache.assume(manifest)
    cache.dirty = False
    stored = gang_pod("a", 0, version=9)  # with the apiserver's defaults
    stored["spec"]["tolerations"] = [
        *stored["spec"]["tolerations"],
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    ]
    assert not cache.pod_event("ADDED", stored) and not cache.dirty
    moved = gang_pod("a", 0, version=10, node_name="gpu-0")  # then bound: a change
    assert cache.pod_event("MODIFIED", moved) and cache.dirty
