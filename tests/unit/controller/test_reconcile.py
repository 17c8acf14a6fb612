"""``trainingruns.reconcile`` as a table: observed state -> status, Events and children.

Each row stores a run (with the status it had), its Environment, the nodes of its pool
and its node Pods in an in-memory fake of ``torchyard.k8s``, reconciles once, and says
what the run's status, its Events and its children are afterwards. Together the rows
take every phase transition of ``status.trainingruns`` (and restarts, lost Pods,
deadlines, TTL and stale attempts). Every reconcile writes the status at most once.
The real-control-plane version is tests/integration/test_trainingruns.py.
"""

from __future__ import annotations

import http.server
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.unit.controller.fake_k8s import FakeK8s
from tests.unit.controller.world import (
    env,
    gpu_node,
    kueue,
    named,
    node_pod,
    priority_class,
    reconcile,
    run,
    running,
    status,
    succeeded,
    world,
)
from torchyard import k8s
from torchyard.controller import progress
from torchyard.planning import pods
from torchyard.status.failures import FAILURE_SETTLE_SECONDS

RUNNING = {"phase": "Running", "startTime": "2026-01-01T11:59:00Z", "restarts": 0}
QUEUED = {"phase": "Queued", "restarts": 0}
NODES = [gpu_node("gpu-0"), gpu_node("gpu-1")]
POLL = progress.POLL_SECONDS
ARCHIVE_FAILED = '{"reason": "ArchiveFailed", "message": "HTTP 507 disk full"}'


def failed_pod(node: int, exit_code: int = 1, **state: Any) -> dict[str, Any]:
    return node_pod(node, phase="Failed", node_name=f"gpu-{node}", exit_code=exit_code, **state)


@dataclass
class Case:
    name: str
    body: dict[str, Any]
    objects: list[dict[str, Any]]
    phase: str | None  # the run's phase afterwards (None: no status was ever written)
    events: list[str] = field(default_factory=list)  # reasons of the Events recorded
    conditions: dict[str, tuple[str, str]] = field(default_factory=dict)  # type: (status, reason)
    created: list[str] = field(default_factory=list)  # node Pods applied
    gated: bool | None = None  # whether the applied node Pods carry the gang gate
    deleted: list[str] = field(default_factory=list)  # objects deleted (Pods and Service)
    requeue: float | None = None  # Result.requeue_after
    at: float = 0.0  # seconds after T0
    settings: pods.Settings = field(default_factory=pods.Settings)
    failure: dict[str, Any] = field(default_factory=dict)  # fields of status.failure
    restarts: tuple[int, int] | None = None  # (restarts, failedAttempts) afterwards
    writes: int = 1  # status writes of the run
    refusal: tuple[str, int, str] | None = None  # (kind, HTTP status, message) of its applies


