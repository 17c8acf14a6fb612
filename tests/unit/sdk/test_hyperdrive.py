"""HyperDrive on torchyard (``torchyard.sdk.azureml.hyperdrive``, ``hyperdrive_runs``):
the notebook's tuning code, with only its imports changed, creates the Sweep it stands
for; what cannot be run is an error at the line that wrote it; and ``HyperDriveRun`` reads
what the Sweep controller wrote. The apiserver is the in-memory fake of ``torchyard.k8s``
(tests/unit/controller/fake_k8s.py), and the Sweep's status and ledger are written by the
real reconcile (``controller.sweeps``) over it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from tests.builders import SweepBuilder
from tests.unit.controller.fake_k8s import FakeK8s
from tests.unit.controller.world import T0
from torchyard import api, k8s
from torchyard.controller import context, sweeps
from torchyard.sdk import (
    ActivityFailedException,
    BanditPolicy,
    BayesianParameterSampling,
    Experiment,
    GridParameterSampling,
    HyperDriveConfig,
    HyperDriveRun,
    MedianStoppingPolicy,
    NoTerminationPolicy,
    PrimaryMetricGoal,
    RandomParameterSampling,
    Run,
    ScriptRunConfig,
    TorchyardSdkError,
    TruncationSelectionPolicy,
    Workspace,
    choice,
    loguniform,
    normal,
    uniform,
)
from torchyard.sdk.azureml import experiments, hyperdrive

NS = "team"
SOURCE = {"snapshot": "0" * 64}


def script_run() -> ScriptRunConfig:
    return ScriptRunConfig(
        source_directory="pytorch-birds",
        script="pytorch_train.py",
        arguments=["--num_epochs", 30, "--output_dir", "./outputs"],
        compute_target="gpu-cluster",
    )


def notebook_config(src: ScriptRunConfig | None = None) -> HyperDriveConfig:
    """The notebook's tuning cell, as it is written for Azure ML."""
    param_sampling = RandomParameterSampling(
        {"learning_rate": uniform(0.0005, 0.005), "momentum": uniform(0.9, 0.99)}
    )
    early_termination_policy = BanditPolicy(
        slack_factor=0.15, evaluation_interval=1, delay_evaluation=10
    )
    return HyperDriveConfig(
        run_config=src or script_run(),
        hyperparameter_sampling=param_sampling,
        policy=early_termination_policy,
        primary_metric_name="best_val_acc",
        primary_metric_goal=PrimaryMetricGoal.MAXIMIZE,
        max_total_runs=8,
        max_concurrent_runs=4,
    )


def trial_spec(src: ScriptRunConfig) -> dict[str, Any]:
    """What Experiment.submit makes of ``src`` once the environment is registered and the
    snapshot stored: the same spec as a plain run's."""
    return experiments.run_spec(src, "pytorch-1-6-gpu", SOURCE)


def test_the_notebooks_tuning_code_is_the_sweep_it_stands_for() -> None:
    src = script_run()
    body = hyperdrive.sweep_manifest(
        notebook_config(src), trial_spec(src), {"name": "birds-hd", "namespace": NS}
    )
    assert body["spec"] == {
        "trial": {
            "environment": "pytorch-1-6-gpu",
            "source": SOURCE,
            "command": [
                "python",
                "pytorch_train.py",
                "--num_epochs",
                "30",
                "--output_dir",
                "./outputs",
            ],
            "distribution": {"type": "none", "nodeCount": 1, "processCountPerNode": 1},
        },  # (the compute target, looked up on the cluster by submit, is a plain run's)
        "parameters": {
            "learning_rate": {"type": "uniform", "minValue": 0.0005, "maxValue": 0.005},
            "momentum": {"type": "uniform", "minValue": 0.9, "maxValue": 0.99},
        },
        "sampling": "random",
        "objective": {"metric": "best_val_acc", "goal": "maximize"},
        "maxTotalTrials": 8,
        "maxConcurrentTrials": 4,
        "maxDurationSeconds": 10080 * 60,  # Azure ML's default max_duration_minutes
        "earlyTermination": {
            "type": "bandit",
            "slackFactor": 0.15,
            "evaluationInterval": 1,
            "delayEvaluation": 10,
        },
    }
    sweep = api.parse_sweep(body)  # what the apiserver admits
    builder = SweepBuilder("birds-hd", NS).bandit(0.15, 1, 10).obj()["spec"]
    assert (
        sweep.spec.parameters
        == api.parse_sweep(
            {**body, "spec": {**body["spec"], "parameters": builder["parameters"]}}
        ).spec.parameters
    )


