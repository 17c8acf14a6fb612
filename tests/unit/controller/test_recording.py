"""A finished TrainingRun's record, written by the reconcile after its terminal status:
against the in-memory fake of ``torchyard.k8s`` and the real registry service on loopback
(the stand-in Authorizer of tests/unit/registry/test_service.py). Written once, kept
before the TTL deletes the Pods, retried while the registry is away, said when it refuses;
a run deleted before it ended is recorded as it was."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.controller.world import NS, T0, node_pod, reconcile, run, status, world
from tests.unit.registry.test_service import OPERATOR, USER, A, Served, StandIn
from torchyard import k8s
from torchyard.controller import context, recording
from torchyard.planning import pods
from torchyard.records import FolderRecords, build
from torchyard.registry.service import Limits
from torchyard.registry.store import Store

RUN_UID = "0d000000-0000-4000-8000-000000000001"
FAILED = {
    "phase": "Failed",
    "startTime": "2026-01-01T11:00:00Z",
    "completionTime": "2026-01-01T11:30:00Z",
    "restarts": 1,
    "failure": {"rank": 2, "node": 1, "class": "CudaOOM", "retryable": False, "advice": "less"},
    "progress": {"step": 40, "metrics": {"loss": 0.5}},
    "excludedNodes": [{"node": "gpu-9", "reason": "GpuXid"}],
}


class InRunsNamespace(StandIn):
    """The stand-in's rights of namespace a, in the namespace of the fixtures' run."""

    def allowed(
        self, user: dict[str, Any], verb: str, namespace: str, resource: str = "modelversions"
    ) -> bool:
        return super().allowed(user, verb, A if namespace == NS else namespace, resource)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    svc = Served(tmp_path / "registry", InRunsNamespace(), Limits())
    yield svc
    svc.stop()


def settings(tmp_path: Path, served: Served | str, token: str = OPERATOR) -> pods.Settings:
    """The operator's settings with a registry (``served``, or a URL) and ``token``."""
    url = served if isinstance(served, str) else f"http://127.0.0.1:{served.port}"
    (tmp_path / "token").write_text(token)
    return pods.Settings(registry_url=url, registry_token_file=str(tmp_path / "token"))


def finished_world(phase_status: dict[str, Any], ttl: int | None = 0) -> Any:
    spec = {"policy.ttlSecondsAfterFinished": ttl} if ttl is not None else {}
    body = run(status=phase_status, spec=spec)
    body["metadata"]["uid"] = RUN_UID
    nodes = [
        node_pod(0, attempt=1, phase="Succeeded", node_name="gpu-0", exit_code=0),
        node_pod(1, attempt=1, phase="Failed", node_name="gpu-1", exit_code=1, message="Trace"),
    ]
    for p in nodes:
        p["metadata"]["ownerReferences"] = [{"uid": RUN_UID, "controller": True}]
    fake = world(body, *nodes)
    fake.logs = {"r-0": ["step 40"], "r-1": ["Traceback", "torch.OutOfMemoryError: CUDA"]}
    fake.put(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "r.1", "namespace": NS},
            "involvedObject": {"name": "r", "uid": RUN_UID},
            "type": "Warning",
            "reason": "Restarting",
            "message": "node 1 failed: restarting the gang",
            "lastTimestamp": "2026-01-01T11:10:00Z",
        }
    )
    return fake


def test_a_finished_run_is_recorded_once_before_its_ttl_deletes_its_pods(
    tmp_path: Path, served: Served
) -> None:
    fake = finished_world(FAILED)
    result = reconcile(fake, at=3600, settings=settings(tmp_path, served))
    record = FolderRecords(served.root).get_record(NS, "r")
    assert record is not None and record["uid"] == RUN_UID and record["phase"] == "Failed"
    assert record["failure"] == FAILED["failure"] and record["failureClass"] == "CudaOOM"
    assert record["logTails"]["1"] == ["Traceback", "torch.OutOfMemoryError: CUDA"]
    assert [(n["node"], n["nodeName"], n["exitCode"]) for n in record["nodes"]] == [
        (0, "gpu-0", 0),
        (1, "gpu-1", 1),
    ]
    assert [(a["attempt"], a["outcome"], a["ended"]) for a in record["attempts"]] == [
        (0, "Restarted", "2026-01-01T11:10:00Z"),
        (1, "Failed", "2026-01-01T11:30:00Z"),
    ]
    assert record["excludedNodes"] == FAILED["excludedNodes"]
    assert record["metrics"] == {"loss": 0.5}
    assert record["spec"]["distribution"]["nodeCount"] == 2
    recorded = {c["type"]: c for c in status(fake)["conditions"]}["Recorded"]
    assert (recorded["status"], recorded["reason"]) == ("True", "Written")
    assert {name for _, name in fake.deleted} >= {"r-0", "r-1"}  # then the TTL
    assert result.requeue_after is None

    # Another reconcile (or a restarted operator) does not write it again.
    fake.reset_writes()
    (served.root / NS / "records").rename(tmp_path / "moved")
    reconcile(fake, at=3700, settings=settings(tmp_path, served))
    assert not (served.root / NS / "records").exists() and fake.statuses == []


def test_the_ttl_waits_while_the_registry_cannot_be_reached(tmp_path: Path) -> None:
    fake = finished_world(FAILED)
    gone = settings(tmp_path, "http://127.0.0.1:9")  # nothing listens there
    result = reconcile(fake, at=3600, settings=gone)
    assert result.requeue_after == recording.RETRY_SECONDS
    assert fake.deleted == [] and fake.statuses == []  # the Pods keep their logs