CASES = [
    # -- Preparing: the Environment --------------------------------------------------
    Case(
        "new run, Environment missing -> Preparing",
        run(),
        [*NODES],
        "Preparing",
        events=["Preparing"],
        conditions={"EnvironmentReady": ("False", "EnvironmentNotFound")},
    ),
    Case(
        "new run, Environment building -> Preparing",
        run(),
        [env("Building"), *NODES],
        "Preparing",
        events=["Preparing"],
        conditions={"EnvironmentReady": ("False", "EnvironmentNotReady")},
    ),
    Case(
        "Preparing, Environment failed -> Failed",
        run(status={"phase": "Preparing", "restarts": 0}),
        [env("Failed", "pip: no torch==9"), *NODES],
        "Failed",
        events=["EnvironmentFailed"],
        failure={"reason": "EnvironmentFailed"},
    ),
    Case(
        "invalid spec -> Failed once",
        run(spec={"distribution.nodeCount": 0}),
        [env(), *NODES],
        "Failed",
        events=["InvalidSpec"],
        conditions={"Accepted": ("False", "InvalidSpec")},
    ),
    # -- admission --------------------------------------------------------------------
    Case(
        "Preparing, Environment Ready, the gang fits -> created ungated, Queued (admitted)",
        run(status={"phase": "Preparing", "restarts": 0}),
        [env(), *NODES],
        "Queued",
        events=["Queued"],
        conditions={"Admitted": ("True", "GangAdmitted"), "Running": ("False", "Starting")},
        created=["r-0", "r-1"],
        gated=False,
    ),
    Case(
        "the gang does not fit -> created gated, Queued (not admitted)",
        run(),
        [env(), gpu_node("gpu-0", gpus=4)],
        "Queued",
        events=["Queued"],
        conditions={"Admitted": ("False", "Queued")},
        created=["r-0", "r-1"],
        gated=True,
    ),
    Case(
        "Queued gang, room now -> gates lifted together",
        run(status=QUEUED),
        [env(), *NODES, node_pod(0, gated=True), node_pod(1, gated=True)],
        "Queued",
        conditions={"Admitted": ("True", "GangAdmitted")},
        created=["r-0", "r-1"],
        gated=False,
    ),
    Case(
        "a missing ServiceAccount -> Pending, waits for it",
        run(spec={"serviceAccountName": "trainer"}),
        [env(), *NODES],
        "Pending",
        events=["Pending"],
        conditions={"Admitted": ("False", "ServiceAccountNotFound")},
        requeue=10.0,
        refusal=(
            "Pod",
            403,
            'pods "r-0" is forbidden: error looking up service account ns/trainer: '
            'serviceaccount "trainer" not found',
        ),
    ),
    Case(
        "Pod Security refuses the Pods -> Failed, says what to do",
        run(),
        [env(), *NODES],
        "Failed",
        events=["InvalidSpec"],
        conditions={"Accepted": ("False", "InvalidSpec")},
        refusal=("Pod", 403, 'pods "r-0" is forbidden: violates PodSecurity "restricted"'),
    ),
    Case(
        "the apiserver finds the Pods invalid -> Failed at once, no retry",
        run(),
        [env(), *NODES],
        "Failed",
        events=["InvalidSpec"],
        conditions={"Accepted": ("False", "InvalidSpec"), "Failed": ("True", "InvalidSpec")},
        failure={"reason": "InvalidSpec"},
        refusal=("Pod", 422, 'Pod "r-0" is invalid: spec.nodeSelector: Invalid value: "a b"'),
    ),
    Case(
        "the apiserver finds the checkpoint claim invalid -> Failed at once, no Pods",
        run(spec={"checkpoints": {"size": "1Gi"}}),
        [env(), *NODES],
        "Failed",
        events=["InvalidSpec"],
        conditions={"Accepted": ("False", "InvalidSpec")},
        refusal=(
            "PersistentVolumeClaim",
            422,
            'PersistentVolumeClaim "r-checkpoints" is invalid: spec.accessModes: '
            'Unsupported value: "ReadWriteOncePod"',
        ),
    ),
    Case(
        "the PriorityClass went away as the Pods were created -> Pending, waits for it",
        run(spec={"compute.priorityClassName": "high"}),
        [env(), *NODES, priority_class("high")],
        "Pending",
        events=["Pending"],
        conditions={"Admitted": ("False", "PriorityClassNotFound")},
        requeue=10.0,
        refusal=("Pod", 403, 'pods "r-0" is forbidden: no PriorityClass with name high was found'),
    ),
    Case(
        "the namespace's quota is full -> Pending, waits for room",
        run(),
        [env(), *NODES],
        "Pending",
        events=["Pending"],
        conditions={"Admitted": ("False", "QuotaExceeded")},
        requeue=10.0,
        refusal=("Pod", 403, 'pods "r-0" is forbidden: exceeded quota: gpus, requested: 4'),
    ),
    # -- objects the spec names, looked up before the Pods ------------------------------
    Case(
        "the ConfigMap of its code is missing -> Pending, no Pods, waits for it",
        run(spec={"source": {"configMap": "src"}}),
        [env(), *NODES],
        "Pending",
        events=["Pending"],
        conditions={"Admitted": ("False", "ConfigMapNotFound")},
        requeue=10.0,
    ),
    Case(
        "the ConfigMap of its code exists -> created",
        run(spec={"source": {"configMap": "src"}}),
        [env(), *NODES, named("ConfigMap", "src")],
        "Queued",
        events=["Queued"],
        created=["r-0", "r-1"],
    ),
    Case(
        "its checkpoint claim is missing -> Pending, no Pods, waits for it",
        run(spec={"checkpoints": {"claimName": "ckpt"}}),
        [env(), *NODES],
        "Pending",
        events=["Pending"],
        conditions={"Admitted": ("False", "PersistentVolumeClaimNotFound")},
        requeue=10.0,
    ),
    Case(
        "its PriorityClass is missing -> Pending, no Pods, waits for it",
        run(spec={"compute.priorityClassName": "high"}),
        [env(), *NODES],
        "Pending",
        events=["Pending"],
        conditions={"Admitted": ("False", "PriorityClassNotFound")},
        requeue=10.0,
    ),
    Case(
        "its claim and PriorityClass exist -> created",
        run(spec={"checkpoints": {"claimName": "ckpt"}, "compute.priorityClassName": "high"}),
        [env(), *NODES, named("PersistentVolumeClaim", "ckpt"), priority_class("high")],
        "Queued",
        events=["Queued"],
        created=["r-0", "r-1"],
        gated=True,  # a PriorityClass's value only the apiserver knows: the pass places it
    ),
    Case(
        "a queueName and no Kueue in the cluster -> Pending, not ignored",
        run(spec={"scheduling.queueName": "team"}),
        [env(), *NODES],
        "Pending",
        events=["Pending"],
        conditions={"Admitted": ("False", "KueueNotInstalled")},
        requeue=10.0,
    ),
    Case(
        "a queueName Kueue does not have -> Pending, waits for the LocalQueue",
        run(spec={"scheduling.queueName": "team"}),
        [env(), *NODES, *kueue("other")],
        "Pending",
        events=["Pending"],
        conditions={"Admitted": ("False", "LocalQueueNotFound")},
        requeue=10.0,
    ),
    Case(
        "Kueue admits the gang itself -> created as planned",
        run(spec={"scheduling.queueName": "team"}),
        [env(), *NODES, *kueue("team")],
        "Queued",
        events=["Queued"],
        created=["r-0", "r-1"],
    ),
    # -- running ----------------------------------------------------------------------
    Case(
        "admitted, one Pod bound -> Queued, Starting",
        run(status=QUEUED),
        [env(), *NODES, node_pod(0, node_name="gpu-0"), node_pod(1)],
        "Queued",
        conditions={"Running": ("False", "Starting")},
    ),
    Case(
        "admitted, all bound, one running -> Running, Starting",
        run(status=QUEUED),
        [
            env(),
            *NODES,
            node_pod(0, phase="Running", node_name="gpu-0"),
            node_pod(1, node_name="gpu-1"),
        ],
        "Running",
        events=["Running"],
        conditions={"Running": ("False", "Starting")},
        requeue=POLL,  # a running Pod's progress is read again in 10 s
    ),
    Case(
        "Queued, all running -> Running",
        run(status=QUEUED),
        [env(), *NODES, *running()],
        "Running",
        events=["Running"],
        conditions={"Running": ("True", "AllNodesRunning")},
        requeue=POLL,
    ),
    Case(
        "Running within its deadline -> looked at again when it is over",
        run(status=RUNNING, spec={"policy.activeDeadlineSeconds": 65}),
        [env(), *NODES, *running()],
        "Running",
        requeue=5.0,  # before the next progress read (10 s)
    ),
    # -- succeeded ----------------------------------------------------------------------
    Case(
        "Running, all succeeded -> Succeeded",
        run(status=RUNNING),
        [env(), *NODES, *succeeded()],
        "Succeeded",
        events=["Succeeded"],
        conditions={"Succeeded": ("True", "Completed")},
    ),
    Case(
        "succeeded with a TTL -> looked at again when it is over",
        run(status=RUNNING, spec={"policy.ttlSecondsAfterFinished": 60}),
        [env(), *NODES, *succeeded()],
        "Succeeded",
        events=["Succeeded"],
        requeue=60.5,
    ),
    Case(
        "succeeded without an archive (optional outputs) -> Succeeded and a Warning",
        run(status=RUNNING, spec={"outputs.optional": True}),
        [env(), *NODES, *succeeded(message=ARCHIVE_FAILED)],
        "Succeeded",
        events=["Succeeded", "ArchiveFailed"],
        conditions={"OutputsArchived": ("False", "ArchiveFailed")},
    ),
    Case(
        "succeeded, model to register, registry unreachable -> Finalizing, retried",
        run(status=RUNNING, spec={"outputs.register": {"model": "birds"}}),
        [env(), *NODES, *succeeded()],
        "Finalizing",
        events=["Finalizing"],
        conditions={"Succeeded": ("False", "Finalizing")},
        requeue=5.0,
        settings=pods.Settings(
            registry_url="http://127.0.0.1:9", registry_token_file="/nonexistent"
        ),
    ),
    Case(
        "succeeded, model to register, no registry service -> Succeeded without a model",
        run(status=RUNNING, spec={"outputs.register": {"model": "birds"}}),
        [env(), *NODES, *succeeded()],
        "Succeeded",
        events=["Succeeded"],
    ),
    # -- failures and restarts ---------------------------------------------------------
    Case(
        "a rank failed, no backoff -> Failed, the survivor stopped",
        run(status=RUNNING),
        [env(), *NODES, failed_pod(0), node_pod(1, phase="Running", node_name="gpu-1")],
        "Failed",
        events=["Error"],
        failure={"reason": "Error", "node": 0, "exitCode": 1},
        deleted=["r-1"],
        at=FAILURE_SETTLE_SECONDS * 3,
    ),
    Case(
        "a rank failed, backoff left -> restart (user), back to Pending",
        run(status=RUNNING, spec={"policy.backoffLimit": 1}),
        [env(), *NODES, failed_pod(0), failed_pod(1)],
        "Pending",
        events=["Restarting"],
        conditions={"Running": ("False", "Restarting")},
        deleted=["r-0", "r-1"],
        requeue=0.5,
        restarts=(1, 1),
    ),
    Case(
        "an evicted Pod -> restart (platform), backoffLimit untouched",
        run(status=RUNNING),
        [
            env(),
            *NODES,
            failed_pod(0, pod_reason="Evicted"),
            node_pod(1, phase="Running", node_name="gpu-1"),
        ],
        "Pending",
        events=["Restarting"],
        deleted=["r-0", "r-1"],
        requeue=0.5,
        restarts=(1, 0),
        at=FAILURE_SETTLE_SECONDS * 3,
    ),
    Case(
        "a lost node Pod while Running -> restart (platform)",
        run(status=RUNNING),
        [env(), *NODES, running()[0]],
        "Pending",
        events=["Restarting"],
        deleted=["r-0"],
        requeue=0.5,
        restarts=(1, 0),
    ),
    Case(
        "a lost node Pod, no platform restart left -> Failed, says so",
        run(status={**RUNNING, "restarts": 1}, spec={"policy.platformRestartLimit": 1}),
        [env(), *NODES, node_pod(0, phase="Running", node_name="gpu-0", attempt=1)],
        "Failed",
        events=["NodeLost"],
        failure={"reason": "NodeLost", "node": 1, "pod": "r-1"},
        deleted=["r-0"],
    ),
    Case(
        "a missing Pod before the gang ran is not lost -> created",
        run(status=QUEUED),
        [env(), *NODES, node_pod(0, node_name="gpu-0")],
        "Queued",
        created=["r-1"],
        gated=False,
    ),
    Case(
        "a Running gang's Pod on a deleted Node -> released at once (NodeLost), restart",
        run(status=RUNNING),
        [env(), NODES[0], *running()],
        "Pending",
        events=["NodeLost", "Restarting"],
        conditions={"Running": ("False", "Restarting")},
        deleted=["r-0", "r-1"],
        requeue=0.5,
        restarts=(1, 0),
    ),
    Case(
        "a Queued gang's Pod bound to a deleted Node -> released (NodeLost), created again",
        run(status=QUEUED),
        [env(), NODES[0], node_pod(0, node_name="gpu-0"), node_pod(1, node_name="gpu-1")],
        "Queued",
        events=["NodeLost"],
        created=["r-1"],
        deleted=["r-1"],
    ),
    Case(
        "a node Pod that finished before its Node was deleted is left: its exit decides",
        run(status=RUNNING),
        [env(), NODES[0], running()[0], succeeded()[1]],
        "Running",
        requeue=POLL,  # node 0's progress
    ),
    Case(
        "an image that cannot be pulled -> Failed, not restarted",
        run(status=QUEUED, spec={"policy.backoffLimit": 3}),
        [
            env(),
            *NODES,
            node_pod(0, waiting="ImagePullBackOff", message="not found"),
            node_pod(1, phase="Running", node_name="gpu-1"),
        ],
        "Failed",
        events=["ImagePullBackOff"],
        failure={"reason": "ImagePullBackOff"},
        deleted=["r-0", "r-1"],
    ),
    Case(
        "past activeDeadlineSeconds -> Failed, Pods stopped",
        run(status=RUNNING, spec={"policy.activeDeadlineSeconds": 30}),
        [env(), *NODES, *running()],
        "Failed",
        events=["DeadlineExceeded"],
        failure={"reason": "DeadlineExceeded"},
        deleted=["r-0", "r-1"],
    ),
    Case(
        "a lost connection while its peer still runs -> nothing decided until it settled",
        run(status=RUNNING),
        [
            env(),
            *NODES,
            failed_pod(0, message="RuntimeError: Connection closed by peer"),
            node_pod(1, phase="Running", node_name="gpu-1"),
        ],
        "Running",
        requeue=FAILURE_SETTLE_SECONDS + 0.5,
        at=-0.5,
        writes=0,
    ),
    # -- attempts, finished runs ---------------------------------------------------------
    Case(
        "a restarted run with the old attempt's Pods -> they go first",
        run(status={"phase": "Pending", "restarts": 1, "failedAttempts": 1}),
        [env(), *NODES, failed_pod(0), failed_pod(1)],
        "Pending",
        deleted=["r-0", "r-1"],
        requeue=1.0,
    ),
    Case(
        "a restarted run once they went -> the next attempt is created",
        run(status={"phase": "Pending", "restarts": 1, "failedAttempts": 1}),
        [env(), *NODES],
        "Queued",
        events=["Queued"],
        created=["r-0", "r-1"],
        gated=False,
        restarts=(1, 1),
    ),
    Case(
        "finished, a rank still running -> stopped, status kept",
        run(status={"phase": "Failed", "completionTime": "2026-01-01T11:59:00Z"}),
        [env(), *NODES, failed_pod(0), node_pod(1, phase="Running", node_name="gpu-1")],
        "Failed",
        deleted=["r-1"],
        writes=0,
    ),
    Case(
        "finished, TTL not over -> looked at again then",
        run(
            status={"phase": "Succeeded", "completionTime": "2026-01-01T11:59:00Z"},
            spec={"policy.ttlSecondsAfterFinished": 120},
        ),
        [env(), *NODES, *succeeded()],
        "Succeeded",
        requeue=60.5,
        writes=0,
    ),
    Case(
        "finished, TTL over -> Pods and Service deleted",
        run(
            status={"phase": "Succeeded", "completionTime": "2026-01-01T11:59:00Z"},
            spec={"policy.ttlSecondsAfterFinished": 30},
        ),
        [env(), *NODES, *succeeded()],
        "Succeeded",
        deleted=["r", "r-0", "r-1"],
        writes=0,
    ),
]


