"""TrainingRun status as a pure function of the run, its Environment and its Pods,
tested as a table (the azimuth-capi-operator habit)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder, pod
from torchyard import api, status
from torchyard.status import failures
from torchyard.status.failures import first_failure, observe_failure
from torchyard.status.trainingruns import Observed

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
READY_ENV = {"status": {"phase": "Ready", "image": "img"}}


def run_2x2() -> api.TrainingRun:
    body = TrainingRunBuilder("r").nodes(2).procs(2).obj()
    body["metadata"]["generation"] = 3
    return api.parse_trainingrun(body)


def compute(
    pods: list[dict[str, Any]],
    env: dict[str, Any] | None = READY_ENV,
    previous: dict[str, Any] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    # The failure, as the controller's failure policy finds it and passes it on.
    kw.setdefault("failure", first_failure(pods))
    return status.trainingrun_status(
        run_2x2(), Observed(environment=env, pods=pods, **kw), previous, T0
    )


def conds(st: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in st["conditions"]}


TERMINATION = json.dumps(
    {
        "rank": 3,
        "localRank": 1,
        "nodeRank": 1,
        "exitCode": 1,
        "reason": "Error",
        "message": "Traceback (most recent call last):\nValueError: bad",
    }
)

TABLE: list[tuple[str, dict[str, Any], str, dict[str, tuple[str, str]]]] = [
    (
        "environment missing",
        {"pods": [], "env": None},
        "Preparing",
        {"EnvironmentReady": ("False", "EnvironmentNotFound")},
    ),
    (
        "environment building",
        {"pods": [], "env": {"status": {"phase": "Building"}}},
        "Preparing",
        {"EnvironmentReady": ("False", "EnvironmentNotReady")},
    ),
    (
        "environment failed",
        {"pods": [], "env": {"status": {"phase": "Failed", "message": "pip failed"}}},
        "Failed",
        {"Failed": ("True", "EnvironmentFailed")},
    ),
    (
        "pods being created",
        {"pods": [pod("r", 0, gated=True)]},
        "Pending",
        {"Admitted": ("False", "Creating")},
    ),
    (
        "gang waiting for capacity",
        {
            "pods": [pod("r", 0, gated=True), pod("r", 1, gated=True)],
            "queued_message": "needs 2 node(s) with 8 nvidia.com/gpu in pool a100; 1 fit now",
        },
        "Queued",
        {"Admitted": ("False", "Queued")},
    ),
    (
        "admitted, not yet bound",
        {"pods": [pod("r", 0), pod("r", 1)]},
        "Queued",
        {"Admitted": ("True", "GangAdmitted"), "Running": ("False", "Starting")},
    ),
    (
        "all running",
        {
            "pods": [
                pod("r", 0, phase="Running", node_name="n0"),
                pod("r", 1, phase="Running", node_name="n1"),
            ]
        },
        "Running",
        {"Running": ("True", "AllNodesRunning")},
    ),
    (
        "all succeeded",
        {
            "pods": [
                pod("r", 0, phase="Succeeded", node_name="n", exit_code=0),
                pod("r", 1, phase="Succeeded", node_name="n", exit_code=0),
            ]
        },
        "Succeeded",
        {"Succeeded": ("True", "Completed")},
    ),
    (
        "one rank failed",
        {
            "pods": [
                pod("r", 0, phase="Running", node_name="n"),
                pod("r", 1, phase="Failed", node_name="n", exit_code=1, message=TERMINATION),
            ]
        },
        "Failed",
        {"Failed": ("True", "Error")},
    ),
    (
        "image cannot be pulled",
        {"pods": [pod("r", 0, waiting="ImagePullBackOff", message="not found"), pod("r", 1)]},
        "Failed",
        {"Failed": ("True", "ImagePullBackOff")},
    ),
    (
        "deadline exceeded",
        {
            "pods": [
                pod("r", 0, phase="Running", node_name="n"),
                pod("r", 1, phase="Running", node_name="n"),
            ],
            "deadline_exceeded": True,
        },
        "Failed",
        {"Failed": ("True", "DeadlineExceeded")},
    ),
]


@pytest.mark.parametrize(("case", "kw", "phase", "expected"), TABLE, ids=[t[0] for t in TABLE])
def test_phase_and_conditions(
    case: str, kw: dict[str, Any], phase: str, expected: dict[str, tuple[str, str]]
) -> None:
    st = compute(**kw)
    assert st["phase"] == phase
    found = conds(st)
    for type_, value in expected.items():
        assert found[type_] == value, (type_, found)
    assert found["Accepted"] == ("True", "Valid")
    assert all(c["observedGeneration"] == 3 for c in st["conditions"])


def test_failure_names_rank_node_exit_code_and_traceback() -> None:
    st = compute(
        [
            pod("r", 0, phase="Running", node_name="n"),
            pod("r", 1, phase="Failed", node_name="n", exit_code=1, message=TERMINATION),
        ]
    )
    assert st["failure"] == {
        "rank": 3,
        "node": 1,
        "pod": "r-1",
        "exitCode": 1,
        "reason": "Error",
        "message": "Traceback (most recent call last):\nValueError: bad",
        "class": "PythonException",  # launch.classes
        "retryable": True,
        "advice": st["failure"]["advice"],
        "nodeName": "n",  # the Node the failing rank ran on
    }
    assert st["failure"]["advice"].endswith("(matched: ValueError: bad)")
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed["message"] == "rank 3 (node 1) failed (Error, exit code 1): ValueError: bad"


def test_the_first_failure_decides() -> None:
    early = pod("r", 1, phase="Failed", exit_code=7, finished_at="2026-01-01T12:00:01Z")
    late = pod(
        "r",
        0,
        phase="Failed",
        exit_code=137,
        reason="OOMKilled",
        finished_at="2026-01-01T12:00:05Z",
    )
    assert compute([late, early])["failure"]["exitCode"] == 7


@pytest.mark.parametrize(
    ("pod_reason", "container_reason", "platform"),
    [
        ("Evicted", None, True),
        (None, "OOMKilled", False),
        ("DeadlineExceeded", None, False),
        (None, "Error", False),
        ("NodeLost", None, True),
    ],
)
def test_platform_failures_are_told_apart(
    pod_reason: str | None, container_reason: str | None, platform: bool
) -> None:
    failure = observe_failure(
        pod("r", 0, phase="Failed", exit_code=137, reason=container_reason, pod_reason=pod_reason)
    )
    assert failure is not None
    assert failure["reason"] == (pod_reason or container_reason)
    assert failure["platform"] is platform


def test_plain_text_termination_message_is_kept() -> None:
    failure = observe_failure(
        pod("r", 0, phase="Failed", exit_code=1, message="Segmentation fault (core dumped)")
    )
    assert failure is not None and failure["message"] == "Segmentation fault (core dumped)"


def test_finished_runs_stay_finished() -> None:
    done = compute(
        [pod("r", 0, phase="Succeeded", exit_code=0), pod("r", 1, phase="Succeeded", exit_code=0)]
    )
    later = status.trainingrun_status(
        run_2x2(), Observed(environment=READY_ENV, pods=[]), done, T0 + timedelta(hours=1)
    )
    assert later == done


def test_recomputing_gives_the_same_status() -> None:
    pods = [
        pod("r", 0, phase="Running", node_name="n"),
        pod("r", 1, phase="Running", node_name="n"),
    ]
    first = compute(pods)
    again = status.trainingrun_status(
        run_2x2(), Observed(environment=READY_ENV, pods=pods), first, T0 + timedelta(minutes=3)
    )
    assert again == first
    assert first["nodes"] == {
        "total": 2,
        "scheduled": 2,
        "running": 2,
        "succeeded": 0,
        "failed": 0,
        "ready": "2/2",
    }


def test_registering_outputs_is_finalizing_then_succeeded_with_the_model() -> None:
    body = TrainingRunBuilder("r").nodes(2).register("birds").obj()
    body["metadata"]["generation"] = 1
    run = api.parse_trainingrun(body)
    done = [
        pod("r", 0, phase="Succeeded", exit_code=0),
        pod("r", 1, phase="Succeeded", exit_code=0),
    ]
    pending = status.trainingrun_status(
        run, Observed(environment=READY_ENV, pods=done, finalized=False), None, T0
    )
    assert pending["phase"] == "Finalizing"
    assert conds(pending)["Succeeded"] == ("False", "Finalizing")
    final = status.trainingrun_status(
        run,
        Observed(environment=READY_ENV, pods=done, model={"name": "birds", "version": 3}),
        pending,
        T0,
    )
    assert final["phase"] == "Succeeded"
    assert final["model"] == {"name": "birds", "version": 3}


def archive_failed(node: int, exit_code: int) -> str:
    """What the launcher writes when its ranks succeeded but the upload did not."""
    return json.dumps(
        {
            "nodeRank": node,
            "exitCode": exit_code,
            "reason": "ArchiveFailed",
            "message": "archiving to the model registry failed: 2 of 2 file(s) not uploaded "
            "(first: logs/node-0/rank-0.txt): HTTP 403: forbidden; set spec.serviceAccountName",
        }
    )


def test_a_failed_archive_fails_the_run_with_the_launchers_reason() -> None:
    # The kubelet says "Error" for any non-zero exit; the launcher's reason says more.
    st = compute(
        [
            pod("r", 0, phase="Failed", exit_code=3, message=archive_failed(0, 3)),
            pod("r", 1, phase="Succeeded", exit_code=0),
        ]
    )
    assert st["phase"] == "Failed"
    assert st["failure"]["reason"] == "ArchiveFailed"
    assert st["failure"]["exitCode"] == 3
    assert "HTTP 403" in st["failure"]["message"]
    assert conds(st)["Failed"] == ("True", "ArchiveFailed")
    failure = observe_failure(
        pod("r", 0, phase="Failed", exit_code=3, message=archive_failed(0, 3))
    )
    assert failure is not None and failure["platform"] is False
    # Also where the Pod's own reason is the generic one.
    generic = observe_failure(
        pod("r", 0, phase="Failed", exit_code=3, pod_reason="Error", message=archive_failed(0, 3))
    )
    assert generic is not None and generic["reason"] == "ArchiveFailed"
    # What the kubelet knows better still wins.
    oom = observe_failure(
        pod("r", 0, phase="Failed", exit_code=137, reason="OOMKilled", message=TERMINATION)
    )
    assert oom is not None and oom["reason"] == "OOMKilled"


def oom_killed(node: int, rank: int) -> str:
    """What the launcher writes when the OOM killer ended one of its ranks."""
    return json.dumps(
        {
            "rank": rank,
            "localRank": 0,
            "nodeRank": node,
            "exitCode": 137,
            "signal": 9,
            "reason": "OOMKilled",
            "message": f"rank {rank} was killed by the kernel's OOM killer: this node Pod's "
            "processes went over its memory limit (200Mi). Give the run more memory",
        }
    )


@pytest.mark.parametrize(
    "kubelet_reason",
    ["OOMKilled", "Error"],  # a runtime that saw the OOM kill, or only the exit status
)
def test_a_rank_the_oom_killer_ended_fails_the_run_as_oomkilled_naming_it(
    kubelet_reason: str,
) -> None:
    st = compute(
        [
            pod("r", 0, phase="Running"),
            pod(
                "r",
                1,
                phase="Failed",
                exit_code=137,
                reason=kubelet_reason,
                message=oom_killed(1, 3),
            ),
        ]
    )
    assert st["phase"] == "Failed"
    failure = st["failure"]
    assert (failure["reason"], failure["rank"], failure["node"], failure["exitCode"]) == (
        "OOMKilled",
        3,
        1,
        137,
    )
    assert "over its memory limit (200Mi)" in failure["message"]
    assert conds(st)["Failed"] == ("True", "OOMKilled")


def test_optional_outputs_succeed_with_a_warning_condition() -> None:
    body = TrainingRunBuilder("r").nodes(2).register("birds").obj()
    body["spec"]["outputs"]["optional"] = True
    body["metadata"]["generation"] = 1
    run = api.parse_trainingrun(body)
    done = [
        pod("r", 0, phase="Succeeded", exit_code=0, message=archive_failed(0, 0)),
        pod("r", 1, phase="Succeeded", exit_code=0),
    ]
    st = status.trainingrun_status(run, Observed(environment=READY_ENV, pods=done), None, T0)
    assert st["phase"] == "Succeeded"
    archived = next(c for c in st["conditions"] if c["type"] == "OutputsArchived")
    assert (archived["status"], archived["reason"]) == ("False", "ArchiveFailed")
    assert archived["message"].startswith("the model was not registered")
    assert "node 0: archiving to the model registry failed" in archived["message"]
    assert "model" not in st
    clean = [pod("r", i, phase="Succeeded", exit_code=0) for i in (0, 1)]
    st = status.trainingrun_status(run, Observed(environment=READY_ENV, pods=clean), None, T0)
    assert "OutputsArchived" not in conds(st)


NAMES = ["r-0", "r-1"]
GONE_AT = "2026-01-01T12:00:09Z"


def going(node: int, disruption: str | None = None, phase: str = "Running") -> dict[str, Any]:
    p = pod("r", node, phase=phase, node_name=f"gpu-{node}")
    p["metadata"]["deletionTimestamp"] = GONE_AT
    if disruption:
        p["status"]["conditions"] = [
            {"type": "DisruptionTarget", "status": "True", "reason": disruption}
        ]
    return p


LOST: list[tuple[str, list[dict[str, Any]], dict[str, Any] | None, str]] = [
    ("all there", [pod("r", 0, phase="Running"), pod("r", 1, phase="Running")], None, ""),
    (
        "node 1's Pod is gone",
        [pod("r", 0, phase="Running")],
        {"pod": "r-1", "node": 1},
        "node Pod r-1 (node rank 1) disappeared while the run was running",
    ),
    (
        "evicted from a NotReady node",
        [pod("r", 0, phase="Running"), going(1, "DeletionByTaintManager")],
        {"pod": "r-1", "node": 1},
        "was evicted from node gpu-1, which is NotReady or unreachable",
    ),
    (
        "being deleted",
        [going(0), pod("r", 1, phase="Running")],
        {"pod": "r-0", "node": 0},
        "node Pod r-0 (node rank 0) on node gpu-0 is being deleted",
    ),
    (
        "finished before it went",
        [going(0, phase="Succeeded"), pod("r", 1, phase="Running")],
        None,
        "",
    ),
]


@pytest.mark.parametrize(("case", "pods", "named", "message"), LOST, ids=[c[0] for c in LOST])
def test_a_lost_node_pod_is_named(
    case: str, pods: list[dict[str, Any]], named: dict[str, Any] | None, message: str
) -> None:
    failure = failures.lost_failure(NAMES, pods)
    if named is None:
        assert failure is None
        return
    assert failure is not None
    assert failure["reason"] == "NodeLost" and failure["platform"] is True
    assert {k: failure[k] for k in named} == named
    assert message in failure["message"]


def test_the_failure_the_controller_decided_on_reaches_the_status() -> None:
    # The gang lost node 1's Pod and no platform restart is left: Failed, NodeLost, named,
    # although the Pods that are left show no failure of their own.
    lost = failures.lost_failure(NAMES, [pod("r", 0, phase="Running")])
    assert lost is not None
    st = compute([pod("r", 0, phase="Running", node_name="n0")], failure=lost)
    assert st["phase"] == "Failed"
    assert st["failure"]["reason"] == "NodeLost"
    assert (st["failure"]["pod"], st["failure"]["node"]) == ("r-1", 1)
    assert conds(st)["Failed"] == ("True", "NodeLost")
    assert conds(st)["Stalled"] == ("True", "NodeLost")


def test_a_missing_service_account_keeps_the_run_pending_with_the_reason() -> None:
    why = ("ServiceAccountNotFound", "the node Pods run as ServiceAccount trainer ...")
    st = compute([], pending=why)
    assert st["phase"] == "Pending"
    admitted = next(c for c in st["conditions"] if c["type"] == "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "ServiceAccountNotFound")
    assert admitted["message"] == why[1]


def test_the_admitted_condition_says_how_the_lowest_ranked_pod_was_admitted() -> None:
    """Where the gang went is on its Pods (the admission writes it once, when it lets them
    go); the status reads it each time, node rank 0's first."""
    noted = [pod("r", 0), pod("r", 1)]
    for i, p in enumerate(reversed(noted)):
        p["metadata"].setdefault("annotations", {})["torchyard.dev/admitted"] = f"note {1 - i}"
    (admitted,) = [c for c in compute(noted)["conditions"] if c["type"] == "Admitted"]
    assert (admitted["reason"], admitted["message"]) == ("GangAdmitted", "note 0")
    plain = compute([pod("r", 0), pod("r", 1)])
    (admitted,) = [c for c in plain["conditions"] if c["type"] == "Admitted"]
    assert admitted["message"] == "all 2 node Pod(s) admitted together"