def test_grid_median_truncation_and_no_policy_write_their_fields() -> None:
    grid = GridParameterSampling({"--batch_size": choice(16, 32), "optimizer": choice("sgd")})
    config = HyperDriveConfig(
        run_config=script_run(),
        hyperparameter_sampling=grid,
        policy=MedianStoppingPolicy(),
        primary_metric_name="loss",
        primary_metric_goal="minimize",
        max_total_runs=2,
        max_duration_minutes=30,
    )
    spec = config.sweep_spec({})
    assert spec["sampling"] == "grid"
    assert spec["parameters"] == {  # '--batch_size' is the argument of batch_size
        "batch_size": {"type": "choice", "values": [16, 32]},
        "optimizer": {"type": "choice", "values": ["sgd"]},
    }
    assert spec["objective"] == {"metric": "loss", "goal": "minimize"}
    assert spec["earlyTermination"] == {
        "type": "median",
        "evaluationInterval": 1,
        "delayEvaluation": 5,  # Azure ML's default
    }
    assert spec["maxDurationSeconds"] == 1800 and "maxConcurrentTrials" not in spec
    assert TruncationSelectionPolicy(20).to_json() == {
        "type": "truncation",
        "truncationPercentage": 20,
        "evaluationInterval": 1,
        "delayEvaluation": 0,
    }
    assert BanditPolicy(slack_amount=0.2).to_json() == {
        "type": "bandit",
        "slackAmount": 0.2,
        "evaluationInterval": 1,
        "delayEvaluation": 0,
    }
    assert NoTerminationPolicy().to_json() is None
    assert loguniform(-6, -1).to_json() == {
        "type": "loguniform",
        "minValue": -6.0,
        "maxValue": -1.0,
    }


def config_with(**changes: Any) -> HyperDriveConfig:
    arguments: dict[str, Any] = {
        "run_config": script_run(),
        "hyperparameter_sampling": RandomParameterSampling({"lr": uniform(0.1, 0.2)}),
        "primary_metric_name": "acc",
        "primary_metric_goal": PrimaryMetricGoal.MAXIMIZE,
        "max_total_runs": 4,
    }
    return HyperDriveConfig(**{**arguments, **changes})


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: BayesianParameterSampling({"lr": uniform(0.1, 0.2), "z": normal(0, 1)}),
            "BayesianParameterSampling: parameters.z: bayesian sampling takes only choice",
        ),
        (lambda: config_with(primary_metric_goal="best"), "must be maximize or minimize"),
        (
            lambda: config_with(max_total_runs=4, max_concurrent_runs=8),
            r"max_concurrent_runs \(8\) must not exceed max_total_runs \(4\)",
        ),
        (lambda: RandomParameterSampling({}), "parameter_space"),
        (lambda: config_with(primary_metric_name=""), "primary_metric_name"),
        (lambda: config_with(run_config=None), r"run_config=ScriptRunConfig"),
        (lambda: config_with(estimator=object()), "estimator has no meaning here"),
        (lambda: config_with(max_total_runs=0), "max_total_runs must be a whole number"),
        (lambda: uniform(0.5, 0.1), r"uniform\(0.5, 0.1\): minValue"),
        (lambda: choice(), "choice"),
        (
            lambda: GridParameterSampling({"lr": uniform(0.1, 0.2)}),
            "choice\\(\\) expressions only; lr",
        ),
        (
            lambda: config_with(
                hyperparameter_sampling=GridParameterSampling({"bs": choice(1, 2, 3, 4, 5)})
            ),
            "more than max_total_runs 4",
        ),
        (lambda: BanditPolicy(evaluation_interval=1), "exactly one of slack_factor"),
        (lambda: BanditPolicy(slack_factor=0.1, evaluation_interval=0), "evaluationInterval"),
        (lambda: TruncationSelectionPolicy(100), "truncationPercentage"),
        (
            lambda: TruncationSelectionPolicy(10, exclude_finished_jobs=True),
            "exclude_finished_jobs has no meaning here",
        ),
        (
            lambda: RandomParameterSampling({"lr": uniform(0.1, 0.2)}, properties={"x": 1}),
            "properties has no meaning here",
        ),
    ],
)
def test_what_cannot_run_is_an_error_at_the_line_that_wrote_it(make: Any, message: str) -> None:
    with pytest.raises(TorchyardSdkError, match=message):
        make()


def test_bayesian_sampling_writes_its_field() -> None:
    config = config_with(
        hyperparameter_sampling=BayesianParameterSampling(
            {"lr": uniform(0.1, 0.2), "bs": choice(16, 32)}
        )
    )
    spec = config.sweep_spec({})
    assert spec["sampling"] == "bayesian"
    assert spec["parameters"]["bs"] == {"type": "choice", "values": [16, 32]}


# -- HyperDriveRun over the fake apiserver, the Sweep controller writing its status ------


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeK8s]:
    store = FakeK8s()
    for name in ("get", "get_or_none", "list_", "create", "apply"):
        monkeypatch.setattr(k8s, name, getattr(store, name))
    monkeypatch.setattr(
        Experiment, "_trial_spec", lambda self, src: experiments.run_spec(src, "pytorch", SOURCE)
    )
    yield store


def reconcile(fake: FakeK8s, name: str, at: float = 0.0) -> None:
    ctx = context.Context(k8s=fake, clock=lambda: T0 + timedelta(seconds=at))
    sweeps.reconcile(fake.get(k8s.SWEEPS, NS, name), logging.getLogger("test"), ctx)


def trial_reports(fake: FakeK8s, name: str, **st: Any) -> None:
    fake.objects[("trainingruns", NS, name)]["status"] = {"startTime": "2026-01-01T12:00:00Z", **st}