def prepare(case: Case) -> FakeK8s:
    fake = world(case.body, *case.objects)
    if case.refusal is not None:
        kind, code, message = case.refusal
        fake.refuse(kind, code, {403: "Forbidden", 422: "Invalid"}[code], message)
    return fake


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_reconcile(case: Case) -> None:
    fake = prepare(case)
    result = reconcile(fake, at=case.at, settings=case.settings)

    assert len(run_writes(fake)) == case.writes  # at most one per reconcile
    after = status(fake)
    assert after.get("phase") == case.phase
    assert [reason for _, reason, _ in fake.events] == case.events
    found = {c["type"]: (c["status"], c["reason"]) for c in after.get("conditions", [])}
    for type_, value in case.conditions.items():
        assert found.get(type_) == value, (type_, found)
    for key, value in case.failure.items():
        assert after["failure"][key] == value, (key, after["failure"])
    if case.restarts is not None:
        assert (after.get("restarts"), after.get("failedAttempts", 0)) == case.restarts

    applied = [m for m in fake.applied if m["kind"] == "Pod"]
    assert sorted(m["metadata"]["name"] for m in applied) == case.created
    if case.gated is not None:
        assert all(("schedulingGates" in m["spec"]) is case.gated for m in applied)
    assert sorted(name for _, name in fake.deleted) == case.deleted
    assert result.requeue_after == pytest.approx(case.requeue)


