"""The command line: --version, --help, and offline validation."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import torchyard
from tests.builders import TrainingRunBuilder
from torchyard import cli


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"torchyard {torchyard.__version__}"


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for command in ("operator", "crds", "validate"):
        assert command in out


def test_validate_reports_each_resource(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = TrainingRunBuilder("good").obj()
    bad = TrainingRunBuilder("bad").procs(8).gpus(1).obj()
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump_all([good, bad]))
    assert cli.main(["validate", str(path)]) == 1
    captured = capsys.readouterr()
    assert "TrainingRun/good: valid" in captured.out
    assert "TrainingRun/bad: invalid" in captured.err
    assert "must not exceed gpusPerNode" in captured.err


def test_crds_command_prints_all_three(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["crds"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["spec"]["names"]["kind"] for d in docs] == [
        "TrainingRun",
        "Environment",
        "ModelVersion",
    ]


def test_submit_dry_run_prints_what_the_operator_would_create(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = TrainingRunBuilder("bert").nodes(2).gpus(1).pool("a100").obj()
    env = {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "Environment",
        "metadata": {"name": "pytorch"},
        "spec": {"image": "img:1"},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump_all([env, run]))
    assert cli.main(["submit", str(path), "--dry-run", "-n", "team"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("TrainingRun", "bert"),
        ("Service", "bert"),
        ("Pod", "bert-0"),
        ("Pod", "bert-1"),
    ]
    assert {d["metadata"]["namespace"] for d in docs} == {"team"}
    assert docs[2]["spec"]["containers"][0]["image"] == "img:1"
