"""The MLflow REST bodies and the Pods' MLflow variables, built without a server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import api
from torchyard.api import wire
from torchyard.planning import pods
from torchyard.planning import tracking as plan

SERVER = plan.Settings(uri="http://mlflow:5000", secret="mlflow-credentials")
TRACKED = {"runId": "r1", "experimentId": "7"}


def run(**metadata: Any) -> api.TrainingRun:
    obj = TrainingRunBuilder("birds", "team-a").command("python", "train.py", "--lr", "0.1")
    body = obj.nodes(2).procs(4).obj()
    body["metadata"].update({"uid": "u-1", **metadata})
    return api.parse_trainingrun(body)


@pytest.mark.parametrize(
    ("metadata", "experiment"),
    [
        ({}, "team-a"),
        ({"labels": {wire.LABEL_EXPERIMENT: "birds-exp"}}, "birds-exp"),
        (
            {
                "labels": {wire.LABEL_EXPERIMENT: "birds-exp"},
                "annotations": {wire.ANNOTATION_EXPERIMENT_NAME: "Birds Exp"},
            },
            "Birds Exp",
        ),
    ],
)
def test_the_experiment_is_the_runs_experiment_else_its_namespace(
    metadata: dict[str, Any], experiment: str
) -> None:
    assert plan.experiment_name(run(**metadata)) == experiment


def test_params_are_the_command_world_size_image_and_sweep_parameters() -> None:
    trial = run(annotations={wire.ANNOTATION_PARAMETERS: json.dumps({"lr": 0.1, "opt": "sgd"})})
    got = {p["key"]: p["value"] for p in plan.params(trial, "img@sha256:ab")}
    assert got == {
        "torchyard.command": '["python", "train.py", "--lr", "0.1"]',
        "torchyard.world_size": "8",
        "torchyard.nodes": "2",
        "torchyard.image": "img@sha256:ab",
        "lr": "0.1",
        "opt": "sgd",
    }


def test_a_trial_is_tagged_with_its_sweep_and_parent() -> None:
    owner = {"kind": "Sweep", "name": "tune", "uid": "s-1"}
    trial = run(ownerReferences=[owner])
    assert plan.sweep_of(trial) == ("tune", "s-1")
    body = plan.create_run("7", trial, 1000, "parent-1")
    tags = {t["key"]: t["value"] for t in body["tags"]}
    assert body["experiment_id"] == "7" and body["start_time"] == 1000
    assert tags[plan.PARENT_TAG] == "parent-1" and tags["torchyard.sweep"] == "tune"
    assert tags["torchyard.uid"] == "u-1" and tags["torchyard.namespace"] == "team-a"
    assert plan.sweep_of(run()) is None
    assert plan.PARENT_TAG not in {t["key"] for t in plan.create_run("7", run(), 1, None)["tags"]}


def test_progress_becomes_bounded_metrics_at_its_step() -> None:
    progress = {
        "step": 40,
        "stepsPerSecond": 2.5,
        "percent": 40,
        "metrics": {f"m{i:04}": i for i in range(2000)} | {"flag": True, "name": "x"},
    }
    metrics = plan.progress_metrics(progress, 99)
    assert len(metrics) == plan.MAX_METRICS
    assert metrics[0] == {
        "key": "torchyard.steps_per_second",
        "value": 2.5,
        "timestamp": 99,
        "step": 40,
    }
    assert not {"flag", "name"} & {m["key"] for m in metrics}
    assert plan.progress_metrics({}, 1) == [] and plan.progress_metrics(None, 1) == []


@pytest.mark.parametrize(
    ("phase", "mlflow_status"),
    [("Succeeded", "FINISHED"), ("Failed", "FAILED"), ("Cancelled", "KILLED")],
)
def test_the_end_maps_the_phase(phase: str, mlflow_status: str) -> None:
    assert plan.update_run("r1", phase, 5) == {
        "run_id": "r1",
        "status": mlflow_status,
        "end_time": 5,
    }


def test_final_tags_name_the_attempt_failure_class_and_model_version() -> None:
    status = {
        "phase": "Failed",
        "restarts": 2,
        "failure": {"failureClass": "NCCLTimeout", "reason": "Error"},
        "model": {"name": "birds", "version": 3},
    }
    assert {t["key"]: t["value"] for t in plan.final_tags(status)} == {
        "torchyard.phase": "Failed",
        "torchyard.attempt": "2",
        "torchyard.failure_class": "NCCLTimeout",
        "torchyard.model_version": "birds/3",
    }


def test_a_log_batch_is_bounded_and_values_are_clipped() -> None:
    tags = [{"key": f"t{i}", "value": "v" * 10_000} for i in range(300)]
    body = plan.log_batch("r1", tags_=tags)
    assert len(body["tags"]) == plan.MAX_TAGS
    assert {len(t["value"]) for t in body["tags"]} == {plan.MAX_TAG_VALUE}
    assert body["run_id"] == "r1" and body["params"] == [] and body["metrics"] == []


def test_every_process_gets_the_run_and_credentials_by_reference() -> None:
    settings = pods.Settings(tracking=SERVER)
    for pod in pods.pods(run(), image="img", settings=settings, tracking=TRACKED):
        env = pod["spec"]["containers"][0]["env"]
        values = {e["name"]: e.get("value") for e in env}
        assert values["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
        assert values["MLFLOW_RUN_ID"] == "r1" and values["MLFLOW_EXPERIMENT_ID"] == "7"
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "valueFrom" in e}
        assert set(refs) >= set(plan.SECRET_KEYS)
        assert all(r["name"] == "mlflow-credentials" and r["optional"] for r in refs.values())


@pytest.mark.parametrize(
    ("settings", "tracking"),
    [
        (plan.Settings(), TRACKED),  # no tracking server: nothing changes
        (SERVER, None),  # not tracked yet
        (SERVER, {"error": "refused"}),  # the server failed: no stray runs
    ],
)
def test_no_mlflow_variables_without_a_tracked_run(
    settings: plan.Settings, tracking: dict[str, Any] | None
) -> None:
    pod = pods.pod(
        run(), 0, image="img", settings=pods.Settings(tracking=settings), tracking=tracking
    )
    assert not [e for e in pod["spec"]["containers"][0]["env"] if e["name"].startswith("MLFLOW_")]
    assert pod == pods.pod(run(), 0, image="img")


@pytest.mark.parametrize(
    ("data", "settings", "unknown"),
    [
        (None, SERVER, []),  # no ConfigMap: the chart's
        ({}, SERVER, []),
        ({"mlflowUri": "http://mlflow:5000"}, SERVER, []),  # the same server, its credentials
        ({"mlflowUri": "http://team:5000"}, plan.Settings(uri="http://team:5000"), []),
        (
            {"mlflowUri": " http://team:5000 ", "credentialsSecret": "team-mlflow"},
            plan.Settings(uri="http://team:5000", secret="team-mlflow"),
            [],
        ),
        ({"credentialsSecret": "other"}, plan.Settings(SERVER.uri, "other"), []),
        ({"mlflowUri": ""}, plan.Settings(uri=""), []),  # no tracking in this namespace
        ({"mlflowUri": "http://t:1", "uri": "x"}, plan.Settings("http://t:1"), ["uri"]),
    ],
)
def test_a_namespaces_configmap_takes_precedence_over_the_chart(
    data: dict[str, str] | None, settings: plan.Settings, unknown: list[str]
) -> None:
    assert plan.override(SERVER, data) == (settings, unknown)
    assert plan.override(SERVER, data)[0].enabled == bool(settings.uri)


def test_a_model_version_points_at_its_mlflow_run_and_its_torchyard_files() -> None:
    assert plan.registered_model("birds", "team-a") == {
        "name": "birds",
        "tags": [{"key": "torchyard.namespace", "value": "team-a"}],
    }
    body = plan.model_version("birds", 3, "r1", "team-a")
    assert (body["name"], body["run_id"], body["source"]) == ("birds", "r1", "model://birds/3")
    assert {t["key"]: t["value"] for t in body["tags"]} == {
        "torchyard.namespace": "team-a",
        "torchyard.model_version": "birds/3",
    }