def run_writes(fake: FakeK8s) -> list[dict[str, Any]]:
    """The status writes of the TrainingRun (not those of a ModelVersion it registered)."""
    return [s for s in fake.statuses if s["kind"] == "TrainingRun"]


def test_the_rows_take_every_phase_transition() -> None:
    """Every phase ``status.trainingruns`` can reach is reached from where a run can be."""
    reached = {
        (c.body.get("status", {}).get("phase"), c.phase)
        for c in CASES
        if c.phase != c.body.get("status", {}).get("phase")
    }
    expected = {
        (None, "Preparing"),
        ("Preparing", "Failed"),  # the Environment failed
        (None, "Failed"),  # an invalid spec
        ("Preparing", "Queued"),
        (None, "Queued"),
        (None, "Pending"),  # waits for its ServiceAccount
        ("Queued", "Running"),
        ("Running", "Succeeded"),
        ("Running", "Finalizing"),
        ("Running", "Failed"),
        ("Running", "Pending"),  # restarted
        ("Queued", "Failed"),  # a stuck Pod
        ("Pending", "Queued"),  # the next attempt
    }
    assert expected <= reached


def test_a_failure_decided_once_travels_to_the_status() -> None:
    """The platform failure the policy ended the run with (with "no restart left") is the
    one in status: the status does not find the failure again from the Pods."""
    fake = world(
        run(status={**RUNNING, "restarts": 1}, spec={"policy.platformRestartLimit": 1}),
        env(),
        *NODES,
        node_pod(0, phase="Running", node_name="gpu-0", attempt=1),
    )
    reconcile(fake)
    message = status(fake)["failure"]["message"]
    assert "disappeared while the run was running" in message
    assert message.endswith("no platform restart left (1 of policy.platformRestartLimit 1 used)")


