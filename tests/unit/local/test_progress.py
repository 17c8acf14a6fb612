"""Progress in local mode, end to end: ``torchyard run --local`` over two nodes whose ranks
report with ``torchyard.progress``; the run says how far it got, the archived logs keep
metrics.jsonl and the registered ModelVersion the last metric values."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.builders import TrainingRunBuilder
from torchyard import cli
from torchyard.registry import Store

TRAIN = textwrap.dedent(
    """
    import os
    from torchyard import progress
    rank = int(os.environ["RANK"])
    for step in range(1, 5):
        progress.report(step, total=4, loss=1.0 / step + rank)
    progress.log("accuracy", 0.75)
    os.makedirs("outputs", exist_ok=True)
    with open("outputs/model.bin", "wb") as f:
        f.write(b"w" * 1000)
    """
)


def test_a_local_run_reports_progress_and_registers_the_last_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    body = TrainingRunBuilder("steps").nodes(2).procs(1).register("steps").obj()
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(body))
    (tmp_path / "train.py").write_text(TRAIN)
    monkeypatch.chdir(tmp_path)
    argv = ["run", "run.yaml", "--local", "--source", ".", "--workdir", "./runs"]
    assert cli.main([*argv, "--registry", "./registry"]) == 0
    out = capsys.readouterr().out
    assert "progress: 4/4 100% (accuracy=0.75, loss=0.25)" in out
    version = Store(tmp_path / "registry").get("default", "steps")
    assert version.manifest["metrics"] == {"accuracy": 0.75, "loss": 0.25}
    archived = sorted((tmp_path / "registry" / "default" / "runs").rglob("metrics.jsonl"))
    assert len(archived) == 2  # one per node
    records = [json.loads(x) for p in archived for x in p.read_text().splitlines()]
    assert sorted((r["rank"], r["step"]) for r in records if "loss" in r) == [
        (rank, step) for rank in (0, 1) for step in range(1, 5)
    ]
    assert {(r["rank"], r["step"]) for r in records if "accuracy" in r} == {(0, 4), (1, 4)}
