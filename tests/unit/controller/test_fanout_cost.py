"""The create path's cost per Pod: what a reconcile of a gang leaves out once its Pods are
all there (``admission.of_whole_gang``), and what it still does while they are not."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.controller import world as w
from torchyard.planning import pods


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The node counts of every ``pods.pods`` call (the wanted manifests built)."""
    calls: list[int] = []
    real = pods.pods

    def counting(run: Any, **kw: Any) -> list[dict[str, Any]]:
        calls.append(run.spec.distribution.node_count)
        return real(run, **kw)

    monkeypatch.setattr(pods, "pods", counting)
    return calls


def test_a_whole_ungated_gang_builds_no_manifests_and_writes_no_pod(builds: list[int]) -> None:
    fake = w.world(w.run(), w.env(), w.gpu_node("gpu-0"), w.gpu_node("gpu-1"), *w.running())
    w.reconcile(fake)
    assert builds == []
    assert not [m for m in fake.applied if m["kind"] == "Pod"]
    assert w.status(fake)["phase"] == "Running"


def test_a_gang_missing_a_pod_still_builds_and_creates_it(builds: list[int]) -> None:
    fake = w.world(w.run(), w.env(), w.gpu_node("gpu-0"), w.gpu_node("gpu-1"), *w.running(1))
    w.reconcile(fake)
    assert builds == [2]
    assert [m["metadata"]["name"] for m in fake.applied if m["kind"] == "Pod"] == ["r-1"]


def test_a_gated_gang_is_still_decided(builds: list[int]) -> None:
    gated = [w.node_pod(i, gated=True) for i in range(2)]
    fake = w.world(w.run(), w.env(), w.gpu_node("gpu-0"), w.gpu_node("gpu-1"), *gated)
    w.reconcile(fake)
    assert builds == [2]
    applied = [m for m in fake.applied if m["kind"] == "Pod"]
    assert sorted(m["metadata"]["name"] for m in applied) == ["r-0", "r-1"]
    assert all("schedulingGates" not in m["spec"] for m in applied)


def test_an_admission_pass_parses_each_quantity_text_once() -> None:
    from torchyard.api import quantities
    from torchyard.planning import admission as gangs

    nodes = [w.gpu_node(f"gpu-{i}") for i in range(64)]
    gangs.free_nodes(nodes, [])  # the texts of this shape, parsed (or remembered) once
    before = quantities._parse.cache_info().misses
    free = gangs.free_nodes(nodes, [])
    assert quantities._parse.cache_info().misses == before  # 64 nodes, nothing parsed again
    assert all(str(n.free["nvidia.com/gpu"]) == "8" for n in free)
    with pytest.raises(ValueError, match="not a quantity"):
        quantities.quantity("8x")
    with pytest.raises(ValueError, match="not a quantity"):
        quantities.quantity("8x")  # an error is never remembered as a value


def test_a_pass_with_no_gang_waiting_works_out_no_free_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torchyard.controller import admission, context
    from torchyard.planning import admission as gangs

    fake = w.world(w.run(), w.env(), w.gpu_node("gpu-0"), w.gpu_node("gpu-1"), *w.running())
    ctx = context.Context(k8s=fake)
    admission.prime(ctx)

    def no_room(*_: Any) -> list[gangs.Node]:
        raise AssertionError("free room worked out with nobody waiting")

    monkeypatch.setattr(gangs, "free_nodes", no_room)
    assert admission.run_pass(ctx, force=True) == admission.Passed()
    assert gangs.decide([], [w.gpu_node("gpu-0")], w.running()) == {}


def test_pods_that_just_started_are_not_read_for_progress_until_they_ran_a_while() -> None:
    from datetime import timedelta

    from torchyard.controller import context, progress

    fake = w.world(w.run())
    fake.logs = {"r-0": ['[torchyard] progress {"step": 3, "minStep": 3, "total": 9}']}
    ctx = context.Context(k8s=fake)
    started = w.T0.strftime("%Y-%m-%dT%H:%M:%SZ")
    pods_ = w.running(2)
    for p in pods_:
        p["status"]["containerStatuses"][0]["state"] = {"running": {"startedAt": started}}
    soon = progress.poll(ctx, w.NS, w.UID, pods_, w.T0 + timedelta(seconds=1))
    assert soon == progress.Polled(None, progress.YOUNG_SECONDS - 1)
    assert fake.log_reads == []  # the fan-out reads no log
    later = progress.poll(ctx, w.NS, w.UID, pods_, w.T0 + timedelta(seconds=progress.YOUNG_SECONDS))
    assert later is not None and later.progress is not None and later.progress["step"] == 3
    assert sorted(fake.log_reads) == ["r-0", "r-1"]


# -- how each Pod is written --------------------------------------------------------------


def test_an_admitted_gangs_new_pods_are_created_by_post_not_applied() -> None:
    fake = w.world(w.run(), w.env(), w.gpu_node("gpu-0"), w.gpu_node("gpu-1"))
    w.reconcile(fake)
    assert sorted(fake.posted) == ["r-0", "r-1"]
    made = [m for m in fake.applied if m["kind"] == "Pod"]
    assert all("schedulingGates" not in m["spec"] for m in made)


def test_a_gated_pod_is_applied_so_that_a_later_apply_lifts_its_gate() -> None:
    # a node of 4 GPUs for a gang of 2 x 8: created gated, queued
    fake = w.world(w.run(), w.env(), w.gpu_node("gpu-0", gpus=4))
    w.reconcile(fake)
    assert fake.posted == []
    gated = [m for m in fake.applied if m["kind"] == "Pod"]
    assert sorted(m["metadata"]["name"] for m in gated) == ["r-0", "r-1"]
    assert all(m["spec"]["schedulingGates"] for m in gated)


def test_a_new_pod_that_exists_after_all_is_applied_not_refused() -> None:
    """An earlier write the reconcile did not see: POST says 409, the apply converges."""
    fake = w.world(w.run(), w.env(), w.gpu_node("gpu-0"), w.gpu_node("gpu-1"))
    real_create = fake.create

    def raced(manifest: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if manifest["metadata"]["name"] == "r-1":
            fake.apply(manifest)  # made by the earlier write, a moment ago
        return real_create(manifest, **kw)

    fake.create = raced  # type: ignore[method-assign]
    w.reconcile(fake)
    assert fake.posted == ["r-0"]
    names = [m["metadata"]["name"] for m in fake.applied if m["kind"] == "Pod"]
    assert sorted(names) == ["r-0", "r-1", "r-1"]  # r-0 by POST; r-1 twice, then applied
    assert w.status(fake)["phase"] in ("Queued", "Running", "Pending")


@pytest.mark.parametrize("nodes", [64, 1024])
def test_a_gangs_manifests_name_each_node_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch, nodes: int
) -> None:
    """Every node Pod's manifest carries where the others are (``pods.place``): worked out
    once per run, so building N manifests costs N, not N squared (1024 nodes: 2 million
    names and 0.8 s before)."""
    from tests.builders import TrainingRunBuilder
    from torchyard import api
    from torchyard.planning import names

    named: list[int] = []
    real = names.pod

    def counting(run: str, node: int) -> str:
        named.append(node)
        return real(run, node)

    monkeypatch.setattr(names, "pod", counting)
    pods._place.cache_clear()
    body = TrainingRunBuilder(f"wide-{nodes}", "ns").nodes(nodes).gpus(8).obj()
    built = pods.pods(api.parse_trainingrun(body), image="img")
    assert len(built) == nodes
    assert len(named) <= 8 * nodes  # a few per Pod (its own name, its hostname, ...)