def test_a_whole_run_writes_its_status_at_most_once_per_reconcile() -> None:
    """From creation to Succeeded, with the kubelet's part played between reconciles, and
    a reconcile that changes nothing writes nothing."""
    fake = world(run(), env("Building"), *NODES)
    writes = []

    def step(at: float) -> str:
        fake.reset_writes()
        reconcile(fake, at=at)
        writes.append(len(fake.statuses))
        again = len(fake.statuses)
        reconcile(fake, at=at)  # nothing changed meanwhile
        assert len(fake.statuses) == again, "an unchanged status is not written again"
        return str(status(fake).get("phase"))

    assert step(0) == "Preparing"
    fake.put(env("Ready"))
    assert step(1) == "Queued"
    assert fake.pod_names() == ["r-0", "r-1"]
    for p in fake.pods():
        p["spec"]["nodeName"] = "gpu-" + p["metadata"]["name"][-1]
        p["status"] = {"phase": "Running"}
    assert step(2) == "Running"
    for p in fake.pods():
        p["status"] = succeeded()[0]["status"]
    assert step(3) == "Succeeded"
    assert writes == [1, 1, 1, 1]
    assert [e[1] for e in fake.events] == ["Succeeded"]


def test_a_gang_coming_up_writes_its_counts_at_most_once_a_second() -> None:
    """Each Pod event of a big gang changes only ``status.nodes``: that is written at most
    once a second (the reconcile in between asks to be queued again when the second is
    up), while a phase change is written at once."""
    nodes = [gpu_node(f"gpu-{i}") for i in range(4)]
    fake = world(run(spec={"distribution.nodeCount": 4}), env(), *nodes)
    written_at: dict[Any, Any] = {}
    reconcile(fake, at=0, written_at=written_at)
    assert status(fake)["nodes"]["scheduled"] == 0

    def schedule(i: int) -> None:
        next(p for p in fake.pods() if p["metadata"]["name"] == f"r-{i}")["spec"]["nodeName"] = (
            f"gpu-{i}"
        )

    fake.reset_writes()
    schedule(0)
    assert reconcile(fake, at=0.25, written_at=written_at).requeue_after == 0.75
    schedule(1)
    assert reconcile(fake, at=0.5, written_at=written_at).requeue_after == 0.5
    assert (fake.statuses, status(fake)["nodes"]["scheduled"]) == ([], 0)
    reconcile(fake, at=1.0, written_at=written_at)  # the second is up: what it sees now
    assert (len(fake.statuses), status(fake)["nodes"]["scheduled"]) == (1, 2)

    fake.reset_writes()
    for p in fake.pods():
        p["spec"]["nodeName"] = "gpu-" + p["metadata"]["name"][-1]
        p["status"] = {"phase": "Running"}
    reconcile(fake, at=1.1, written_at=written_at)  # Running: a phase, written at once
    assert (len(fake.statuses), status(fake)["phase"]) == (1, "Running")


