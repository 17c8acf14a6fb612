"""A run's inputs decide its phase after the Environment: being fetched, it is Preparing
(InputsReady False, Fetching); a failed fetch fails it (InputFetchFailed, the input, its
URI and the fetcher's error); once all are ready it goes on to admission, with
status.inputs recorded."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import api, status
from torchyard.status import inputs
from torchyard.status.trainingruns import Observed

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
READY_ENV = {"status": {"phase": "Ready"}}
ENTRY = {
    "name": "birds",
    "uri": "https://h/birds.tgz",
    "revision": "ab" * 32,
    "digest": "sha256:" + "cd" * 32,
    "bytes": 10,
    "fetchedBytes": 0,
    "key": "k",
}


def compute(observed: inputs.InputsObserved | None) -> dict[str, Any]:
    run = api.parse_trainingrun(TrainingRunBuilder("r").obj())
    return status.trainingrun_status(run, Observed(environment=READY_ENV, inputs=observed), {}, NOW)


def reason(st: dict[str, Any], kind: str) -> tuple[str, str] | None:
    cond = status.find(st.get("conditions"), kind)
    return (cond["status"], cond["reason"]) if cond else None


CASES = [
    ("no inputs", None, "Pending", None),
    (
        "being fetched",
        inputs.InputsObserved([{"name": "birds", "uri": "u", "key": "k"}], {"birds": "fetching"}),
        "Preparing",
        ("False", "Fetching"),
    ),
    (
        "a failed fetch",
        inputs.InputsObserved([], {}, inputs.failure("birds", "u", "HTTP 404: check the URL")),
        "Failed",
        ("False", "InputFetchFailed"),
    ),
    ("all ready", inputs.InputsObserved([ENTRY]), "Pending", ("True", "Ready")),
    (
        "a Secret to fix",
        inputs.InputsObserved([], {}, None, {"shots": ("InputSecretNotReady", "s3://b: no")}),
        "Preparing",
        ("False", "InputSecretNotReady"),
    ),
    (
        "a Secret to fix beside a fetch",
        inputs.InputsObserved(
            [ENTRY], {"birds": "fetching"}, None, {"shots": ("FetchPodNotStarting", "pull")}
        ),
        "Preparing",
        ("False", "FetchPodNotStarting"),
    ),
]


@pytest.mark.parametrize(("case", "observed", "phase", "ready"), CASES, ids=[c[0] for c in CASES])
def test_inputs_decide_the_phase(
    case: str, observed: inputs.InputsObserved | None, phase: str, ready: tuple[str, str] | None
) -> None:
    st = compute(observed)
    assert st["phase"] == phase
    assert reason(st, "InputsReady") == ready


def test_a_failed_fetch_names_the_input_its_uri_and_the_error() -> None:
    st = compute(inputs.InputsObserved([], {}, inputs.failure("birds", "u", "HTTP 404: fix")))
    assert st["failure"] == {
        "reason": "InputFetchFailed",
        "message": "input birds (u): HTTP 404: fix",
    }


def test_ready_inputs_are_recorded_in_the_status() -> None:
    st = compute(inputs.InputsObserved([ENTRY]))
    assert st["inputs"] == [ENTRY]
    assert "1 input(s) ready" in status.find(st["conditions"], "InputsReady")["message"]


URI = "s3://birds/train"


def pod(reason: str, message: str = "") -> dict[str, Any]:
    waiting = {"reason": reason, "message": message}
    return {
        "metadata": {"name": "fetch-abc"},
        "status": {"containerStatuses": [{"name": "fetch", "state": {"waiting": waiting}}]},
    }


def test_a_fetch_pod_held_back_by_its_secret_says_which_and_the_fix() -> None:
    held = pod("CreateContainerConfigError", 'secret "birds-store" not found')
    reason_, message = inputs.stuck_fetch(URI, "birds-store", "team", [held]) or ("", "")
    assert reason_ == "InputSecretNotReady"
    assert message.startswith(
        f"{URI}: the fetch Pod fetch-abc cannot start (CreateContainerConfigError: "
        'secret "birds-store" not found): the input\'s Secret birds-store must hold '
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY: kubectl create secret generic "
        "birds-store -n team --from-literal=AWS_ACCESS_KEY_ID=... "
        "--from-literal=AWS_SECRET_ACCESS_KEY=..."
    )
    assert message.endswith("the run waits for it")


def test_a_fetch_pod_that_cannot_pull_waits_with_its_reason() -> None:
    stuck = inputs.stuck_fetch(URI, "", "team", [pod("ImagePullBackOff", "back-off")])
    assert stuck is not None and stuck[0] == "FetchPodNotStarting"
    assert "(ImagePullBackOff: back-off)" in stuck[1] and "initImage" in stuck[1]


def test_an_hf_fetch_pod_held_back_by_its_secret_gets_the_hubs_fix() -> None:
    held = pod("CreateContainerConfigError", 'secret "hub" not found')
    reason_, message = inputs.stuck_fetch("hf://acme/tiny", "hub", "team", [held]) or ("", "")
    assert reason_ == "InputSecretNotReady"
    assert "kubectl create secret generic hub -n team --from-literal=HF_TOKEN=..." in message
    assert "AWS_" not in message


def test_a_fetch_pod_no_node_takes_waits_with_the_schedulers_words() -> None:
    said = "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims."
    unscheduled = {
        "metadata": {"name": "fetch-abc"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": said,
                }
            ],
        },
    }
    stuck = inputs.stuck_fetch(URI, "", "team", [unscheduled])
    assert stuck is not None and stuck[0] == "FetchPodNotScheduled"
    assert stuck[1].startswith(f"{URI}: the fetch Pod fetch-abc is not scheduled ({said})")
    scheduled = {"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}
    assert inputs.stuck_fetch(URI, "", "team", [scheduled]) is None


@pytest.mark.parametrize("state", [{"running": {}}, {"waiting": {"reason": "ContainerCreating"}}])
def test_a_fetch_pod_starting_or_running_is_not_stuck(state: dict[str, Any]) -> None:
    running = {"metadata": {"name": "p"}, "status": {"containerStatuses": [{"state": state}]}}
    assert inputs.stuck_fetch(URI, "birds-store", "team", [running, {}]) is None
