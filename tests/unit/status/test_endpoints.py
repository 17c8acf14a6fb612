"""OnlineEndpoint status as a pure function (torchyard.status.endpoints): the phases in
order, a serving Pod whose init() raised named with its class and traceback (the runs'
failure story) instead of a bare CrashLoopBackOff, a rollout's Updating, a canary's
versions."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest

from tests.builders import EndpointBuilder
from torchyard import api
from torchyard.serving import contract
from torchyard.status import endpoints as st
from torchyard.status.inputs import InputsObserved

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)
EP = api.parse_endpoint(EndpointBuilder("birds", "a").model("pytorch-birds", 2).obj())
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/workspace/pytorch_score.py", line 9, in init\n'
    "    model = torch.load(path)\n"
    "FileNotFoundError: [Errno 2] No such file or directory: '/models/model.pt'"
)
READY_INPUTS = InputsObserved([{"name": "model_v2", "uri": "model://pytorch-birds/2", "key": "k"}])


def pod(name: str, *, ready: bool = False, version: int = 2, **container: Any) -> dict[str, Any]:
    status = {"name": "scorer", "ready": ready, "restartCount": container.pop("restarts", 0)}
    status.update(container)
    return {
        "metadata": {"name": name, "labels": {"torchyard.dev/model-version": str(version)}},
        "status": {"containerStatuses": [status]},
    }


def crashed(name: str, message: str, exit_code: int = 3, reason: str = "Error") -> dict[str, Any]:
    ended = {"exitCode": exit_code, "reason": reason, "message": message}
    return pod(
        name,
        restarts=2,
        state={"waiting": {"reason": "CrashLoopBackOff"}},
        lastState={"terminated": ended},
    )


INIT_FAILED = json.dumps(
    {
        "reason": contract.INIT_FAILED,
        "exitCode": 3,
        "exception": "FileNotFoundError",
        "message": TRACEBACK,
    }
)


def serving(
    ready: int, desired: int = 1, rolled: bool = True, pods: list[Any] | None = None
) -> st.EndpointObserved:
    load = st.Workload(
        "primary", 2, 100, "birds", desired, ready, desired if rolled else 0, rolled, "k"
    )
    return st.EndpointObserved(
        model=("pytorch-birds", 2),
        inputs=READY_INPUTS,
        workloads=[load],
        pods=pods or [],
        scoring_uri="http://birds.a.svc/score",
    )


def status_of(observed: st.EndpointObserved) -> dict[str, Any]:
    return st.endpoint_status(EP, observed, {}, NOW)


def conditions(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status["conditions"]}


@pytest.mark.parametrize(
    "observed, phase, reason",
    [
        (
            st.EndpointObserved(waiting=("EnvironmentNotReady", "building")),
            "Pending",
            "EnvironmentNotReady",
        ),
        (st.EndpointObserved(failed=("NoRegistry", "none")), "Failed", "NoRegistry"),
        (
            st.EndpointObserved(
                model=("m", 2), inputs=InputsObserved([], {"model_v2": "fetching"})
            ),
            "Preparing",
            "Fetching",
        ),
        (
            st.EndpointObserved(
                model=("m", 2),
                inputs=InputsObserved(
                    [], failure={"reason": "InputFetchFailed", "message": "sha256 differs"}
                ),
            ),
            "Failed",
            "InputFetchFailed",
        ),
        (serving(0), "Deploying", "Deploying"),
        (serving(1, 2, rolled=False), "Updating", "RollingOut"),
        (serving(1, 1, rolled=False), "Updating", "RollingOut"),
        (serving(1), "Ready", "Serving"),
    ],
)
def test_the_phases(observed: st.EndpointObserved, phase: str, reason: str) -> None:
    status = status_of(observed)
    assert status["phase"] == phase
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == reason and ready["status"] == (
        "True" if phase == "Ready" else "False"
    )
    cond = conditions(status)
    assert cond["Stalled"] == ("True" if phase == "Failed" else "False")
    assert cond["Reconciling"] == (
        "True" if phase in ("Pending", "Preparing", "Deploying", "Updating") else "False"
    )


def test_init_raising_fails_the_endpoint_with_the_class_and_the_traceback() -> None:
    status = status_of(serving(0, pods=[crashed("birds-7d-x", INIT_FAILED)]))
    assert status["phase"] == "Failed"
    failure = status["failure"]
    assert failure["reason"] == contract.INIT_FAILED and failure["exception"] == "FileNotFoundError"
    assert failure["class"] == "PythonException" and failure["message"] == TRACEBACK
    assert failure["pod"] == "birds-7d-x" and failure["version"] == 2 and failure["restarts"] == 2
    assert "init() raised" in failure["advice"]
    assert "CrashLoopBackOff" not in status["message"] and "PythonException" in status["message"]


def prepare_failed(terminated: dict[str, Any]) -> dict[str, Any]:
    """A serving Pod stuck in its init container (the model's files and the source)."""
    failed = pod("birds-7d-x", state={"waiting": {"reason": "PodInitializing"}})
    init = {
        "name": contract.PREPARE_CONTAINER,
        "ready": False,
        "restartCount": 1,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": terminated},
    }
    failed["status"]["initContainerStatuses"] = [init]
    return failed


# Words of the training runs' advice, which says nothing true of a serving Pod.
TRAINING_WORDS = ("rank", "node Pod", "checkpoint", "backoffLimit", "the run")


@pytest.mark.parametrize(
    "terminated",
    [
        {
            "exitCode": 1,
            "reason": "Error",
            "message": "weights.pt: sha256 differs from the manifest",
        },
        {
            "exitCode": 1,
            "reason": "Error",
            "message": "Traceback (most recent call last):\n"
            "ConnectionRefusedError: [Errno 111] Connection refused",
        },
        {"exitCode": 137, "reason": "OOMKilled", "message": ""},
        {"exitCode": 2, "reason": "Error", "message": "model://birds/9: no such version"},
    ],
    ids=["checksum", "registry-unreachable", "oom", "no-such-version"],
)
def test_an_init_container_failure_says_what_the_init_container_does(
    terminated: dict[str, Any],
) -> None:
    status = status_of(serving(0, pods=[prepare_failed(terminated)]))
    failure = status["failure"]
    assert status["phase"] == "Failed" and failure["pod"] == "birds-7d-x"
    assert failure.get("message", "") == terminated["message"]
    assert failure["advice"] == st.PREPARE_ADVICE
    assert not [w for w in TRAINING_WORDS if w in failure["advice"]]


def test_a_failing_new_version_beside_serving_pods_is_degraded() -> None:
    pods = [pod("birds-old", ready=True, version=1), crashed("birds-new", INIT_FAILED)]
    status = status_of(serving(1, 2, rolled=False, pods=pods))
    assert status["phase"] == "Degraded" and status["failure"]["pod"] == "birds-new"
    assert conditions(status)["Available"] == "True" and conditions(status)["Ready"] == "False"


@pytest.mark.parametrize(
    "bad, failure_class, reason",
    [
        (
            crashed(
                "p",
                json.dumps(
                    {
                        "reason": "InitFailed",
                        "exitCode": 3,
                        "message": "ModuleNotFoundError: No module named 'torchvision'",
                    }
                ),
            ),
            "ImportError",
            "InitFailed",
        ),
        (crashed("p", "", exit_code=137, reason="OOMKilled"), "HostOOM", "OOMKilled"),
        (
            pod("p", state={"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}),
            "ImagePullBackOff",
            "ImagePullBackOff",
        ),
        (
            crashed(
                "p",
                json.dumps(
                    {
                        "reason": "RuntimeFailed",
                        "exitCode": 4,
                        "message": "ModuleNotFoundError: No module named 'uvicorn'",
                    }
                ),
                exit_code=4,
            ),
            "ImportError",
            "RuntimeFailed",
        ),
    ],
)
def test_each_way_a_serving_pod_fails_is_classified(
    bad: Any, failure_class: str, reason: str
) -> None:
    failure = status_of(serving(0, pods=[bad]))["failure"]
    assert (failure["class"], failure["reason"]) == (failure_class, reason)
    assert failure["advice"]


def test_a_pod_that_restarted_and_serves_again_is_no_failure() -> None:
    recovered = crashed("p", INIT_FAILED)
    recovered["status"]["containerStatuses"][0].update(ready=True, state={"running": {}})
    assert "failure" not in status_of(serving(1, pods=[recovered]))


def test_a_ready_endpoint_lists_its_versions_and_uri() -> None:
    status = status_of(serving(1))
    assert status["scoringUri"] == "http://birds.a.svc/score"
    assert status["versions"] == [
        {
            "version": 2,
            "percent": 100,
            "deployment": "birds",
            "replicas": 1,
            "readyReplicas": 1,
            "updatedReplicas": 1,
            "key": "k",
        }
    ]
    assert status["model"] == {"name": "pytorch-birds", "version": 2}
    assert (status["replicas"], status["readyReplicas"]) == (1, 1)
    again = st.endpoint_status(EP, serving(1), status, NOW.replace(hour=13))
    assert again == status  # same observations, same status: no write


def rollout(generation: int, observed: int, pods: int, updated: int) -> dict[str, Any]:
    counts = {"replicas": pods, "updatedReplicas": updated, "readyReplicas": pods}
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": 2},
        "status": {"observedGeneration": observed, **counts},
    }


@pytest.mark.parametrize(
    "deployment, rolled",
    [
        (rollout(2, 2, 2, 2), True),
        (rollout(3, 2, 2, 2), False),  # the controller has not seen the new template yet
        (rollout(2, 2, 3, 1), False),  # an old Pod is still there
    ],
)
def test_a_deployments_rollout(deployment: dict[str, Any], rolled: bool) -> None:
    load = st.deployment_workload("primary", 2, 100, "birds", None, deployment)
    assert load.rolled is rolled and load.desired == 2


def test_an_invalid_spec_fails_at_once() -> None:
    status = st.invalid_endpoint_status(3, "spec.model: bad", {}, NOW)
    assert status["phase"] == "Failed" and status["observedGeneration"] == 3
    assert conditions(status) == {
        "Accepted": "False",
        "Ready": "False",
        "Reconciling": "False",
        "Stalled": "True",
    }


def test_pods_that_never_get_ready_time_out_with_the_deployments_deadline() -> None:
    deployment = rollout(2, 2, 1, 1)
    deployment["status"]["readyReplicas"] = 0
    deployment["status"]["conditions"] = [
        {
            "type": "Progressing",
            "status": "False",
            "reason": "ProgressDeadlineExceeded",
            "message": 'ReplicaSet "birds-7d" has timed out progressing.',
        }
    ]
    load = st.deployment_workload("primary", 2, 100, "birds", 1, deployment)
    observed = st.EndpointObserved(
        model=("pytorch-birds", 2), inputs=READY_INPUTS, workloads=[load]
    )
    status = status_of(observed)
    assert status["phase"] == "Failed"
    assert status["failure"]["class"] == "InitTimeout"
    assert "has timed out progressing" in status["failure"]["message"]