def test_a_run_being_deleted_is_left_alone() -> None:
    body = run(status=RUNNING)
    body["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    fake = world(body, env(), *NODES, *running())
    assert reconcile(fake).requeue_after is None
    assert (fake.statuses, fake.applied, fake.deleted, fake.events) == ([], [], [], [])


def test_a_run_that_finished_leaves_the_waiting_runs_to_the_admission_pass() -> None:
    # The pass over the cache admits them on the Pods' events (test_admission_pass.py);
    # the finished run's reconcile lists nothing and queues no one.
    waiting = node_pod(0, gated=True)
    waiting["metadata"].update(name="other-0", labels={**waiting["metadata"]["labels"]})
    waiting["metadata"]["labels"]["torchyard.dev/run"] = "other"
    fake = world(run(status=RUNNING), env(), *NODES, *succeeded(), waiting)
    assert reconcile(fake).also == []
    assert status(fake)["phase"] == "Succeeded"


class Registry(http.server.BaseHTTPRequestHandler):
    """The registry service's promote endpoint, on loopback: version 3 of the model."""

    requests: list[tuple[str, dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Registry.requests.append((self.path, body))
        manifest = {
            "version": 3,
            "files": [{"path": "model.pt", "size": 3, "sha256": "a" * 64}],
            "size": "3 B",
            "created": "2026-01-01T12:00:00Z",
        }
        data = json.dumps(manifest).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def test_finalizing_registers_the_model_then_succeeds(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("operator-token\n")
    settings = pods.Settings(
        registry_url=f"http://127.0.0.1:{server.server_address[1]}",
        registry_token_file=str(token),
    )
    finalizing = {**RUNNING, "phase": "Finalizing"}
    fake = world(
        run(status=finalizing, spec={"outputs.register": {"model": "birds"}}),
        env(),
        *NODES,
        *succeeded(),
    )
    try:
        reconcile(fake, settings=settings)
    finally:
        server.shutdown()
    [(path, body)] = Registry.requests
    assert path == "/v1/namespaces/ns/models/birds/versions"
    assert body["run"] == "r" and body["metadata"]["run"]["uid"] == "uid-r"
    assert status(fake)["phase"] == "Succeeded"
    assert status(fake)["model"] == {"name": "birds", "version": 3}
    assert [e[1] for e in fake.events] == ["Succeeded"]
    assert len(run_writes(fake)) == 1
    [mv_status] = [s for s in fake.statuses if s["kind"] == "ModelVersion"]
    assert mv_status["metadata"]["name"] == "birds-v3"
    assert fake.get(k8s.MODELVERSIONS, "ns", "birds-v3")["spec"]["run"]["name"] == "r"