def metrics(step: int, value: float) -> dict[str, Any]:
    return {
        "step": step,
        "lastProgressTime": f"2026-01-01T12:0{step}:00Z",
        "metrics": {"best_val_acc": value},
    }


def submitted(fake: FakeK8s, total: int = 3) -> HyperDriveRun:
    experiment = Experiment(Workspace(namespace=NS), "Tutorial-PyTorch-Birds")
    config = config_with(
        primary_metric_name="best_val_acc", max_total_runs=total, max_concurrent_runs=total
    )
    run = experiment.submit(config)
    assert isinstance(run, HyperDriveRun)
    return run


def test_submit_creates_the_sweep_and_the_run_reads_its_trials(fake: FakeK8s) -> None:
    run = submitted(fake)
    body = fake.get(k8s.SWEEPS, NS, run.id)
    assert run.id.startswith("tutorial-pytorch-birds-") and len(run.id) <= api.sweeps.SWEEP_NAME_MAX
    assert body["metadata"]["labels"]["torchyard.dev/experiment"] == "tutorial-pytorch-birds"
    assert body["spec"]["trial"]["command"][:2] == ["python", "pytorch_train.py"]
    assert run.get_status() == "Queued"
    assert run.get_best_run_by_primary_metric() is None
    reconcile(fake, run.id)
    t0, t1, t2 = (f"{run.id}-t{i}" for i in range(3))
    trial_reports(fake, t0, phase="Running", progress=metrics(1, 0.6))
    trial_reports(fake, t1, phase="Running", progress=metrics(2, 0.8))
    reconcile(fake, run.id, at=60)
    trial_reports(fake, t1, phase="Failed", progress=metrics(2, 0.8))
    reconcile(fake, run.id, at=90)
    assert run.get_status() == "Running"

    rows = run.get_children_sorted_by_primary_metric()
    assert [r["run_id"] for r in rows] == [t1, t0, t2]  # best first, no metric last
    assert rows[0]["best_primary_metric"] == 0.8 and rows[0]["status"] == "Failed"
    assert set(rows[0]["hyperparameters"]) == {"lr"}
    assert rows[2]["best_primary_metric"] is None and rows[2]["status"] == "Queued"
    assert [r["run_id"] for r in run.get_children_sorted_by_primary_metric(reverse=True)] == [
        t0,
        t1,
        t2,
    ]
    assert len(run.get_children_sorted_by_primary_metric(top=1)) == 1
    assert len(run.get_children_sorted_by_primary_metric(discard_no_metric=True)) == 2

    best = run.get_best_run_by_primary_metric()
    assert isinstance(best, Run) and best.id == t1
    not_failed = run.get_best_run_by_primary_metric(include_failed=False)
    assert not_failed is not None and not_failed.id == t0
    assert run.get_metrics()[t0] == {"best_val_acc": [0.6]}
    assert [c.id for c in run.get_children()] == [t0, t1, t2]


def test_wait_for_completion_follows_the_sweep_until_it_ends(
    fake: FakeK8s, capsys: pytest.CaptureFixture[str]
) -> None:
    run = submitted(fake, total=1)
    reconcile(fake, run.id)
    trial = f"{run.id}-t0"
    trial_reports(
        fake,
        trial,
        phase="Succeeded",
        progress=metrics(3, 0.9),
        completionTime="2026-01-01T12:05:00Z",
    )
    reconcile(fake, run.id, at=300)
    details = run.wait_for_completion(show_output=True, poll=0)
    assert details["status"] == "Completed"
    assert details["properties"]["best_child_run_id"] == trial
    out = capsys.readouterr().out
    assert f"best {trial} best_val_acc 0.9" in out and "Succeeded" in out


def test_cancel_ends_the_sweep_canceled_and_a_failed_sweep_raises(fake: FakeK8s) -> None:
    run = submitted(fake)
    reconcile(fake, run.id)
    trial_reports(fake, f"{run.id}-t0", phase="Running", progress=metrics(1, 0.5))
    reconcile(fake, run.id, at=10)
    run.cancel()
    assert fake.get(k8s.SWEEPS, NS, run.id)["spec"]["cancel"] is True
    reconcile(fake, run.id, at=20)
    assert run.get_status() == "Canceled"
    with pytest.raises(ActivityFailedException, match="canceled"):
        run.wait_for_completion(poll=0)
    assert run.wait_for_completion(raise_on_error=False, poll=0)["status"] == "Canceled"
    best = run.get_best_run_by_primary_metric()
    assert best is not None and best.id == f"{run.id}-t0"
    assert run.get_best_run_by_primary_metric(include_canceled=False) is None
    with pytest.raises(TorchyardSdkError, match="already finished"):
        run.cancel()


def test_a_sweep_that_is_not_there_says_so(fake: FakeK8s) -> None:
    run = HyperDriveRun(Experiment(Workspace(namespace=NS), "x"), "nothing")
    with pytest.raises(TorchyardSdkError, match=f"Sweep {NS}/nothing not found"):
        run.get_status()
