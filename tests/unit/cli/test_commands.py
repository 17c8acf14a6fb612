"""The command line: --version, --help, and offline validation."""

from __future__ import annotations

import argparse
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
    assert cli.main(["validate", str(path)]) == 2  # bad input, as run and submit say it
    captured = capsys.readouterr()
    assert "TrainingRun/good: valid" in captured.out
    assert "torchyard: error: invalid resource: TrainingRun/bad: " in captured.err
    assert "must not exceed gpusPerNode" in captured.err


def test_crds_command_prints_every_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["crds"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["spec"]["names"]["kind"] for d in docs] == [
        "TrainingRun",
        "Environment",
        "ModelVersion",
        "Sweep",
        "OnlineEndpoint",
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
    launcher = docs[1]["metadata"]["name"]
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("Environment", "pytorch"),
        ("ConfigMap", launcher),  # the shipped modules, applied before the node Pods
        ("TrainingRun", "bert"),
        ("Service", "bert"),
        ("Pod", "bert-0"),
        ("Pod", "bert-1"),
    ]
    assert launcher.startswith("torchyard-launcher-")
    assert "launch.main.py" in docs[1]["data"]
    assert {d["metadata"]["namespace"] for d in docs} == {"team"}
    assert docs[4]["spec"]["containers"][0]["image"] == "img:1"
    [volume] = [v for v in docs[4]["spec"]["volumes"] if v["name"] == "torchyard"]
    assert volume["configMap"]["name"] == launcher


def test_dry_run_of_a_queued_run_prints_its_kueue_workload_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = (
        TrainingRunBuilder("bert")
        .nodes(2)
        .gpus(1)
        .with_("spec.scheduling.queueName", "team-a")
        .with_("spec.placement", {"topology": {"level": "example.com/rack"}})
        .obj()
    )
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    assert cli.main(["submit", str(path), "--dry-run", "-n", "team"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [d["kind"] for d in docs]
    assert kinds[-4:] == ["Service", "Workload", "Pod", "Pod"], kinds
    wl = docs[-3]
    assert wl["spec"]["queueName"] == "team-a"
    assert wl["spec"]["podSets"][0]["topologyRequest"]["required"] == "example.com/rack"
    assert all("schedulingGates" not in d["spec"] for d in docs[-2:])


def _commands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> list[tuple[str, ...]]:
    """Every command path of the CLI, e.g. ("models", "download")."""
    found = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, (*prefix, name))
    return found


def test_every_command_renders_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    paths = _commands(cli.build_parser())
    assert ("submit",) in paths and ("wait",) in paths and ("models", "download") in paths
    for path in paths:
        with pytest.raises(SystemExit) as done:
            cli.main([*path, "--help"])
        assert done.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: torchyard"), path
    assert len(paths) >= 17


def test_kube_commands_take_kubectl_options() -> None:
    parser = cli.build_parser()
    for command in (["wait", "r"], ["logs", "r"], ["get", "runs"], ["describe", "r"]):
        args = parser.parse_args([*command, "-n", "team", "--context", "c", "--kubeconfig", "k"])
        assert (args.namespace, args.context, args.kubeconfig) == ("team", "c", "k")


def test_submit_dry_run_with_a_source_folder_prints_the_snapshot_configmap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    run = TrainingRunBuilder("snap").obj()
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    assert cli.main(["submit", str(path), "--source", str(tmp_path), "--dry-run"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    configmap = docs[0]
    assert configmap["kind"] == "ConfigMap" and configmap["immutable"] is True
    run_doc = next(d for d in docs if d["kind"] == "TrainingRun")
    assert run_doc["spec"]["source"] == {"configMap": configmap["metadata"]["name"]}
    trainer = next(d for d in docs if d["kind"] == "Pod")["spec"]["containers"][0]
    assert "--copy" in trainer["command"]
