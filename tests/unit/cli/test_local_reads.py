"""Every read command works on local runs, as a user types it: ``--local`` (or, without
any kubeconfig, the local registry, said in one line) on ``runs list``, ``describe``,
``logs``, ``models``, ``runs download`` and ``sweep get|describe|best``; local runs shown
as finished (not deleted), node times real, attempts readable, logs without the ranks'
``@@torchyard`` progress lines; a sweep's trials found by ``--experiment`` and the best
trial's MODEL after ``registerBest``. The runs are real launcher processes over a small
script (tests/unit/cli/local_project.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.builders import SweepBuilder, TrainingRunBuilder
from tests.unit.cli.local_project import run_file, user_env
from torchyard import cli, k8s


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user without a kubeconfig; local mode's folders under ``home``."""
    home = tmp_path / "home"
    for key in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "TORCHYARD_REGISTRY_URL"):
        monkeypatch.delenv(key, raising=False)
    for key, value in user_env(home).items():
        if key in ("HOME", "TORCHYARD_REGISTRY", "TORCHYARD_LOCAL_RUNS"):
            monkeypatch.setenv(key, value)
    k8s.reset()
    yield home
    k8s.reset()


@pytest.fixture
def ran(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """One local run of 2 nodes that registered model ``tiny`` version 1."""
    path = run_file(tmp_path / "project", nodes=2, checkpoints=False, register="tiny")
    assert cli.main(["run", str(path), "--local"]) == 0
    _out, err = capsys.readouterr()
    # one line per node end: the launcher's, not a second one of local mode's
    for node in (0, 1):
        assert err.count(f"of node {node} succeeded") == 1, err
        assert f"node {node} succeeded after" not in err
    return home


def test_runs_list_and_describe_show_a_local_run_as_it_ended(
    ran: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["runs", "list"]) == 0  # no kubeconfig: the local registry, said once
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "torchyard: no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config): reading "
        f"the local registry {ran / 'registry'} (as --local does)"
    ]
    head, row = out.splitlines()
    assert head.split()[:7] == ["NAME", "PHASE", "FAILURE", "MODEL", "CREATED", "FINISHED", "STATE"]
    assert row.split()[:4] == ["tiny", "Succeeded", "-", "tiny:1"]
    assert row.split()[6] == "finished"  # not "deleted": a local run's record
    assert cli.main(["describe", "tiny", "--local"]) == 0
    shown = capsys.readouterr().out
    nodes = shown.split("Nodes:\n")[1].split("Attempts:")[0].splitlines()
    assert len(nodes) == 2
    for line in nodes:
        assert "exit 0 on localhost (20" in line and " .. 20" in line and "?" not in line, line
    attempt = shown.split("Attempts:\n")[1].splitlines()[0]
    assert attempt.split()[:2] == ["0", "Succeeded"] and "[" not in attempt, attempt
    assert "Model:        tiny version 1" in shown
    assert "@@torchyard" not in shown  # the log tails hold what the ranks printed


@pytest.mark.parametrize("output", ["json", "yaml", "wide"])
def test_every_list_takes_the_same_output_formats(
    ran: Path, output: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["runs", "list", "--local"], ["models", "list", "--local"]):
        assert cli.main([*argv, "-o", output]) == 0, argv
        out = capsys.readouterr().out
        if output == "json":
            assert json.loads(out)
        elif output == "yaml":
            assert yaml.safe_load(out)
        else:
            assert "tiny" in out
    for argv in (["get", "runs"], ["sweep", "get"]):
        with pytest.raises(SystemExit) as exit_:  # parsed, then no cluster to ask
            cli.build_parser().parse_args([*argv, "-o", output, "--bogus"])
        assert exit_.value.code == 2
        assert f"invalid choice: '{output}'" not in capsys.readouterr().err


def test_logs_models_and_run_files_of_a_local_run(
    ran: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["logs", "tiny", "--local"]) == 0
    logs = capsys.readouterr().out
    assert "[node 0] [rank 0] rank 0 done" in logs and "[node 1] [rank 1] rank 1 done" in logs
    assert "@@torchyard" not in logs  # the progress reports are not the run's output
    assert cli.main(["logs", "tiny", "--local", "--node", "1"]) == 0
    assert "[node 0]" not in capsys.readouterr().out
    assert cli.main(["logs", "tiny", "--local", "-f"]) == 2
    assert "--follow follows a run in a cluster" in capsys.readouterr().err
    assert cli.main(["models", "list", "--local"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["tiny", "1", "1"]
    assert cli.main(["models", "show", "tiny:1", "--local"]) == 0
    assert "run:   tiny (uid " in capsys.readouterr().out
    assert cli.main(["models", "verify", "tiny", "--local"]) == 0
    assert "all 1 file(s) match their sha256" in capsys.readouterr().out
    assert cli.main(["models", "download", "tiny", "-o", str(tmp_path / "got"), "--local"]) == 0
    assert (tmp_path / "got" / "model.bin").read_text() == "weights"
    dest = tmp_path / "model.bin"
    assert (
        cli.main(["runs", "download", "tiny", "outputs/model.bin", "-o", str(dest), "--local"]) == 0
    )
    assert dest.read_text() == "weights"
    capsys.readouterr()
    assert cli.main(["runs", "download", "tiny", "outputs/../../x", "--local"]) == 1
    assert "has no '..'" in capsys.readouterr().err
    assert cli.main(["models", "show", "nothing", "--local"]) == 1
    assert "model default/nothing has no versions" in capsys.readouterr().err


def test_a_local_sweep_is_read_back_and_its_trials_are_in_its_experiment(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = tmp_path / "sweep"
    run_file(project, checkpoints=False)  # (train.py)
    trial = TrainingRunBuilder("t").procs(1).command("python", "train.py", "2", "0", "0")
    sweep = (
        SweepBuilder("tune")
        .seed(3)
        .trial(trial)
        .parameters(lr={"type": "choice", "values": [0.1, 0.2]})
        .grid()
        .trials(2, 1)
        .objective("loss", "minimize")
        .register_best("tuned", path="outputs/model.bin")
        .obj()
    )
    sweep["spec"].pop("earlyTermination", None)
    del sweep["metadata"]["namespace"]
    path = project / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    assert cli.main(["sweep", "submit", str(path), "--local"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert cli.main(["sweep", "get", "--local"]) == 0
    _head, row = capsys.readouterr().out.splitlines()
    assert row.split()[:3] == ["tune", "Succeeded", "2/2"]
    assert cli.main(["sweep", "best", "tune", "--local", "-o", "json"]) == 0
    best = json.loads(capsys.readouterr().out)
    assert best["name"].startswith("tune-t") and set(best["metric"]) == {"loss"}
    assert cli.main(["sweep", "describe", "tune", "--local"]) == 0
    shown = capsys.readouterr().out
    assert f"Best trial:   {best['name']} loss" in shown
    assert "Model:        tuned version 1" in shown
    # the trials are in the sweep's experiment (its name: it has no experiment label)
    assert cli.main(["runs", "list", "--local", "--experiment", "tune", "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["items"]
    assert sorted(r["name"] for r in rows) == ["tune-t0", "tune-t1"]
    # the best trial's MODEL is the model registerBest registered from it
    models = {r["name"]: r["model"] for r in rows}
    assert models[best["name"]] == "tuned:1"
    assert [m for n, m in models.items() if n != best["name"]] == [""]
