"""The SDK's local compute target, as a user's script calls it: ``compute_target="local"``
(or none, as in Azure ML) runs through local mode with a Workspace that has no config
file; ``wait_for_completion(show_output=True)`` shows what the ranks print,
``get_metrics()`` what they logged, ``register_model`` and ``download_file`` go to and
from the local registry (which ``torchyard models list --local`` reads), a failed run
raises ``ActivityFailedException``, HyperDrive runs its trials here; a cluster target
without a cluster says to use ``compute_target='local'``, never a traceback of the client.
The runs are real launcher processes over a small script."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchyard import cli, k8s
from torchyard.sdk import (
    ActivityFailedException,
    ComputeTarget,
    ComputeTargetException,
    Experiment,
    GridParameterSampling,
    HyperDriveConfig,
    PrimaryMetricGoal,
    PyTorchConfiguration,
    ScriptRunConfig,
    TorchyardSdkError,
    Workspace,
    choice,
)

TRAIN = textwrap.dedent(
    """
    import argparse, os, time
    from torchyard.sdk import Run

    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--fail", action="store_true")
    p.add_argument("--sleep", type=float, default=0)
    a = p.parse_args()
    time.sleep(a.sleep)
    run = Run.get_context()
    print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} lr {a.lr}", flush=True)
    if a.fail:
        raise ValueError("the loss became NaN")
    for step in (1, 2):
        run.log("loss", a.lr / step, step=step)
    os.makedirs("outputs", exist_ok=True)
    with open("outputs/model.bin", "w") as f:
        f.write(f"lr={a.lr}")
    """
)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user's folder (no config.json, no kubeconfig) with ./src/train.py."""
    for key in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "TORCHYARD_REGISTRY_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHYARD_REGISTRY", str(tmp_path / "home" / "registry"))
    monkeypatch.setenv("TORCHYARD_LOCAL_RUNS", str(tmp_path / "home" / "runs"))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(TRAIN)
    monkeypatch.chdir(tmp_path)
    k8s.reset()
    yield tmp_path
    k8s.reset()


@pytest.mark.parametrize("target", ["local", None])
def test_a_script_run_on_the_local_target_as_the_guide_follows_it(
    target: str | None, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = Workspace.from_config()  # no config file: a workspace for local runs, said
    assert ws.namespace == "default"
    assert "no .torchyard/config.json or config.json in " in capsys.readouterr().err
    src = ScriptRunConfig(
        source_directory="./src",
        script="train.py",
        arguments=["--lr", 0.5],
        compute_target=target,
        distributed_job_config=PyTorchConfiguration(process_count=2, node_count=2),
    )
    run = Experiment(ws, name="Tutorial-local").submit(src)
    details = run.wait_for_completion(show_output=True)
    out = capsys.readouterr().out
    assert "[rank 0] rank 0 of 2 lr 0.5" in out and "[rank 1] rank 1 of 2 lr 0.5" in out
    assert f"TrainingRun {run.id} succeeded on this machine" in out
    assert details["status"] == "Completed" and details["target"] == "local"
    assert run.get_status() == "Completed"
    assert run.get_metrics() == {"loss": [0.5, 0.25]}
    assert "outputs/model.bin" in run.get_file_names()
    run.download_file("outputs/model.bin", output_file_path="./got.bin")
    assert (project / "got.bin").read_text() == "lr=0.5"
    model = run.register_model(model_name="Local-Model", model_path="outputs/model.bin")
    assert (model.name, model.version, model.id) == ("local-model", 1, "local-model:1")
    assert model.download(str(project / "model")) == str(project / "model")
    assert (project / "model" / "model.bin").read_text() == "lr=0.5"
    assert cli.main(["models", "list", "--local"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["local-model", "1", "1"]
    assert cli.main(["runs", "list", "--local", "--experiment", "tutorial-local"]) == 0
    assert run.id in capsys.readouterr().out


def test_a_failed_local_run_raises_with_its_traceback(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = ScriptRunConfig("./src", script="train.py", arguments=["--fail"], compute_target="local")
    run = Experiment(Workspace.from_config(), "broken").submit(src)
    with pytest.raises(ActivityFailedException, match="ValueError: the loss became NaN"):
        run.wait_for_completion()
    assert run.get_status() == "Failed"
    details = run.wait_for_completion(raise_on_error=False)
    assert "the loss became NaN" in details["error"]["message"]
    with pytest.raises(TorchyardSdkError, match="has not succeeded"):
        run.register_model("m")


def test_waiting_for_a_local_run_gives_up_after_its_timeout_and_the_run_goes_on(
    project: Path,
) -> None:
    src = ScriptRunConfig("./src", script="train.py", arguments=["--sleep", 600])
    run = Experiment(Workspace.from_config(), "slow").submit(src)
    with pytest.raises(TimeoutError, match="did not finish within 0s"):
        run.wait_for_completion(poll=0.05, timeout=0.2)
    assert run.get_status() == "Running"
    run.cancel()
    assert run.get_status() == "Failed"


def test_hyperdrive_runs_its_trials_on_the_local_target(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = ScriptRunConfig("./src", script="train.py", compute_target="local")
    config = HyperDriveConfig(
        run_config=src,
        hyperparameter_sampling=GridParameterSampling({"lr": choice(0.2, 0.4)}),
        primary_metric_name="loss",
        primary_metric_goal=PrimaryMetricGoal.MINIMIZE,
        max_total_runs=2,
        max_concurrent_runs=1,
    )
    hd = Experiment(Workspace.from_config(), "tune").submit(config)
    hd.wait_for_completion(show_output=True)
    out = capsys.readouterr().out
    assert "lr 0.2" in out and "lr 0.4" in out
    assert hd.get_status() == "Completed"
    rows = hd.get_children_sorted_by_primary_metric()
    assert [r["hyperparameters"] for r in rows] == [{"lr": "0.2"}, {"lr": "0.4"}]
    assert [r["best_primary_metric"] for r in rows] == [0.1, 0.2]
    best = hd.get_best_run_by_primary_metric()
    assert best is not None and best.id == rows[0]["run_id"]
    assert best.get_metrics()["loss"] == [0.2, 0.1]
    model = best.register_model("tuned", model_path="outputs/model.bin")
    assert model.version == 1 and model.manifest["run"]["name"] == best.id
    with pytest.raises(TorchyardSdkError, match="already finished"):
        hd.cancel()


def test_a_cluster_target_without_a_cluster_says_to_use_the_local_one(project: Path) -> None:
    ws = Workspace.from_config()
    with pytest.raises(ComputeTargetException, match="compute_target='local'"):
        ComputeTarget(workspace=ws, name="gpu-cluster")
    src = ScriptRunConfig("./src", script="train.py", compute_target="gpu-cluster")
    with pytest.raises(TorchyardSdkError, match="compute_target='local'"):
        Experiment(ws, "x").submit(src)
