"""``torchyard sweep submit|get|describe|best|cancel`` against the in-memory fake of
``torchyard.k8s``, the Sweep's status and ledger written by the real reconcile."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from tests.builders import SweepBuilder, TrainingRunBuilder
from tests.unit.controller.fake_k8s import FakeK8s
from tests.unit.controller.world import T0
from torchyard import cli, k8s
from torchyard.controller import context, sweeps

NS = "team"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeK8s]:
    store = FakeK8s()
    for name in ("get", "get_or_none", "list_", "create", "apply"):
        monkeypatch.setattr(k8s, name, getattr(store, name))
    # a kubeconfig is in use (the fake's): the commands read the cluster, not local records
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    yield store


def reconcile(fake: FakeK8s, at: float = 0.0) -> None:
    ctx = context.Context(k8s=fake, clock=lambda: T0 + timedelta(seconds=at))
    sweeps.reconcile(fake.get(k8s.SWEEPS, NS, "hd"), logging.getLogger("test"), ctx)


def sweep_file(tmp_path: Path) -> Path:
    path = tmp_path / "sweep.yaml"
    body = SweepBuilder("hd").seed(7).trials(3, 3).obj()
    del body["metadata"]["namespace"]
    path.write_text(yaml.safe_dump(body))
    return path


def submitted(fake: FakeK8s, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sweep", "submit", str(sweep_file(tmp_path)), "-n", NS]) == 0
    assert f"Sweep {NS}/hd created" in capsys.readouterr().out
    reconcile(fake)
    for name, value in (("hd-t0", 0.6), ("hd-t1", 0.8)):
        fake.objects[("trainingruns", NS, name)]["status"] = {
            "phase": "Running",
            "startTime": "2026-01-01T12:00:00Z",
            "progress": {
                "step": 1,
                "lastProgressTime": "2026-01-01T12:01:00Z",
                "metrics": {"best_val_acc": value},
            },
        }
    reconcile(fake, at=60)


def test_the_sweep_commands_over_one_sweep(
    fake: FakeK8s, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    submitted(fake, tmp_path, capsys)
    assert fake.get(k8s.SWEEPS, NS, "hd")["metadata"]["namespace"] == NS

    assert cli.main(["sweep", "get", "-n", NS]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "NAME",
        "PHASE",
        "DONE",
        "RUNNING",
        "STOPPED",
        "FAILED",
        "BEST",
        "METRIC",
        "AGE",
    ]
    assert lines[1].split()[:8] == ["hd", "Running", "0/3", "2", "0", "0", "hd-t1", "0.8"]

    assert cli.main(["sweep", "get", "hd", "-n", NS, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"]["best"]["name"] == "hd-t1"

    assert cli.main(["sweep", "describe", "hd", "-n", NS]) == 0
    out = capsys.readouterr().out
    assert "Phase:        Running" in out
    assert "Objective:    maximize best_val_acc" in out
    assert "Best trial:   hd-t1 best_val_acc 0.8" in out
    assert "Accepted" in out and "MetricReported" in out
    table = out.split("Trials (best first, 3 of 3):\n", 1)[1].splitlines()
    assert table[0].split()[:4] == ["TRIAL", "STATE", "BEST_VAL_ACC", "INTERVALS"]
    assert [row.split()[0] for row in table[1:4]] == ["hd-t1", "hd-t0", "hd-t2"]
    assert "learning_rate=" in table[1] and "momentum=" in table[1]

    assert cli.main(["sweep", "best", "hd", "-n", NS]) == 0
    out = capsys.readouterr().out
    assert out.startswith("hd-t1  best_val_acc 0.8  (Running)")
    assert "  --learning_rate " in out and "  --momentum " in out
    assert cli.main(["sweep", "best", "hd", "-n", NS, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["metric"] == {"best_val_acc": 0.8}

    assert cli.main(["sweep", "cancel", "hd", "-n", NS]) == 0
    assert "canceling" in capsys.readouterr().out
    reconcile(fake, at=90)
    assert fake.get(k8s.SWEEPS, NS, "hd")["status"]["phase"] == "Failed"
    assert cli.main(["sweep", "cancel", "hd", "-n", NS]) == 1
    assert "already finished (Failed)" in capsys.readouterr().err


def test_best_before_any_metric_says_so(
    fake: FakeK8s, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["sweep", "submit", str(sweep_file(tmp_path)), "-n", NS]) == 0
    reconcile(fake)
    assert cli.main(["sweep", "best", "hd", "-n", NS]) == 1
    assert "no trial reported best_val_acc yet" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["get", "describe", "best", "cancel"])
def test_a_sweep_that_is_not_there_is_an_error_not_a_traceback(
    fake: FakeK8s, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["sweep", command, "nothing", "-n", NS]) == 1
    assert capsys.readouterr().err == f"torchyard: error: Sweep {NS}/nothing not found\n"


def test_a_file_without_a_sweep_or_with_a_bad_one_is_refused(
    fake: FakeK8s, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump(TrainingRunBuilder("bert").obj()))
    assert cli.main(["sweep", "submit", str(run), "-n", NS]) == 2
    err = capsys.readouterr().err
    assert "is not a Sweep file: it holds TrainingRun" in err
    bad = tmp_path / "bad.yaml"
    body = SweepBuilder("hd").trials(2, 4).obj()
    bad.write_text(yaml.safe_dump(body))
    assert cli.main(["sweep", "submit", str(bad), "-n", NS]) == 2
    assert "maxConcurrentTrials must not exceed maxTotalTrials" in capsys.readouterr().err
    assert cli.main(["sweep", "submit", str(tmp_path / "missing.yaml"), "-n", NS]) == 2
    assert fake.posted == []


def test_submit_dry_run_checks_and_prints_creating_nothing(
    fake: FakeK8s, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["sweep", "submit", str(sweep_file(tmp_path)), "-n", NS, "--dry-run"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["kind"] == "Sweep" and printed["metadata"]["namespace"] == NS
    assert fake.posted == []


def test_sweep_help_lists_its_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["sweep", "--help"])
    out = capsys.readouterr().out
    for command in ("submit", "get", "describe", "best", "cancel"):
        assert command in out