def test_a_refusal_is_said_once_and_the_ttl_goes_on(tmp_path: Path, served: Served) -> None:
    fake = finished_world(FAILED)
    result = reconcile(fake, at=3600, settings=settings(tmp_path, served, token=USER))
    recorded = {c["type"]: c for c in status(fake)["conditions"]}["Recorded"]
    assert (recorded["status"], recorded["reason"]) == ("False", "RegistryRefused")
    assert "may not create runrecords" in recorded["message"]
    assert [e[1] for e in fake.events] == ["RecordRefused"]
    assert {name for _, name in fake.deleted} >= {"r-0", "r-1"}
    assert result.requeue_after == recording.REFUSED_RETRY_SECONDS
    fake.reset_writes()
    reconcile(fake, at=3700, settings=settings(tmp_path, served, token=USER))
    assert fake.statuses == [] and fake.events == []  # said once


def test_without_a_registry_nothing_is_recorded(tmp_path: Path) -> None:
    fake = finished_world(FAILED, ttl=None)
    reconcile(fake, at=3600)
    assert fake.statuses == []


def test_a_run_deleted_before_it_ended_is_recorded_as_it_was(
    tmp_path: Path, served: Served
) -> None:
    running = {"phase": "Running", "startTime": "2026-01-01T11:00:00Z", "progress": {"step": 7}}
    fake = finished_world(running)
    body = fake.get(k8s.TRAININGRUNS, NS, "r")
    ctx = context.Context(settings=settings(tmp_path, served), clock=lambda: T0, k8s=fake)
    recording.deleted(ctx, body)
    record = FolderRecords(served.root).get_record(NS, "r", RUN_UID)
    assert record is not None and record["deleted"] is True and record["phase"] == "Running"
    assert record["finished"] == "2026-01-01T12:00:00Z"
    assert record["attempts"][-1]["outcome"] == "Deleted"
    assert record["logTails"]["0"] == ["step 40"]
    # One that was recorded when it ended is not written again.
    ctx2 = context.Context(settings=ctx.settings, clock=lambda: T0, k8s=fake)
    done = {**body, "status": {**running, "conditions": [{"type": "Recorded", "status": "True"}]}}
    (served.root / NS / "records").rename(tmp_path / "moved")
    recording.deleted(ctx2, done)
    assert not (served.root / NS / "records").exists()


def test_a_store_restart_keeps_records(tmp_path: Path, served: Served) -> None:
    """The service's start-up sweep of temporaries leaves records alone."""
    fake = finished_world(FAILED)
    reconcile(fake, at=3600, settings=settings(tmp_path, served))
    Store(served.root).remove_all_temporaries()
    assert FolderRecords(served.root).get_record(NS, "r") is not None


def test_of_a_large_gang_the_failing_nodes_log_is_read_first_and_few_are_read(
    tmp_path: Path,
) -> None:
    gang = [node_pod(i, phase="Failed", exit_code=1) for i in range(64)]
    fake = world(run(), *gang)
    fake.logs = {f"r-{i}": [f"node {i}"] for i in range(64)}
    ctx = context.Context(k8s=fake)
    read = recording.tails(ctx, NS, gang, failing=50)
    assert len(fake.log_reads) == build.MAX_TAIL_NODES
    assert fake.log_reads[0] == "r-50" and read[50] == ["node 50"]
    assert sorted(read) == [*range(build.MAX_TAIL_NODES - 1), 50]


def sweep_body(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "Sweep",
        "metadata": {"name": "tune", "namespace": NS, "uid": RUN_UID, "generation": 1},
        "spec": {"maxTotalTrials": 4},
        "status": status,
    }


def test_an_ended_sweep_is_recorded_once(tmp_path: Path, served: Served) -> None:
    body = sweep_body(phase="Succeeded", completionTime="2026-01-01T11:00:00Z")
    fake = world(body)
    ctx = context.Context(settings=settings(tmp_path, served), clock=lambda: T0, k8s=fake)
    done = recording.finished_sweep(ctx, body, logging.getLogger("test"))
    assert done.status is not None and not done.hold
    record = FolderRecords(served.root).get_record(NS, "tune", kind="Sweep")
    assert record is not None and record["status"]["phase"] == "Succeeded"
    again = recording.finished_sweep(ctx, {**body, "status": done.status}, logging.getLogger("t"))
    assert again == recording.Recorded()


def test_an_environment_build_is_recorded_once_per_generation(
    tmp_path: Path, served: Served
) -> None:
    env = {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "Environment",
        "metadata": {"name": "pytorch", "namespace": NS, "uid": RUN_UID, "generation": 1},
        "spec": {"python": "3.11"},
        "status": {"phase": "Failed", "message": "pip install failed"},
    }
    build_pod = {"metadata": {"name": "build-1", "namespace": NS}, "status": {}}
    fake = world(env)
    fake.logs = {"build-1": ["Collecting torch", "ERROR: no matching distribution"]}
    ctx = context.Context(settings=settings(tmp_path, served), clock=lambda: T0, k8s=fake)
    assert recording.built_environment(ctx, env, [build_pod])
    record = FolderRecords(served.root).get_record(NS, "pytorch", kind="Environment")
    assert record is not None and record["logTails"]["0"][-1].startswith("ERROR")
    assert recording.built_environment(ctx, env, [build_pod])
    assert fake.log_reads == ["build-1"]  # not again for the same generation
    gone = context.Context(settings=settings(tmp_path, "http://127.0.0.1:9"), k8s=fake)
    assert not recording.built_environment(gone, env, [])  # the registry away: try again
